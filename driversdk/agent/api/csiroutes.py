"""Nomad's CSI endpoints on the agent: ``GET /v1/volumes?type=csi``, ``GET /v1/volume/csi/:id``,
``GET /v1/plugins?type=csi`` and ``GET /v1/plugin/csi/:id``, in the shapes of Nomad's api package
(CSIVolumeListStub, CSIVolume, CSIPluginListStub, CSIPlugin with CSIInfo per node).

They read the stores ``driversdk volume status`` and ``plugin status`` read (the volume store, the
CSI plugin registry) and probe each plugin instance now, as those commands do. A volume's secrets
and mount options never leave the agent (Nomad blanks them in its API too).

The writes (``PUT|DELETE /v1/volume/csi/:id``, ``/create``, ``/delete``, ``/detach``,
``GET|PUT|DELETE /v1/volumes/snapshot``) are the volume commands' work done by the agent: the same
functions (``VolumeStore.register``/``deregister``, ``runner.volumeops``, ``VolumeWatcher``) on the
agent's own stores. A volume comes in as Nomad's CSIVolume JSON (``csivolumejson``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from driversdk.agent.api import shapes
from driversdk.agent.api.httpserver import APIError, Request, Response
from driversdk.agent.api.routing import route

if TYPE_CHECKING:
    from driversdk.agent.agent import Agent
    from driversdk.agent.csi.registry import PluginRegistration
    from driversdk.agent.csi.volumeops import Stores
    from driversdk.agent.csi.volumes import Claim
    from driversdk.csi.fingerprint import PluginFingerprint
    from driversdk.csi.model import Volume

# Nomad's answer to a volume or plugin type it does not serve (its ListVolumesRequest).
NOT_FOUND = "resource not found"
# The zero time.Time Nomad writes for a volume whose resources were never exhausted.
ZERO_TIME = "0001-01-01T00:00:00Z"


def _csi_type(request: Request) -> bool:
    """False when ``type`` is absent (Nomad answers an empty list); raises for another type."""
    kind = request.query.get("type")
    if kind is None:
        return False
    if kind != "csi":
        raise APIError(404, NOT_FOUND)
    return True


def _namespace(request: Request) -> str:
    return request.query.get("namespace") or shapes.NAMESPACE


@dataclass
class _Instance:
    kind: str  # csi-controller | csi-node
    registration: PluginRegistration
    facts: PluginFingerprint


@dataclass
class _PluginView:
    """One CSI plugin on this node: its current controller and node instances, probed now."""

    plugin_id: str
    controller: _Instance | None
    node: _Instance | None

    @property
    def provider(self) -> str:
        for instance in (self.node, self.controller):
            if instance is not None and instance.facts.provider:
                return instance.facts.provider
        return ""

    @property
    def version(self) -> str:
        for instance in (self.node, self.controller):
            if instance is not None and instance.facts.provider_version:
                return instance.facts.provider_version
        return ""

    @property
    def controller_required(self) -> bool:
        return any(i is not None and i.facts.requires_controller for i in (self.node, self.controller))

    def counts(self) -> dict[str, int]:
        def healthy(instance: _Instance | None) -> int:
            return int(instance is not None and instance.facts.healthy)

        return {
            "ControllersHealthy": healthy(self.controller),
            "ControllersExpected": int(self.controller is not None),
            "NodesHealthy": healthy(self.node),
            "NodesExpected": int(self.node is not None),
        }

    @property
    def schedulable(self) -> bool:
        node_ok = self.node is not None and self.node.facts.healthy
        controller_ok = not self.controller_required or (self.controller is not None and self.controller.facts.healthy)
        return node_ok and controller_ok


def _probe(registration: PluginRegistration, plugin_id: str, node_role: bool) -> _Instance:
    kind = "csi-node" if node_role else "csi-controller"
    from driversdk.csi.client import CSIClient
    from driversdk.csi.errors import CSIError
    from driversdk.csi.fingerprint import PluginFingerprint, fingerprint

    try:
        client = CSIClient(registration.socket_path, plugin=plugin_id)
    except CSIError as err:
        return _Instance(kind, registration, PluginFingerprint(plugin_id, False, f"failed to connect: {err}"))
    try:
        return _Instance(kind, registration, fingerprint(client, plugin_id, node_role=node_role))
    finally:
        client.close()


def _plugin_ids(agent: Agent) -> list[str]:
    assert agent.node is not None
    registry = agent.node.registry
    return sorted(set(registry.plugins("csi-controller")) | set(registry.plugins("csi-node")))


def _plugin(agent: Agent, plugin_id: str) -> _PluginView:
    assert agent.node is not None
    registry = agent.node.registry
    controller = registry.current("csi-controller", plugin_id)
    node = registry.current("csi-node", plugin_id)
    return _PluginView(
        plugin_id,
        None if controller is None else _probe(controller, plugin_id, node_role=False),
        None if node is None else _probe(node, plugin_id, node_role=True),
    )


def _topologies(segments: list[dict[str, str]]) -> list[dict[str, Any]]:
    return [{"Segments": dict(s)} for s in segments]


def _live_claims(agent: Agent, volume: Volume) -> list[Claim]:
    """Claims that count against the volume: taken, by an allocation that is not over."""
    assert agent.node is not None
    store = agent.node.volumes
    return [c for c in store.claims(volume.id, volume.namespace)
            if not c.past and not store.alloc_terminal(c.alloc_id)]  # fmt: skip


def _volume_stub(agent: Agent, volume: Volume, plugin: _PluginView) -> dict[str, Any]:
    claims = _live_claims(agent, volume)
    reachable = True
    if plugin.node is not None and plugin.node.facts.node is not None:
        from driversdk.csi.model import topology_reachable

        reachable = topology_reachable(volume.topologies, plugin.node.facts.node.topology)
    return {
        "ID": volume.id,
        "Namespace": volume.namespace,
        "Name": volume.name or volume.id,
        "ExternalID": volume.remote_id,
        "Topologies": _topologies(volume.topologies),
        # Since Nomad 1.1 a volume's modes are those of its claims; unclaimed, they are empty.
        "AccessMode": claims[0].access_mode if claims else "",
        "AttachmentMode": claims[0].attachment_mode if claims else "",
        "CurrentReaders": sum(c.mode == "read" for c in claims),
        "CurrentWriters": sum(c.mode == "write" for c in claims),
        "Schedulable": plugin.schedulable and reachable,
        "PluginID": volume.plugin_id,
        "Provider": plugin.provider,
        "ControllerRequired": plugin.controller_required,
        **plugin.counts(),
        "ResourceExhausted": ZERO_TIME,
        "CreateIndex": 0,
        "ModifyIndex": 0,
        "CreateTime": 0,
        "ModifyTime": 0,
    }


def _volume(agent: Agent, volume: Volume, plugin: _PluginView) -> dict[str, Any]:
    assert agent.node is not None
    out = _volume_stub(agent, volume, plugin)
    del out["CurrentReaders"], out["CurrentWriters"]  # not fields of CSIVolume: ReadAllocs/WriteAllocs say it
    claims = _live_claims(agent, volume)
    allocations = []
    for claim in claims:
        found = [a for a in agent.node.state.allocs_by_prefix(claim.alloc_id) if a[0].alloc_id == claim.alloc_id]
        if found:
            allocations.append(shapes.alloc_stub(agent, *found[0]))
    requested = volume.requested_topologies
    wanted = None
    if requested.required or requested.preferred:
        wanted = {
            "Required": _topologies(list(requested.required)),
            "Preferred": _topologies(list(requested.preferred)),
        }
    out.update(
        {
            "RequestedTopologies": wanted,
            "MountOptions": None,  # Nomad blanks it: mount flags may hold credentials
            "Secrets": None,
            "Parameters": dict(volume.parameters),
            "Context": dict(volume.context),
            "Capacity": volume.capacity,
            "RequestedCapacityMin": volume.capacity_min,
            "RequestedCapacityMax": volume.capacity_max,
            "RequestedCapabilities": [
                {"AccessMode": c.access_mode.value, "AttachmentMode": c.attachment_mode.value}
                for c in volume.capabilities
            ],
            "CloneID": volume.clone_id,
            "SnapshotID": volume.snapshot_id,
            "ReadAllocs": {c.alloc_id: None for c in claims if c.mode == "read"},
            "WriteAllocs": {c.alloc_id: None for c in claims if c.mode == "write"},
            "Allocations": allocations,
            "ProviderVersion": plugin.version,
        }
    )
    return out


@route(r"/v1/volumes", "GET")
def list_volumes(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    if not _csi_type(request):
        return Response(body=[])
    assert agent.node is not None
    namespace = _namespace(request)
    prefix = request.query.get("prefix", "")
    plugin_id = request.query.get("plugin_id", "")
    volumes = [v for v in agent.node.volumes.list()
               if (namespace == "*" or v.namespace == namespace) and v.id.startswith(prefix)
               and (not plugin_id or v.plugin_id == plugin_id)]  # fmt: skip
    plugins = {p: _plugin(agent, p) for p in sorted({v.plugin_id for v in volumes})}
    return Response(body=[_volume_stub(agent, v, plugins[v.plugin_id]) for v in volumes])


@route(r"/v1/volume/csi/(?P<id>[^/]+)", "GET")
def read_volume(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    assert agent.node is not None
    volume = agent.node.volumes.get(match["id"], _namespace(request))
    if volume is None:
        raise APIError(404, "volume not found")
    return Response(body=_volume(agent, volume, _plugin(agent, volume.plugin_id)))


def _csi_info(agent: Agent, instance: _Instance) -> dict[str, Any]:
    """Nomad's CSIInfo: one instance's fingerprint."""
    facts = instance.facts
    node = facts.node
    return {
        "PluginID": facts.plugin_id,
        "AllocID": instance.registration.alloc_id,
        "Healthy": facts.healthy,
        "HealthDescription": facts.health_description,
        "UpdateTime": _now(),
        "RequiresControllerPlugin": facts.requires_controller,
        "RequiresTopologies": facts.requires_topologies,
        "ControllerInfo": None
        if instance.kind != "csi-controller"
        else {
            "SupportsReadOnlyAttach": "PUBLISH_READONLY" in facts.controller_capabilities,
            "SupportsAttachDetach": "PUBLISH_UNPUBLISH_VOLUME" in facts.controller_capabilities,
            "SupportsListVolumes": "LIST_VOLUMES" in facts.controller_capabilities,
            "SupportsListVolumesAttachedNodes": "LIST_VOLUMES_PUBLISHED_NODES" in facts.controller_capabilities,
        },
        "NodeInfo": None
        if node is None
        else {
            "ID": node.node_id,
            "MaxVolumes": node.max_volumes,
            "AccessibleTopology": {"Segments": dict(node.topology)} if node.topology else None,
            "RequiresNodeStageVolume": facts.requires_staging,
        },
    }


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def _plugin_stub(view: _PluginView) -> dict[str, Any]:
    return {"ID": view.plugin_id, "Provider": view.provider, "ControllerRequired": view.controller_required,
            **view.counts(), "CreateIndex": 0, "ModifyIndex": 0}  # fmt: skip


def _jobs(instance: _Instance | None, allocations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nomad's JobDescription of the job running the instance's plugin task."""
    if instance is None:
        return []
    return [{"Namespace": a["Namespace"], "ID": a["JobID"], "Version": a["JobVersion"]}
            for a in allocations if a["ID"] == instance.registration.alloc_id]  # fmt: skip


@route(r"/v1/plugins", "GET")
def list_plugins(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    if not _csi_type(request):
        return Response(body=[])
    prefix = request.query.get("prefix", "")
    return Response(body=[_plugin_stub(_plugin(agent, p)) for p in _plugin_ids(agent) if p.startswith(prefix)])


@route(r"/v1/plugin/csi/(?P<id>[^/]+)", "GET")
def read_plugin(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    assert agent.node is not None
    plugin_id = match["id"]
    if plugin_id not in _plugin_ids(agent):
        raise APIError(404, "plugin not found")
    view = _plugin(agent, plugin_id)
    node_id = agent.node_info().id
    allocations: list[dict[str, Any]] = []
    for instance in (view.controller, view.node):
        if instance is None:
            continue
        alloc_id = instance.registration.alloc_id
        found = [a for a in agent.node.state.allocs_by_prefix(alloc_id) if a[0].alloc_id == alloc_id]
        if found and all(s["ID"] != alloc_id for s in allocations):
            allocations.append(shapes.alloc_stub(agent, *found[0]))
    out = _plugin_stub(view)
    out.update(
        {
            "Version": view.version,
            "Controllers": {} if view.controller is None else {node_id: _csi_info(agent, view.controller)},
            "Nodes": {} if view.node is None else {node_id: _csi_info(agent, view.node)},
            "Allocations": allocations,
            "ControllerJobs": _jobs(view.controller, allocations),
            "NodeJobs": _jobs(view.node, allocations),
            "CreateTime": 0,
            "ModifyTime": 0,
        }
    )
    return Response(body=out)


# --- writes: register, deregister, create, delete, detach, snapshots -------------------------------
# Each does what the volume command does on a data dir, with the agent's own stores and the very
# functions that command calls (driversdk.agent.csi.volumes / volumeops / volumewatcher).


def _stores(agent: Agent) -> Stores:
    from driversdk.agent.csi.volumeops import Stores

    assert agent.node is not None
    return Stores(agent.node.volumes, agent.node.csi_state, agent.node.registry)


def _secrets_body(request: Request) -> dict[str, str]:
    """The ``Secrets`` of an optional JSON body (a DELETE's or a snapshot listing's)."""
    if not request.body:
        return {}
    body = request.json()
    secrets = body.get("Secrets") if isinstance(body, dict) else None
    if secrets is None:
        return {}
    if not isinstance(secrets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in secrets.items()):
        raise APIError(400, "Secrets must be an object of strings")
    return dict(secrets)


def _request_volume(request: Request, path_id: str) -> Volume:
    """The one volume of a ``{"Volumes": [CSIVolume]}`` body, for the volume the path names."""
    from driversdk.agent.api.csivolumejson import volume_from_api

    body = request.json()
    volumes = body.get("Volumes") if isinstance(body, dict) else None
    if not isinstance(volumes, list) or len(volumes) != 1:
        raise APIError(400, 'the body must be {"Volumes": [CSIVolume]} with exactly one volume')
    volume = volume_from_api(volumes[0])
    if volume.id != path_id:
        raise APIError(
            400, f'the body\'s volume has ID "{volume.id}" but the path names "{path_id}"; send it to '
            f"/v1/volume/csi/{volume.id}"
        )  # fmt: skip
    return volume


def _written(agent: Agent, volume: Volume) -> Response:
    """The answer of a register or create: the stored volume as GET shows it (no secrets)."""
    return Response(body={"Volumes": [_volume(agent, volume, _plugin(agent, volume.plugin_id))], "Warnings": ""})


@route(r"/v1/volume/csi/(?P<id>[^/]+)", "PUT", "POST")
def register_volume(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    """``nomad volume register``: insert, or merge an update onto the registration."""
    assert agent.node is not None
    stored, _ = agent.node.volumes.register(_request_volume(request, match["id"]))
    return _written(agent, stored)


@route(r"/v1/volume/csi/(?P<id>[^/]+)", "DELETE")
def deregister_volume(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    """``nomad volume deregister``: refused with a sentence while the volume has claims (with
    ``force`` too: a claim is released by its allocation's end or ``detach``, never dropped)."""
    assert agent.node is not None
    raw_force = request.query.get("force", "")
    if raw_force.lower() not in ("", "true", "false", "1", "0", "t", "f"):
        raise APIError(400, "invalid force value")
    if agent.node.volumes.get(match["id"], _namespace(request)) is None:
        raise APIError(404, "volume not found")
    agent.node.volumes.deregister(match["id"], _namespace(request))
    return Response(body=None)


@route(r"/v1/volume/csi/(?P<id>[^/]+)/create", "PUT", "POST")
def create_volume(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    """``nomad volume create``: CreateVolume through the plugin's controller and register the
    result; a known volume is updated (and expanded when asked)."""
    from driversdk.agent.csi.volumeops import create_volume as create

    stored, _ = create(_stores(agent), _request_volume(request, match["id"]))
    return _written(agent, stored)


@route(r"/v1/volume/csi/(?P<id>[^/]+)/delete", "DELETE")
def delete_volume(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    """``nomad volume delete``: DeleteVolume through the controller, then deregister; the body's
    ``Secrets`` overlay the volume's. Refused while the volume is claimed."""
    from driversdk.agent.csi.volumeops import delete_volume as delete

    assert agent.node is not None
    if agent.node.volumes.get(match["id"], _namespace(request)) is None:
        raise APIError(404, "volume not found")
    delete(_stores(agent), match["id"], _namespace(request), _secrets_body(request))
    return Response(body=None)


@route(r"/v1/volume/csi/(?P<id>[^/]+)/detach", "DELETE")
def detach_volume(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    """``nomad volume detach VOLUME NODE``: release the volume's claims on the node whose
    allocations are over (node unpublish, unstage, controller unpublish, free). ``alloc`` (an id or
    prefix; driversdk's) narrows it to one allocation's claim. Claims of allocations still running
    are not touched: the answer is 400 naming them, after the other claims were released.
    200 answers ``{"Released": [sentence, …]}``."""
    from driversdk.agent.csi.volumewatcher import VolumeWatcher, describe, describe_failure

    assert agent.node is not None
    node_id = request.query.get("node", "")
    if not node_id:
        raise APIError(400, "detach requires node ID")
    if not agent.node_info().id.startswith(node_id):
        raise APIError(404, f'node "{node_id}" not found; this agent\'s node is {agent.node_info().id}')
    volume_id, namespace, alloc = match["id"], _namespace(request), request.query.get("alloc", "")
    if agent.node.volumes.get(volume_id, namespace) is None:
        raise APIError(404, "volume not found")
    watcher = VolumeWatcher(agent.settings.client.data_dir, volumes=agent.node.volumes, csi=agent.node.csi_state)
    try:
        watcher.denormalize()
        claims = [c for c in watcher.volumes.claims(volume_id, namespace) if not alloc or c.alloc_id.startswith(alloc)]
        live = [
            f'alloc {c.alloc_id[:8]} of job {c.job} still uses volume "{volume_id}" (it is not over); stop the job '
            "first, then detach"
            for c in claims
            if not c.past
        ]
        outcome = watcher.reap(volume_id=volume_id, namespace=namespace, alloc_id=alloc or None, force=True,
                               detach=True)  # fmt: skip
    finally:
        watcher.close()
    released = [describe(r) for r in outcome.released]
    errors = live + [describe_failure(claim, error) for claim, error in outcome.failed]
    if errors:
        # One sentence a line: what was released first, then each claim that was not.
        raise APIError(400, "\n".join(released + errors))
    return Response(body={"Released": released})


def _snapshot(row: dict[str, Any]) -> dict[str, Any]:
    """A list_snapshots row as Nomad's api.CSISnapshot (never its secrets)."""
    import datetime

    created = datetime.datetime.fromisoformat(row["created"])
    return {
        "ID": row["snapshot_id"],
        "ExternalSourceVolumeID": row["external_volume_id"],
        "SourceVolumeID": row["volume_id"],
        "SizeBytes": row["size_bytes"],
        "CreateTime": int(created.timestamp()),
        "IsReady": row["ready"],
        "PluginID": row["plugin_id"],
        "Name": "",
        "Parameters": None,
        "Secrets": None,
    }


@route(r"/v1/volumes/snapshot", "GET")
def list_snapshots(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    """``nomad volume snapshot list``: every snapshot of ``plugin_id``'s controller, or of each
    registered controller. Plugins that could not be asked are named in ``NotAsked`` (driversdk's)."""
    from driversdk.agent.csi.volumeops import list_snapshots as listing

    found = listing(_stores(agent), request.query.get("plugin_id") or None, _secrets_body(request))
    return Response(body={"Snapshots": [_snapshot(r) for r in found.rows], "NextToken": "",
                          "NotAsked": found.not_asked})  # fmt: skip


@route(r"/v1/volumes/snapshot", "PUT", "POST")
def create_snapshot(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    """``nomad volume snapshot create``: ``{"Snapshots": [{"SourceVolumeID", "Name", "Secrets",
    "Parameters"}]}``, one snapshot, of a volume of ``namespace``."""
    from driversdk.agent.csi.volumeops import create_snapshot as create

    body = request.json()
    snapshots = body.get("Snapshots") if isinstance(body, dict) else None
    if not isinstance(snapshots, list) or len(snapshots) != 1 or not isinstance(snapshots[0], dict):
        raise APIError(400, 'the body must be {"Snapshots": [CSISnapshot]} with exactly one snapshot')
    wanted = snapshots[0]
    volume_id, name = wanted.get("SourceVolumeID"), wanted.get("Name") or ""
    if not isinstance(volume_id, str) or not volume_id or not isinstance(name, str):
        raise APIError(400, "a snapshot needs SourceVolumeID, the volume to snapshot (and Name a string, if given)")
    maps = {}
    for key in ("Secrets", "Parameters"):
        value = wanted.get(key) or {}
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise APIError(400, f"{key} must be an object of strings")
        maps[key] = dict(value)
    namespace = _namespace(request)
    assert agent.node is not None
    volume = agent.node.volumes.get(volume_id, namespace)
    if volume is None:
        raise APIError(404, "volume not found")
    snap = create(_stores(agent), volume_id, namespace, name, secrets=maps["Secrets"], parameters=maps["Parameters"])
    return Response(
        body={
            "Snapshots": [
                {
                    "ID": snap.snapshot_id,
                    "ExternalSourceVolumeID": volume.remote_id,
                    "SourceVolumeID": volume_id,
                    "SizeBytes": snap.size_bytes,
                    "CreateTime": int(snap.created.timestamp()),
                    "IsReady": snap.ready_to_use,
                    "PluginID": volume.plugin_id,
                    "Name": name,
                    "Parameters": maps["Parameters"],
                    "Secrets": None,
                }
            ]
        }
    )


@route(r"/v1/volumes/snapshot", "DELETE")
def delete_snapshot(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    """``nomad volume snapshot delete PLUGIN SNAPSHOT``: ``plugin_id`` and ``snapshot_id`` in the
    query, ``Secrets`` in an optional body. 200 answers ``{"Existed": true|null}`` (driversdk's:
    null when the plugin cannot list snapshots to tell)."""
    from driversdk.agent.csi.volumeops import delete_snapshot as delete

    plugin_id, snapshot_id = request.query.get("plugin_id", ""), request.query.get("snapshot_id", "")
    if not plugin_id or not snapshot_id:
        raise APIError(400, "Must specify plugin_id and snapshot_id")
    existed = delete(_stores(agent), plugin_id, snapshot_id, _secrets_body(request))
    return Response(body={"Existed": existed})
