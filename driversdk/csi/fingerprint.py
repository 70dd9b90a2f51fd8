"""What a CSI plugin says about itself, read the way Nomad's instance manager reads it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from driversdk.csi.client import CSIClient, NodeInfo
from driversdk.csi.errors import CSIError
from driversdk.pb import csi_pb2

_NODE_RPC = csi_pb2.NodeServiceCapability.RPC
_CTRL_RPC = csi_pb2.ControllerServiceCapability.RPC
_SERVICE = csi_pb2.PluginCapability.Service


@dataclass(frozen=True)
class PluginFingerprint:
    plugin_id: str
    healthy: bool
    health_description: str
    provider: str = ""
    provider_version: str = ""
    requires_controller: bool = False
    requires_topologies: bool = False
    node: NodeInfo | None = None
    requires_staging: bool = False
    controller_capabilities: frozenset[str] = field(default_factory=frozenset)
    node_capabilities: frozenset[str] = field(default_factory=frozenset)


def fingerprint(client: CSIClient, plugin_id: str, *, node_role: bool = True) -> PluginFingerprint:
    """One fingerprint: identity and node info first, then probe and capabilities."""
    try:
        info = client.plugin_info()
        plugin_caps = client.plugin_capabilities()
        node = client.node_info() if node_role else None
    except CSIError as err:
        return PluginFingerprint(plugin_id, False, f"failed initial fingerprint with err: {err}")
    base = PluginFingerprint(
        plugin_id,
        False,
        "unhealthy",
        provider=info.name,
        provider_version=info.vendor_version,
        requires_controller=_SERVICE.CONTROLLER_SERVICE in plugin_caps,
        requires_topologies=_SERVICE.VOLUME_ACCESSIBILITY_CONSTRAINTS in plugin_caps,
        node=node,
    )
    try:
        ready = client.probe()
        node_caps = client.node_capabilities() if node_role else set()
        ctrl_caps: set[int] = set()
        if base.requires_controller:
            try:
                ctrl_caps = client.controller_capabilities()
            except CSIError as err:
                # A node-only deployment may advertise the controller service and then refuse it.
                if err.code != "UNIMPLEMENTED":
                    raise
    except CSIError as err:
        return replace(base, health_description=f"failed fingerprinting with error: {err}")
    return replace(
        base,
        healthy=ready,
        health_description="healthy" if ready else "unhealthy",
        requires_staging=_NODE_RPC.STAGE_UNSTAGE_VOLUME in node_caps,
        node_capabilities=frozenset(_NODE_RPC.Type.Name(c) for c in node_caps),  # type: ignore[arg-type]
        controller_capabilities=frozenset(_CTRL_RPC.Type.Name(c) for c in ctrl_caps),  # type: ignore[arg-type]
    )


def final_fingerprint(last: PluginFingerprint) -> PluginFingerprint:
    """The report sent when a plugin instance shuts down: its last facts, marked unhealthy."""
    return replace(last, healthy=False, health_description="unhealthy: plugin instance shut down")
