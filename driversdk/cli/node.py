"""`driversdk node status`: this agent's node as Nomad's CLI shows one (its drivers and their
health; its attributes with -verbose), through ``GET /v1/nodes`` and ``GET /v1/node/:id``."""

from __future__ import annotations

import argparse

from driversdk.cli.apiclient import APIRequestError
from driversdk.cli.apiverbs import VerbError, api_flags, client_of, fields, print_json, say, short, table

# Not typing.TYPE_CHECKING: importing typing costs a verb ~2 ms (type checkers know this spelling).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def add_parsers(sub: Any, where: argparse.ArgumentParser) -> None:
    node = sub.add_parser("node", help="the agent's node: status")
    node_sub = node.add_subparsers(dest="node_cmd", required=True)
    status = node_sub.add_parser(
        "status", parents=[api_flags(), where], help="the node: its drivers and their health (-verbose: attributes)"
    )
    status.add_argument("node", metavar="NODE", nargs="?", help="a node id (prefix) or name; default: every node")
    status.add_argument("-verbose", "--verbose", action="store_true", help="full ids, attributes and meta")
    status.set_defaults(func=cmd_node_status)


def cmd_node_status(args: argparse.Namespace) -> int:
    client = client_of(args)
    if args.node is None and args.json:
        print_json(client.get("/v1/nodes"))  # as `nomad node status -json`: the list
        return 0
    wanted = [args.node] if args.node is not None else [n["ID"] for n in client.get("/v1/nodes") or []]
    nodes = []
    for node_id in wanted:
        try:
            nodes.append(client.get(f"/v1/node/{node_id}"))
        except APIRequestError as err:
            if err.status != 404:
                raise
            raise VerbError(
                f'node "{node_id}" not found on the agent; `driversdk node status` lists its node'
            ) from None
    if args.json:
        print_json(nodes[0])
        return 0
    for number, node in enumerate(nodes):
        if number:
            say("")
        _show(node, args.verbose)
    return 0


def _show(node: dict[str, Any], verbose: bool) -> None:
    drivers = node.get("Drivers") or {}
    healthy = sorted(name for name, d in drivers.items() if d.get("Healthy"))
    say(
        fields(
            [
                ("ID", short(node["ID"], verbose)),
                ("Name", node.get("Name")),
                ("Node Pool", node.get("NodePool")),
                ("Class", node.get("NodeClass")),
                ("DC", node.get("Datacenter")),
                ("Drain", str(bool(node.get("Drain"))).lower()),
                ("Eligibility", node.get("SchedulingEligibility")),
                ("Status", node.get("Status")),
                ("Address", node.get("HTTPAddr") or node.get("Address")),
                ("Version", node.get("Version")),
                ("Drivers", ",".join(healthy)),
            ]
        )
    )
    say("\nDrivers")
    rows = [(name, str(bool(d.get("Detected"))).lower(), str(bool(d.get("Healthy"))).lower(),
             d.get("HealthDescription") or "") for name, d in sorted(drivers.items())]  # fmt: skip
    say(table(("Driver", "Detected", "Healthy", "Message"), rows) if rows else "No drivers")
    volumes = node.get("HostVolumes") or {}
    if volumes:
        say("\nHost Volumes")
        vrows = [(name, v.get("Path"), str(bool(v.get("ReadOnly"))).lower()) for name, v in sorted(volumes.items())]
        say(table(("Name", "Path", "Read Only"), vrows))
    if verbose:
        say("\nAttributes")
        attributes = node.get("Attributes") or {}
        say(fields(sorted(attributes.items())) if attributes else "<none>")
        meta = node.get("Meta") or {}
        say("\nMeta")
        say(fields(sorted(meta.items())) if meta else "<none>")
