"""The operator's volume commands that talk to a CSI plugin, as Nomad's ``volume create``,
``volume delete``, ``volume snapshot create|delete|list`` and the plugin facts of
``volume status``. Each goes through the plugin's registered controller (or node) instance and
is refused with a sentence when the plugin does not advertise the capability it needs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from driversdk.agent.csi.manager import UsageOptions
from driversdk.agent.csi.registry import PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.agent.csi.volumes import (
    TAKEN,
    Claim,
    VolumeError,
    VolumeStore,
    claim_state_text,
    claims_refusal,
    merge,
)
from driversdk.csi.client import CSIClient, PluginSnapshot
from driversdk.csi.errors import CSIError
from driversdk.csi.fingerprint import fingerprint
from driversdk.csi.model import AccessMode, AttachmentMode, Volume, VolumeCapability, topology_reachable
from driversdk.errors import DriverSDKError
from driversdk.pb import csi_pb2

_RPC = csi_pb2.ControllerServiceCapability.RPC
_NODE_EXPAND = csi_pb2.NodeServiceCapability.RPC.EXPAND_VOLUME


class VolumeOpError(DriverSDKError):
    """A volume command the plugin or the volume's state does not allow."""


@contextmanager
def controller_for(
    registry: PluginRegistry, plugin_id: str, capability: int | None = None, what: str = ""
) -> Iterator[CSIClient]:
    """A client of the plugin's current controller instance that advertises ``capability``."""
    reg = registry.current("csi-controller", plugin_id)
    if reg is None:
        raise VolumeOpError(
            f'CSI plugin "{plugin_id}" has no controller instance registered on this client; run its job (a task '
            "with csi_plugin of type controller or monolith) first"
        )
    client = CSIClient(reg.socket_path, plugin=plugin_id)
    try:
        if capability is not None and capability not in client.controller_capabilities():
            raise VolumeOpError(
                f'CSI plugin "{plugin_id}" does not support {what}: its controller does not advertise '
                f"{_RPC.Type.Name(capability)}"  # type: ignore[arg-type]
            )
        yield client
    finally:
        client.close()


@dataclass
class Stores:
    volumes: VolumeStore
    csi: StateStore
    registry: PluginRegistry

    @classmethod
    def open(cls, data_dir: str) -> Stores:
        db = os.path.join(data_dir, "state.db")
        csi = StateStore(db)
        return cls(VolumeStore(db), csi, PluginRegistry(csi))

    def close(self) -> None:
        self.volumes.close()
        self.csi.close()

    def __enter__(self) -> Stores:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


# --- create / delete ---------------------------------------------------------------------------


def create_volume(stores: Stores, volume: Volume) -> tuple[Volume, bool]:
    """CreateVolume through the controller and register the result; an existing registration
    is updated instead (Nomad reconciles a create of a known volume as an update)."""
    existing = stores.volumes.get(volume.id, volume.namespace)
    if existing is not None:
        # Checked before the plugin is asked for anything: a refused update expands nothing.
        merged = merge(existing, volume)
        capacity = expand_volume(stores, merged, existing.capacity)
        stored, _ = stores.volumes.register(volume)
        if capacity != stored.capacity:
            stored = replace(stored, capacity=capacity)
            stores.volumes.update_record(stored)
        return stored, False
    if volume.external_id:
        raise VolumeOpError(
            f'volume "{volume.id}": external_id is set, so the volume exists already; register it with '
            "`driversdk volume register` instead of creating it"
        )
    name = volume.name or volume.id
    caps = [VolumeCapability(c.access_mode, c.attachment_mode, volume.mount_options) for c in volume.capabilities]
    req = volume.requested_topologies
    with controller_for(stores.registry, volume.plugin_id, _RPC.CREATE_DELETE_VOLUME, "creating volumes") as client:
        made = client.create_volume(
            name,
            caps,
            capacity_min=volume.capacity_min,
            capacity_max=volume.capacity_max,
            parameters=volume.parameters,
            secrets=volume.secrets,
            snapshot_id=volume.snapshot_id,
            clone_id=volume.clone_id,
            requisite=req.required,
            preferred=req.preferred,
        )
        created = replace(
            volume,
            name=name,
            external_id=made.volume_id,
            capacity=made.capacity_bytes,
            context={**volume.context, **made.context},
            topologies=[dict(t) for t in made.topologies],
        )
        try:
            stored, _ = stores.volumes.register(created)
        except BaseException:
            client.delete_volume(made.volume_id, volume.secrets)  # nothing is left half made
            raise
    return stored, True


def _live_claims(stores: Stores, volume: Volume) -> list[Claim]:
    return [
        c
        for c in stores.volumes.claims(volume.id, volume.namespace)
        if c.state == TAKEN and not stores.volumes.alloc_terminal(c.alloc_id)
    ]


def expand_volume(stores: Stores, volume: Volume, current: int) -> int:
    """Grow a registered volume to its (new) ``capacity_min`` as Nomad does on an update
    (``volume create`` or ``register`` of a known volume, since Nomad 1.6): ControllerExpandVolume,
    then, when the controller answers node_expansion_required, NodeExpandVolume for each live
    claim where it is staged and published. Returns the capacity to record (``current`` when
    nothing needed growing); raises VolumeOpError for a plugin that cannot expand or a node
    that failed, once the controller's new capacity is recorded."""
    lo, hi = volume.capacity_min, volume.capacity_max
    if hi and hi < current:
        raise VolumeOpError(
            f'volume "{volume.id}" has {current} bytes and capacity_max asks for at most {hi}: volumes do not '
            "shrink; raise capacity_max or leave it out"
        )
    if lo <= current:
        return current
    claims = _live_claims(stores, volume)
    # The capability of the claims using it, when any (the spec's ONLINE expansion); else none.
    capability = (
        VolumeCapability(
            AccessMode.parse(claims[0].access_mode),
            AttachmentMode.parse(claims[0].attachment_mode),
            volume.mount_options,
        )
        if claims
        else None
    )
    what = f'expanding volumes (volume "{volume.id}" has {current} bytes, capacity_min asks for {lo})'
    with controller_for(stores.registry, volume.plugin_id, _RPC.EXPAND_VOLUME, what) as client:
        capacity, node_required = client.controller_expand(volume, lo, hi, capability)
    capacity = capacity or lo
    stores.volumes.update_record(replace(volume, capacity=capacity))
    if node_required:
        failed = [problem for claim in claims if (problem := _node_expand(stores, volume, claim, lo, hi))]
        if failed:
            raise VolumeOpError(
                f'volume "{volume.id}" was expanded to {capacity} bytes by the controller, but not on the node: '
                + "; ".join(failed)
                + "; run `driversdk volume create` with this file again to retry"
            )
    return capacity


def _node_expand(stores: Stores, volume: Volume, claim: Claim, lo: int, hi: int) -> str:
    """NodeExpandVolume for one claim on this node's plugin; returns what failed, or ""."""
    from driversdk.agent.csi.pluginsupervisor import live_instance

    detail = claim.details()
    reg = live_instance(stores.registry, "csi-node", volume.plugin_id)
    if reg is None or not detail.plugin_root:
        return ""  # nothing of it is mounted by a node plugin here
    usage = UsageOptions(
        AccessMode.parse(claim.access_mode), AttachmentMode.parse(claim.attachment_mode), detail.read_only
    )
    capability = usage.capability(volume)
    target = os.path.join(detail.plugin_root, "per-alloc", claim.alloc_id, volume.id, usage.key)
    staging = os.path.join(detail.plugin_root, "staging", volume.namespace, volume.id, usage.key)
    try:
        client = CSIClient(reg.socket_path, plugin=volume.plugin_id)
        try:
            if _NODE_EXPAND not in client.node_capabilities():
                return ""  # the spec leaves growing the file system to the controller then
            client.node_expand(volume, target, staging if detail.requires_staging else "", lo, hi, capability)
        finally:
            client.close()
    except CSIError as err:
        return f"alloc {claim.alloc_id[:8]} (job {claim.job}): {err}"
    return ""


def delete_volume(stores: Stores, volume_id: str, namespace: str, secrets: Mapping[str, str]) -> Volume:
    """DeleteVolume through the controller, then deregister; refused while the volume is claimed."""
    volume = stores.volumes.get(volume_id, namespace)
    if volume is None:
        raise VolumeError(f'volume "{volume_id}" is not registered in namespace "{namespace}"')
    held = stores.volumes.claims(volume_id, namespace)
    if held:
        raise VolumeOpError(claims_refusal(stores.volumes, volume_id, held, "deleting"))
    if not volume.external_id:
        raise VolumeOpError(
            f'volume "{volume_id}" has no external_id, so there is nothing to ask the plugin to delete; forget it '
            f"with `driversdk volume deregister {volume_id}`"
        )
    with controller_for(stores.registry, volume.plugin_id, _RPC.CREATE_DELETE_VOLUME, "deleting volumes") as client:
        # The request's secrets overlay the volume's (Nomad's DeleteVolume).
        client.delete_volume(volume.external_id, {**volume.secrets, **secrets})
    stores.volumes.deregister(volume_id, namespace)
    return volume


# --- snapshots -----------------------------------------------------------------------------------


def create_snapshot(
    stores: Stores,
    volume_id: str,
    namespace: str,
    name: str,
    *,
    secrets: Mapping[str, str],
    parameters: Mapping[str, str],
) -> PluginSnapshot:
    volume = stores.volumes.get(volume_id, namespace)
    if volume is None:
        raise VolumeError(f'volume "{volume_id}" is not registered in namespace "{namespace}"')
    name = name or f"{volume.name or volume.id}-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}"
    with controller_for(stores.registry, volume.plugin_id, _RPC.CREATE_DELETE_SNAPSHOT, "snapshots") as client:
        return client.create_snapshot(
            volume.remote_id, name, parameters=parameters, secrets={**volume.secrets, **secrets}
        )


def delete_snapshot(stores: Stores, plugin_id: str, snapshot_id: str, secrets: Mapping[str, str]) -> bool | None:
    """DeleteSnapshot; returns whether the snapshot existed (None when the plugin cannot list
    snapshots to tell). The spec has a plugin answer OK for a snapshot it does not have, so an
    unknown id is looked up first and refused with a sentence, nothing deleted."""
    with controller_for(stores.registry, plugin_id, _RPC.CREATE_DELETE_SNAPSHOT, "snapshots") as client:
        existed: bool | None = None
        if _RPC.LIST_SNAPSHOTS in client.controller_capabilities():
            existed = bool(client.list_snapshots(snapshot_id=snapshot_id, secrets=secrets).entries)
            if not existed:
                raise VolumeOpError(
                    f'CSI plugin "{plugin_id}" has no snapshot "{snapshot_id}", so nothing was deleted; list its '
                    f"snapshots with `driversdk volume snapshot list -plugin {plugin_id}`"
                )
        client.delete_snapshot(snapshot_id, secrets)
    return existed


@dataclass
class SnapshotListing:
    rows: list[dict[str, Any]]
    not_asked: dict[str, str]  # plugin id -> why its snapshots could not be listed


def list_snapshots(stores: Stores, plugin_id: str | None, secrets: Mapping[str, str]) -> SnapshotListing:
    """Every snapshot of one plugin, or of each registered controller; a plugin that cannot
    list them (no LIST_SNAPSHOTS, no controller) is named in ``not_asked`` with why."""
    plugins = [plugin_id] if plugin_id else sorted(stores.registry.plugins("csi-controller"))
    by_external = {v.remote_id: v.id for v in stores.volumes.list()}
    rows: list[dict[str, Any]] = []
    not_asked: dict[str, str] = {}
    for plugin in plugins:
        try:
            with controller_for(stores.registry, plugin, _RPC.LIST_SNAPSHOTS, "listing snapshots") as client:
                token = ""
                while True:
                    page = client.list_snapshots(100, token, secrets=secrets)
                    for snap in page.entries:
                        rows.append(
                            {
                                "plugin_id": plugin,
                                "snapshot_id": snap.snapshot_id,
                                "external_volume_id": snap.source_volume_id,
                                "volume_id": by_external.get(snap.source_volume_id, ""),
                                "size_bytes": snap.size_bytes,
                                "created": snap.created.isoformat(),
                                "ready": snap.ready_to_use,
                            }
                        )
                    if not page.next_token:
                        break
                    token = page.next_token
        except VolumeOpError as err:
            if plugin_id:
                raise  # asked for by name: say why not
            not_asked[plugin] = str(err)
    return SnapshotListing(rows, not_asked)


# --- status ---------------------------------------------------------------------------------------


def plugin_health(stores: Stores, plugin_id: str) -> dict[str, Any]:
    """The plugin's node and controller instances, probed now, and this node's topology."""
    facts: dict[str, Any] = {"node": "not registered", "controller": "not registered", "node_topology": None}
    requires_controller = False
    for kind, key in (("csi-node", "node"), ("csi-controller", "controller")):
        reg = stores.registry.current(kind, plugin_id)
        if reg is None:
            continue
        try:
            client = CSIClient(reg.socket_path, plugin=plugin_id)
        except CSIError as err:
            facts[key] = f"unhealthy: {err}"
            continue
        try:
            found = fingerprint(client, plugin_id, node_role=kind == "csi-node")
        finally:
            client.close()
        facts[key] = "healthy" if found.healthy else f"unhealthy: {found.health_description}"
        requires_controller = requires_controller or found.requires_controller
        if kind == "csi-node" and found.node is not None:
            facts["node_topology"] = found.node.topology
    facts["requires_controller"] = requires_controller
    return facts


def volume_status(stores: Stores, volume: Volume, health: dict[str, Any]) -> dict[str, Any]:
    """Schedulable (Nomad's rule: a healthy node plugin, and a healthy controller when the plugin
    needs one; here also reachable from this node's topology) and every claim with its state."""
    schedulable = health["node"] == "healthy" and (
        not health["requires_controller"] or health["controller"] == "healthy"
    )
    reachable = health["node_topology"] is None or topology_reachable(volume.topologies, health["node_topology"])
    claims = []
    for c in stores.volumes.claims(volume.id, volume.namespace):
        terminal = c.state == "taken" and stores.volumes.alloc_terminal(c.alloc_id)
        state = (
            "past (its allocation is terminal), waiting for the volume watcher" if terminal else (claim_state_text(c))
        )
        claims.append(
            {
                "alloc_id": c.alloc_id,
                "job": c.job,
                "mode": c.mode,
                "access_mode": c.access_mode,
                "state": c.state if not terminal else "past",
                "status": state,
                "last_error": c.last_error,
            }
        )
    return {
        "schedulable": schedulable and reachable,
        "plugin_node": health["node"],
        "plugin_controller": health["controller"],
        "reachable_from_this_node": reachable,
        "claims": claims,
    }


def topology_problem(volume: Volume, node_topology: dict[str, str]) -> str | None:
    """Why a volume cannot be used from this node's plugin topology (validate), or None."""
    if topology_reachable(volume.topologies, node_topology):
        return None
    wanted = "; ".join(", ".join(f"{k}={v}" for k, v in sorted(t.items())) for t in volume.topologies)
    here = ", ".join(f"{k}={v}" for k, v in sorted(node_topology.items())) or "none"
    return (
        f'CSI volume "{volume.id}" is only accessible from topology {wanted}, and this node\'s plugin topology is '
        f"{here}; use a volume reachable from this node"
    )
