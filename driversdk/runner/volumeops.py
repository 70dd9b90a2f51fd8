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

from driversdk.csi.client import CSIClient, PluginSnapshot
from driversdk.csi.errors import CSIError
from driversdk.csi.fingerprint import fingerprint
from driversdk.csi.model import Volume, VolumeCapability, topology_reachable
from driversdk.csi.registry import PluginRegistry
from driversdk.csi.state import StateStore
from driversdk.errors import DriverSDKError
from driversdk.pb import csi_pb2
from driversdk.runner.volumes import VolumeError, VolumeStore, claim_state_text

_RPC = csi_pb2.ControllerServiceCapability.RPC


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


# --- create / delete ---------------------------------------------------------------------------


def create_volume(stores: Stores, volume: Volume) -> tuple[Volume, bool]:
    """CreateVolume through the controller and register the result; an existing registration
    is updated instead (Nomad reconciles a create of a known volume as an update)."""
    existing = stores.volumes.get(volume.id, volume.namespace)
    if existing is not None:
        stored, _ = stores.volumes.register(volume)
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


def delete_volume(stores: Stores, volume_id: str, namespace: str, secrets: Mapping[str, str]) -> Volume:
    """DeleteVolume through the controller, then deregister; refused while the volume is claimed."""
    volume = stores.volumes.get(volume_id, namespace)
    if volume is None:
        raise VolumeError(f'volume "{volume_id}" is not registered in namespace "{namespace}"')
    held = stores.volumes.claims(volume_id, namespace)
    if held:
        users = ", ".join(f"alloc {c.alloc_id[:8]} of job {c.job} ({claim_state_text(c)})" for c in held)
        raise VolumeOpError(
            f'volume "{volume_id}" is claimed by {users}; stop those jobs (a past claim is released by the volume '
            f"watcher, or by `driversdk volume detach {volume_id}`) before deleting it"
        )
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


def delete_snapshot(stores: Stores, plugin_id: str, snapshot_id: str, secrets: Mapping[str, str]) -> None:
    with controller_for(stores.registry, plugin_id, _RPC.CREATE_DELETE_SNAPSHOT, "snapshots") as client:
        client.delete_snapshot(snapshot_id, secrets)


def list_snapshots(stores: Stores, plugin_id: str | None, secrets: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every snapshot of one plugin (or of each registered controller that can list them)."""
    plugins = [plugin_id] if plugin_id else sorted(stores.registry.plugins("csi-controller"))
    by_external = {v.remote_id: v.id for v in stores.volumes.list()}
    rows: list[dict[str, Any]] = []
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
        except VolumeOpError:
            if plugin_id:
                raise  # asked for by name: say why not
    return rows


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
