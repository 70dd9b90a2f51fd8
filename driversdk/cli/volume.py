"""The `volume` and `plugin status` commands when an agent is reachable: each goes through the
agent's HTTP API in Nomad's shape (``/v1/volume/csi/:id`` and its ``/create``, ``/delete``,
``/detach``; ``/v1/volumes?type=csi``; ``/v1/volumes/snapshot``; ``/v1/plugins?type=csi``,
``/v1/plugin/csi/:id``), and the agent does the work with its own stores and plugins. With no
agent, :func:`via_agent` answers None and the command works on the data dir as before.

The agent is found as `driversdk run` finds it: ``-address`` / ``NOMAD_ADDR``, else the local
agent's socket in the data dir. With ``--data-dir`` or ``--client`` given, only that data dir's
socket counts (not a dev agent's elsewhere), and a socket nobody answers on is no agent.

Stdlib and the API client only, except that a volume file is read with the runner's parser and
sent as Nomad's CSIVolume JSON (driversdk.agent.csivolumejson): the CLI never opens state.db here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from driversdk.cli.apiclient import SOCKET_NAME, AgentClient, AgentUnreachable, APIRequestError
from driversdk.cli.apiverbs import VerbError, data_dir_of

Verb = Callable[[AgentClient, argparse.Namespace], int]


def add_agent_flags(*parsers: argparse.ArgumentParser) -> None:
    """Nomad's ``-address`` / ``-token`` on each volume and plugin command."""
    for parser in parsers:
        group = parser.add_argument_group("agent")
        group.add_argument(
            "-address",
            "--address",
            dest="api_address",
            metavar="ADDR",
            help="the agent (default: NOMAD_ADDR, else the data dir's agent socket; with none, the data dir itself)",
        )
        group.add_argument(
            "-token", "--token", dest="api_token", metavar="TOKEN", help="ACL token (default: NOMAD_TOKEN)"
        )


def _find(args: argparse.Namespace) -> tuple[AgentClient, bool] | None:
    """The agent and whether the operator named it; None when none is running for this data dir."""
    address = getattr(args, "api_address", None) or os.environ.get("NOMAD_ADDR") or ""
    token = getattr(args, "api_token", None)
    if address:
        return AgentClient.find(address, token), True
    data_dir = data_dir_of(args)
    if data_dir is not None:  # that data dir's agent, or none: never another agent's state
        path = os.path.join(data_dir, SOCKET_NAME)
        return (AgentClient.find("unix://" + path, token), False) if os.path.exists(path) else None
    try:
        return AgentClient.find(None, token, None), False
    except AgentUnreachable:
        return None


def via_agent(args: argparse.Namespace) -> int | None:
    """Run the command through the agent; None when there is no agent to go through (a local
    socket that does not answer counts as none; a named address that does not is an error)."""
    found = _find(args)
    if found is None:
        return None
    client, named = found
    verb = _VERBS[args.func.__name__]
    try:
        return verb(client, args)
    except AgentUnreachable:
        if named:
            raise
        return None


def _vpath(volume_id: str, suffix: str = "") -> str:
    return "/v1/volume/csi/" + quote(volume_id, safe="") + suffix


def _not_registered(volume_id: str, namespace: str) -> VerbError:
    return VerbError(f'volume "{volume_id}" is not registered in namespace "{namespace}"')


def _get_volume(client: AgentClient, volume_id: str, namespace: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.get(_vpath(volume_id), namespace=namespace)
    except APIRequestError as err:
        if err.status == 404:
            return None
        raise
    return found


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    from driversdk.cli import _pairs as pairs

    return pairs(items, flag)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


# --- register, deregister, create, delete, detach --------------------------------------------------


def _volume_body(path: str) -> tuple[Any, dict[str, Any]]:
    from driversdk.agent.csivolumejson import volume_to_api
    from driversdk.runner.volumes import parse_volume_file

    volume = parse_volume_file(path)
    return volume, {"Volumes": [volume_to_api(volume)]}


def register(client: AgentClient, args: argparse.Namespace) -> int:
    volume, body = _volume_body(args.file)
    existed = _get_volume(client, volume.id, volume.namespace) is not None
    answer, _ = client.request("PUT", _vpath(volume.id), {"namespace": volume.namespace}, body)
    stored = (answer or {}).get("Volumes") or [{}]
    plugin = stored[0].get("PluginID") or volume.plugin_id
    print(f'{"updated" if existed else "registered"} CSI volume "{volume.id}" (plugin "{plugin}")')
    return 0


def create(client: AgentClient, args: argparse.Namespace) -> int:
    volume, body = _volume_body(args.file)
    before = _get_volume(client, volume.id, volume.namespace)
    answer, _ = client.request("PUT", _vpath(volume.id, "/create"), {"namespace": volume.namespace}, body)
    stored = answer["Volumes"][0]
    if before is not None:
        grown = (
            f"; expanded from {before['Capacity']} to {stored['Capacity']} bytes"
            if stored["Capacity"] != before["Capacity"]
            else ""
        )
        print(f'updated CSI volume "{volume.id}" (it exists already; plugin "{stored["PluginID"]}"){grown}')
        return 0
    print(
        f'created CSI volume "{volume.id}" (external ID "{stored["ExternalID"]}", capacity {stored["Capacity"]} '
        f'bytes, plugin "{stored["PluginID"]}")'
    )
    return 0


def deregister(client: AgentClient, args: argparse.Namespace) -> int:
    try:
        client.request("DELETE", _vpath(args.id), {"namespace": args.namespace})
    except APIRequestError as err:
        if err.status == 404:
            raise _not_registered(args.id, args.namespace) from None
        raise
    print(f'deregistered CSI volume "{args.id}"')
    return 0


def delete(client: AgentClient, args: argparse.Namespace) -> int:
    secrets = _pairs(args.secret, "--secret")
    volume = _get_volume(client, args.id, args.namespace)
    if volume is None:
        raise _not_registered(args.id, args.namespace)
    try:
        client.request("DELETE", _vpath(args.id, "/delete"), {"namespace": args.namespace}, {"Secrets": secrets})
    except APIRequestError as err:
        if err.status == 404:
            raise _not_registered(args.id, args.namespace) from None
        raise
    print(f'deleted CSI volume "{args.id}" (external ID "{volume["ExternalID"]}")')
    return 0


def detach(client: AgentClient, args: argparse.Namespace) -> int:
    nodes = client.get("/v1/nodes") or []
    query = {"namespace": args.namespace, "node": nodes[0]["ID"] if nodes else "", "alloc": args.alloc or None}
    try:
        answer, _ = client.request("DELETE", _vpath(args.volume, "/detach"), query)
    except APIRequestError as err:
        if err.status == 404 and "volume" in str(err):
            raise _not_registered(args.volume, args.namespace) from None
        if err.status != 400:
            raise
        # One sentence a line: the claims released, then each one that was not.
        for line in str(err).splitlines():
            if line.startswith("released "):
                print(line)
            else:
                print(f"error: {line}", file=sys.stderr)
        return 1
    released = (answer or {}).get("Released") or []
    if not released:
        which = f" by an allocation starting with {args.alloc!r}" if args.alloc else ""
        print(f'volume "{args.volume}" has no claims{which}; nothing to detach')
    for line in released:
        print(line)
    return 0


# --- status ------------------------------------------------------------------------------------------


def _plugin(client: AgentClient, plugin_id: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.get("/v1/plugin/csi/" + quote(plugin_id, safe=""))
    except APIRequestError as err:
        if err.status == 404:
            return None
        raise
    return found


def _health(info: dict[str, Any]) -> str:
    return "healthy" if info.get("Healthy") else f"unhealthy: {info.get('HealthDescription') or 'not ready'}"


def volume_status(client: AgentClient, args: argparse.Namespace) -> int:
    if args.id:
        volume = _get_volume(client, args.id, args.namespace)
        if volume is None:
            raise _not_registered(args.id, args.namespace)
        _print_json(volume)
        return 0
    stubs = client.get("/v1/volumes", type="csi", namespace="*") or []
    if args.json:
        _print_json(stubs)
        return 0
    if not stubs:
        print("no CSI volumes registered")
    plugins = {p: _plugin(client, p) for p in sorted({s["PluginID"] for s in stubs})}
    for stub in stubs:
        volume = _get_volume(client, stub["ID"], stub["Namespace"]) or {}
        caps = ", ".join(f"{c['AccessMode']}/{c['AttachmentMode']}" for c in volume.get("RequestedCapabilities") or [])
        plugin = plugins[stub["PluginID"]]
        nodes = list(((plugin or {}).get("Nodes") or {}).values())
        node = _health(nodes[0]) if nodes else "not registered"
        print(
            f"{stub['Namespace']}/{stub['ID']}  plugin={stub['PluginID']}  "
            f"external_id={stub['ExternalID'] or stub['ID']}  capabilities={caps}  "
            f"capacity={volume.get('Capacity', 0)}  "
            f"schedulable={str(stub['Schedulable']).lower()}  node plugin: {node}"
        )
        writers = volume.get("WriteAllocs") or {}
        for alloc in volume.get("Allocations") or []:
            mode = "write" if alloc["ID"] in writers else "read"
            print(f"  claim  alloc {alloc['ID'][:8]}  job {alloc['JobID']}  {mode}  in use")
    return 0


def plugin_status(client: AgentClient, args: argparse.Namespace) -> int:
    stubs = client.get("/v1/plugins", type="csi") or []
    plugins = [p for p in (_plugin(client, s["ID"]) for s in stubs) if p is not None]
    if args.json:
        _print_json(plugins)
        return 0
    volumes = client.get("/v1/volumes", type="csi", namespace="*") or []
    rows = []
    for kind, key in (("csi-controller", "Controllers"), ("csi-node", "Nodes")):
        for plugin in sorted(plugins, key=lambda p: str(p["ID"])):
            for info in (plugin.get(key) or {}).values():
                rows.append((kind, plugin, info))
    if not rows:
        print("no CSI plugins are registered on this client; run a job with a csi_plugin task")
    for kind, plugin, info in rows:
        count = sum(v["PluginID"] == plugin["ID"] for v in volumes)
        print(
            f"{kind:<15} {plugin['ID']}  alloc {str(info.get('AllocID'))[:8]}  {_health(info)}  "
            f"provider={plugin.get('Provider', '')} {plugin.get('Version', '')}  volumes={count}"
        )
    return 0 if all(info.get("Healthy") for _, _, info in rows) else 1


# --- snapshots --------------------------------------------------------------------------------------


def snapshot_create(client: AgentClient, args: argparse.Namespace) -> int:
    wanted = {
        "SourceVolumeID": args.volume,
        "Name": args.name or "",
        "Secrets": _pairs(args.secret, "--secret"),
        "Parameters": _pairs(args.parameter, "--parameter"),
    }
    try:
        answer, _ = client.request("PUT", "/v1/volumes/snapshot", {"namespace": args.namespace},
                                   {"Snapshots": [wanted]})  # fmt: skip
    except APIRequestError as err:
        if err.status == 404:
            raise _not_registered(args.volume, args.namespace) from None
        raise
    snap = answer["Snapshots"][0]
    ready = "ready" if snap["IsReady"] else "not ready yet"
    print(f'created snapshot "{snap["ID"]}" of volume "{args.volume}" (size {snap["SizeBytes"]} bytes, {ready})')
    return 0


def snapshot_delete(client: AgentClient, args: argparse.Namespace) -> int:
    query = {"plugin_id": args.plugin_id, "snapshot_id": args.snapshot_id}
    answer, _ = client.request("DELETE", "/v1/volumes/snapshot", query, {"Secrets": _pairs(args.secret, "--secret")})
    unknown = (
        ""
        if (answer or {}).get("Existed")
        else " (the plugin cannot list snapshots, so whether it existed is not known)"
    )
    print(f'deleted snapshot "{args.snapshot_id}" of CSI plugin "{args.plugin_id}"{unknown}')
    return 0


def snapshot_list(client: AgentClient, args: argparse.Namespace) -> int:
    import datetime  # only here: every other command of the CLI imports this module

    secrets = _pairs(args.secret, "--secret")
    answer, _ = client.request("GET", "/v1/volumes/snapshot", {"plugin_id": args.plugin or None},
                               {"Secrets": secrets} if secrets else None)  # fmt: skip
    snapshots = answer.get("Snapshots") or []
    not_asked: dict[str, str] = answer.get("NotAsked") or {}
    if args.json:
        _print_json(snapshots)
        return 0
    if not snapshots:
        print("no snapshots" + (" from the plugins that could be asked" if not_asked else ""))
    for s in snapshots:
        volume = s["SourceVolumeID"] or f"(external {s['ExternalSourceVolumeID']})"
        ready = "ready" if s["IsReady"] else "not ready"
        created = datetime.datetime.fromtimestamp(s["CreateTime"], datetime.UTC).isoformat()
        print(f"{s['ID']}  plugin={s['PluginID']}  volume={volume}  size={s['SizeBytes']}  created={created}  {ready}")
    for plugin, why in sorted(not_asked.items()):
        print(f'not asked: CSI plugin "{plugin}" ({why}); its snapshots, if any, are not listed')
    return 0


_VERBS: dict[str, Verb] = {
    "cmd_volume_register": register,
    "cmd_volume_create": create,
    "cmd_volume_deregister": deregister,
    "cmd_volume_delete": delete,
    "cmd_volume_detach": detach,
    "cmd_volume_status": volume_status,
    "cmd_volume_snapshot_create": snapshot_create,
    "cmd_volume_snapshot_delete": snapshot_delete,
    "cmd_volume_snapshot_list": snapshot_list,
    "cmd_plugin_status": plugin_status,
}
