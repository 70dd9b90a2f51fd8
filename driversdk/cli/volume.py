"""The `volume` and `plugin status` commands when an agent is reachable: each goes through the
agent's HTTP API in Nomad's shape (``/v1/volume/csi/:id`` and its ``/create``, ``/delete``,
``/detach``; ``/v1/volumes?type=csi``; ``/v1/volumes/snapshot``; ``/v1/plugins?type=csi``,
``/v1/plugin/csi/:id``), and the agent does the work with its own stores and plugins. With no
agent, :func:`via_agent` answers None and the command works on the data dir as before.

The agent is found as `driversdk run` finds it: ``-address`` / ``NOMAD_ADDR``, else the local
agent's socket in the data dir. With ``--data-dir`` or ``--client`` given, only that data dir's
socket counts (not a dev agent's elsewhere), and a socket nobody answers on is no agent.

Stdlib and the API client only, except that a volume file is read with the runner's parser and
sent as Nomad's CSIVolume JSON (driversdk.agent.api.csivolumejson): the CLI never opens state.db here.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from driversdk.cli.apiclient import SOCKET_NAME, AgentClient, AgentUnreachable, APIRequestError, quote_segment
from driversdk.cli.apiverbs import VerbError, data_dir_of
from driversdk.cli.common import key_values, resolve_data_dir

# Not typing.TYPE_CHECKING: importing typing costs a verb ~2 ms (type checkers know this spelling).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Verb = Callable[[AgentClient, argparse.Namespace], int]
    Command = Callable[[argparse.Namespace], int]


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


def via_agent(args: argparse.Namespace, verb: Verb) -> int | None:
    """Run the command through the agent with ``verb``; None when there is no agent to go through (a
    local socket that does not answer counts as none; a named address that does not is an error)."""
    found = _find(args)
    if found is None:
        return None
    client, named = found
    try:
        return verb(client, args)
    except AgentUnreachable:
        if named:
            raise
        return None


def _agent_first(verb: Verb) -> Callable[[Command], Command]:
    """A command that goes through the agent's API with ``verb`` when an agent is reachable, and
    works on the data dir (the decorated function) when none is."""

    def decorate(on_data_dir: Command) -> Command:
        @functools.wraps(on_data_dir)  # the name main() reads the command's data-dir options by
        def command(args: argparse.Namespace) -> int:
            through_agent = via_agent(args, verb)
            return on_data_dir(args) if through_agent is None else through_agent

        return command

    return decorate


def _vpath(volume_id: str, suffix: str = "") -> str:
    return "/v1/volume/csi/" + quote_segment(volume_id) + suffix


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


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


# --- register, deregister, create, delete, detach --------------------------------------------------


def _volume_body(path: str) -> tuple[Any, dict[str, Any]]:
    from driversdk.agent.api.csivolumejson import volume_to_api
    from driversdk.agent.csi.volumes import parse_volume_file

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
    secrets = key_values(args.secret, "--secret")
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
        found: dict[str, Any] = client.get("/v1/plugin/csi/" + quote_segment(plugin_id))
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
        "Secrets": key_values(args.secret, "--secret"),
        "Parameters": key_values(args.parameter, "--parameter"),
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
    answer, _ = client.request(
        "DELETE", "/v1/volumes/snapshot", query, {"Secrets": key_values(args.secret, "--secret")}
    )
    unknown = (
        ""
        if (answer or {}).get("Existed")
        else " (the plugin cannot list snapshots, so whether it existed is not known)"
    )
    print(f'deleted snapshot "{args.snapshot_id}" of CSI plugin "{args.plugin_id}"{unknown}')
    return 0


def snapshot_list(client: AgentClient, args: argparse.Namespace) -> int:
    import datetime  # only here: every other command of the CLI imports this module

    secrets = key_values(args.secret, "--secret")
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


# --- the commands, on the data dir when no agent is reachable ------------------------------------


def _volume_store(args: argparse.Namespace, *, existing: bool = False) -> Any:
    from driversdk.agent.csi.volumes import VolumeStore

    data_dir = resolve_data_dir(args, existing=existing)
    _watch(data_dir)
    return VolumeStore.for_data_dir(data_dir)


def _watch(data_dir: str) -> None:
    """Every `volume` command first gives the volume watcher a pass: past claims whose backoff
    ran out are released (said on stderr, so --json output stays clean)."""
    from driversdk.agent.csi.volumewatcher import VolumeWatcher, describe

    watcher = VolumeWatcher(data_dir)
    try:
        outcome = watcher.reap(wait=10.0)
    finally:
        watcher.close()
    for released in outcome.released:
        print(f"volume watcher: {describe(released)}", file=sys.stderr)


def _stores(args: argparse.Namespace, *, existing: bool = True) -> Any:
    """The data dir's volume, CSI and plugin stores (a context manager that closes them), once the
    volume watcher had its pass."""
    from driversdk.agent.csi.volumeops import Stores

    data_dir = resolve_data_dir(args, existing=existing)
    _watch(data_dir)
    return Stores.open(data_dir)


@_agent_first(register)
def cmd_volume_register(args: argparse.Namespace) -> int:
    from driversdk.agent.csi.volumes import parse_volume_file

    volume = parse_volume_file(args.file)
    stored, created = _volume_store(args).register(volume)
    print(f'{"registered" if created else "updated"} CSI volume "{stored.id}" (plugin "{stored.plugin_id}")')
    return 0


@_agent_first(create)
def cmd_volume_create(args: argparse.Namespace) -> int:
    """CreateVolume through the plugin's controller, then register the result (`nomad volume create`)."""
    from driversdk.agent.csi.volumeops import create_volume
    from driversdk.agent.csi.volumes import parse_volume_file

    volume = parse_volume_file(args.file)
    with _stores(args, existing=False) as stores:
        before = stores.volumes.get(volume.id, volume.namespace)
        stored, created = create_volume(stores, volume)
    if not created:
        grown = (
            f"; expanded from {before.capacity} to {stored.capacity} bytes"
            if before is not None and stored.capacity != before.capacity
            else ""
        )
        print(f'updated CSI volume "{stored.id}" (it exists already; plugin "{stored.plugin_id}"){grown}')
        return 0
    print(
        f'created CSI volume "{stored.id}" (external ID "{stored.external_id}", capacity {stored.capacity} bytes, '
        f'plugin "{stored.plugin_id}")'
    )
    return 0


@_agent_first(delete)
def cmd_volume_delete(args: argparse.Namespace) -> int:
    """DeleteVolume through the controller and deregister; refused while the volume is claimed."""
    from driversdk.agent.csi.volumeops import delete_volume

    with _stores(args) as stores:
        volume = delete_volume(stores, args.id, args.namespace, key_values(args.secret, "--secret"))
    print(f'deleted CSI volume "{volume.id}" (external ID "{volume.external_id}")')
    return 0


@_agent_first(detach)
def cmd_volume_detach(args: argparse.Namespace) -> int:
    """Release the volume's claims whose allocations are over (`nomad volume detach`): node
    unpublish, unstage, controller unpublish, free. With the plugin gone for good a claim is freed
    once nothing of it is mounted, saying what could not be undone."""
    from driversdk.agent.csi.volumewatcher import DetachError, VolumeWatcher, describe, describe_failure

    data_dir = resolve_data_dir(args, existing=True)
    watcher = VolumeWatcher(data_dir)
    try:
        if watcher.volumes.get(args.volume, args.namespace) is None:
            raise DetachError(f'volume "{args.volume}" is not registered in namespace "{args.namespace}"')
        watcher.denormalize()
        claims = [
            c
            for c in watcher.volumes.claims(args.volume, args.namespace)
            if not args.alloc or c.alloc_id.startswith(args.alloc)
        ]
        if not claims:
            which = f" by an allocation starting with {args.alloc!r}" if args.alloc else ""
            print(f'volume "{args.volume}" has no claims{which}; nothing to detach')
            return 0
        live = [c for c in claims if not c.past]
        for claim in live:
            found = watcher.volumes.alloc_state(claim.alloc_id)
            how = f"its run (pid {found[1]})" if found else "it"
            print(
                f'error: alloc {claim.alloc_id[:8]} of job {claim.job} still uses volume "{args.volume}" ({how} is '
                "not over); stop the job first (or run it again to recover it, then stop it), then detach",
                file=sys.stderr,
            )
        outcome = watcher.reap(
            volume_id=args.volume, namespace=args.namespace, alloc_id=args.alloc or None, force=True, detach=True
        )
    finally:
        watcher.close()
    for released in outcome.released:
        print(describe(released))
    for claim, error in outcome.failed:
        print(f"error: {describe_failure(claim, error)}", file=sys.stderr)
    return 1 if live or outcome.failed else 0


@_agent_first(volume_status)
def cmd_volume_status(args: argparse.Namespace) -> int:
    from driversdk.agent.csi.volumeops import plugin_health, volume_status
    from driversdk.agent.csi.volumes import VolumeError, claim_state_text, public_view

    with _stores(args) as stores:
        if args.id:
            volume = stores.volumes.get(args.id, args.namespace)
            if volume is None:
                raise VolumeError(f'volume "{args.id}" is not registered in namespace "{args.namespace}"')
            view = public_view(volume)
            view.update(volume_status(stores, volume, plugin_health(stores, volume.plugin_id)))
            print(json.dumps(view, indent=2))
            return 0
        volumes = stores.volumes.list()
        health = {p: plugin_health(stores, p) for p in sorted({v.plugin_id for v in volumes})}
        views = []
        for v in volumes:
            view = public_view(v)
            view.update(volume_status(stores, v, health[v.plugin_id]))
            views.append(view)
        if args.json:
            print(json.dumps(views, indent=2))
            return 0
        if not volumes:
            print("no CSI volumes registered")
        for v, view in zip(volumes, views, strict=True):
            caps = ", ".join(f"{c.access_mode.value}/{c.attachment_mode.value}" for c in v.capabilities)
            print(
                f"{v.namespace}/{v.id}  plugin={v.plugin_id}  external_id={v.remote_id}  capabilities={caps}  "
                f"capacity={v.capacity}  schedulable={str(view['schedulable']).lower()}  "
                f"node plugin: {view['plugin_node']}"
            )
            for c in stores.volumes.claims(v.id, v.namespace):
                print(f"  claim  alloc {c.alloc_id[:8]}  job {c.job}  {c.mode}  {claim_state_text(c)}")
    return 0


@_agent_first(snapshot_create)
def cmd_volume_snapshot_create(args: argparse.Namespace) -> int:
    from driversdk.agent.csi.volumeops import create_snapshot

    with _stores(args) as stores:
        snap = create_snapshot(
            stores,
            args.volume,
            args.namespace,
            args.name or "",
            secrets=key_values(args.secret, "--secret"),
            parameters=key_values(args.parameter, "--parameter"),
        )
    ready = "ready" if snap.ready_to_use else "not ready yet"
    print(f'created snapshot "{snap.snapshot_id}" of volume "{args.volume}" (size {snap.size_bytes} bytes, {ready})')
    return 0


@_agent_first(snapshot_delete)
def cmd_volume_snapshot_delete(args: argparse.Namespace) -> int:
    from driversdk.agent.csi.volumeops import delete_snapshot

    with _stores(args) as stores:
        existed = delete_snapshot(stores, args.plugin_id, args.snapshot_id, key_values(args.secret, "--secret"))
    unknown = "" if existed else " (the plugin cannot list snapshots, so whether it existed is not known)"
    print(f'deleted snapshot "{args.snapshot_id}" of CSI plugin "{args.plugin_id}"{unknown}')
    return 0


@_agent_first(snapshot_list)
def cmd_volume_snapshot_list(args: argparse.Namespace) -> int:
    from driversdk.agent.csi.volumeops import list_snapshots

    with _stores(args) as stores:
        listing = list_snapshots(stores, args.plugin, key_values(args.secret, "--secret"))
    rows = listing.rows
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no snapshots" + (" from the plugins that could be asked" if listing.not_asked else ""))
    for r in rows:
        volume = r["volume_id"] or f"(external {r['external_volume_id']})"
        ready = "ready" if r["ready"] else "not ready"
        print(f"{r['snapshot_id']}  plugin={r['plugin_id']}  volume={volume}  size={r['size_bytes']}  "
              f"created={r['created']}  {ready}")  # fmt: skip
    for plugin, why in sorted(listing.not_asked.items()):
        print(f'not asked: CSI plugin "{plugin}" ({why}); its snapshots, if any, are not listed')
    return 0


@_agent_first(plugin_status)
def cmd_plugin_status(args: argparse.Namespace) -> int:
    """CSI plugin instances registered on this client, each probed now."""
    from driversdk.agent.csi.registry import PLUGIN_TYPES, PluginRegistry
    from driversdk.agent.csi.state import StateStore
    from driversdk.csi.client import CSIClient
    from driversdk.csi.errors import CSIError

    data_dir = resolve_data_dir(args, existing=True)
    store = StateStore(os.path.join(data_dir, "state.db"))
    volumes = _volume_store(args, existing=True).list()
    rows: list[dict[str, Any]] = []
    for kind in PLUGIN_TYPES:
        for name in sorted(PluginRegistry(store).plugins(kind)):
            for position, reg in enumerate(PluginRegistry(store).instances(kind, name)):
                health = "healthy"
                try:
                    client = CSIClient(reg.socket_path, plugin=name)
                    try:
                        health = "healthy" if client.probe() else "unhealthy: not ready"
                    finally:
                        client.close()
                except CSIError as err:
                    health = f"unhealthy: {err}"
                rows.append(
                    {
                        "type": kind,
                        "id": name,
                        "alloc_id": reg.alloc_id,
                        "current": position == 0,
                        "health": health,
                        "provider": reg.options.get("Provider", ""),
                        "version": reg.version,
                        "socket": reg.socket_path,
                        "volumes": sorted(v.id for v in volumes if v.plugin_id == name),
                        "mounts": len(store.usages(name)) if kind == "csi-node" else 0,
                    }
                )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no CSI plugins are registered on this client; run a job with a csi_plugin task")
    for r in rows:
        older = "" if r["current"] else " (older instance)"
        print(
            f"{r['type']:<15} {r['id']}  alloc {str(r['alloc_id'])[:8]}{older}  {r['health']}  "
            f"provider={r['provider']} {r['version']}  volumes={len(r['volumes'])} mounts={r['mounts']}"
        )
    return 0 if all(str(r["health"]) == "healthy" for r in rows) else 1


@_agent_first(deregister)
def cmd_volume_deregister(args: argparse.Namespace) -> int:
    _volume_store(args, existing=True).deregister(args.id, args.namespace)
    print(f'deregistered CSI volume "{args.id}"')
    return 0
