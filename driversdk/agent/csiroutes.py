"""Nomad's CSI endpoints on the agent: ``GET /v1/volumes?type=csi``, ``GET /v1/volume/csi/:id``,
``GET /v1/plugins?type=csi`` and ``GET /v1/plugin/csi/:id``, in the shapes of Nomad's api package
(CSIVolumeListStub, CSIVolume, CSIPluginListStub, CSIPlugin with CSIInfo per node).

They read the stores ``driversdk volume status`` and ``plugin status`` read (the volume store, the
CSI plugin registry) and probe each plugin instance now, as those commands do. A volume's secrets
and mount options never leave the agent (Nomad blanks them in its API too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from driversdk.agent import shapes
from driversdk.agent.httpserver import Request, Response
from driversdk.agent.routes import APIError, route

if TYPE_CHECKING:
    from driversdk.agent.agent import Agent
    from driversdk.csi.fingerprint import PluginFingerprint
    from driversdk.csi.model import Volume
    from driversdk.csi.registry import PluginRegistration
    from driversdk.runner.volumes import Claim

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
