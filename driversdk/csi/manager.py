"""The node volume manager: stage once per volume and usage, publish per allocation, tear down
idempotently, and remember enough in SQLite to finish a teardown after a restart.

Paths follow Nomad's layout. ``host_root`` is ``<state>/csi/<type>/<plugin id>`` on the host;
the plugin sees the same tree at ``plugin_root`` (its ``stage_publish_base_dir``):

    staging  <root>/staging/<namespace>/<volume id>/<usage>
    publish  <root>/per-alloc/<alloc id>/<volume id>/<usage>
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace

from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.csi.model import AccessMode, AttachmentMode, MountOptions, Secrets, Volume, VolumeCapability
from driversdk.csi.state import StateStore, UsageRow
from driversdk.mountinfo import is_mount_point, read_mountinfo
from driversdk.paths import resolve_under
from driversdk.pb import csi_pb2

_PUBLISH = csi_pb2.ControllerServiceCapability.RPC.PUBLISH_UNPUBLISH_VOLUME


@dataclass(frozen=True)
class UsageOptions:
    """How one allocation uses a volume; together they form the ``<usage>`` path element."""

    access_mode: AccessMode
    attachment_mode: AttachmentMode
    read_only: bool = False
    mount_options: MountOptions | None = None

    @property
    def key(self) -> str:
        return VolumeCapability(self.access_mode, self.attachment_mode).usage(self.read_only)

    def capability(self, volume: Volume) -> VolumeCapability:
        base = volume.mount_options or MountOptions()
        return VolumeCapability(self.access_mode, self.attachment_mode, base.merged(self.mount_options))


@dataclass(frozen=True)
class MountInfo:
    source: str
    """The published target on the host: what a task mounts."""


def _volume_json(volume: Volume, usage: UsageOptions) -> str:
    return json.dumps(
        {
            "id": volume.id,
            "plugin_id": volume.plugin_id,
            "namespace": volume.namespace,
            "external_id": volume.external_id,
            "access_mode": usage.access_mode.value,
            "attachment_mode": usage.attachment_mode.value,
            "read_only": usage.read_only,
        },
        sort_keys=True,
    )


class NodeVolumeManager:
    def __init__(
        self,
        client: CSIClient,
        *,
        plugin_id: str,
        host_root: str,
        store: StateStore,
        requires_staging: bool,
        plugin_root: str | None = None,
    ) -> None:
        self.client = client
        self.plugin_id = plugin_id
        self.host_root = host_root
        self.plugin_root = plugin_root or host_root
        self.store = store
        self.requires_staging = requires_staging
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, volume: Volume) -> threading.Lock:
        # One operation at a time per (namespace, volume), as the spec asks of a CO.
        with self._guard:
            return self._locks.setdefault((volume.namespace, volume.id), threading.Lock())

    def staging_paths(self, volume: Volume, usage: UsageOptions) -> tuple[str, str]:
        return self._paths(f'the staging path of volume "{volume.id}"', "staging", volume.namespace, volume.id,
                           usage.key)  # fmt: skip

    def publish_paths(self, volume: Volume, alloc_id: str, usage: UsageOptions) -> tuple[str, str]:
        return self._paths(f'the publish path of volume "{volume.id}"', "per-alloc", alloc_id, volume.id, usage.key)

    def _paths(self, what: str, *parts: str) -> tuple[str, str]:
        """The host path and the plugin's view of it. Names come from volume files and the plugin's
        tree is writable by the plugin, so the host side is resolved and must stay under the root."""
        host = resolve_under(self.host_root, *parts, what=what)
        rel = os.path.relpath(host, os.path.realpath(self.host_root))
        return host, os.path.join(self.plugin_root, rel)

    def _usage_row(self, volume: Volume, alloc_id: str, usage: UsageOptions, phase: str) -> UsageRow:
        return UsageRow(
            self.plugin_id, volume.namespace, volume.id, usage.key, alloc_id, phase, _volume_json(volume, usage)
        )

    # --- mount ---------------------------------------------------------------------------------

    def mount(
        self,
        volume: Volume,
        alloc_id: str,
        usage: UsageOptions,
        publish_context: Mapping[str, str] | None = None,
    ) -> MountInfo:
        context = dict(publish_context or {})
        capability = usage.capability(volume)
        with self._lock(volume):
            row = self._usage_row(volume, alloc_id, usage, "mounting")
            self.store.set_usage(row)
            staged_here = False
            host_stage, plugin_stage = self.staging_paths(volume, usage)
            try:
                if self.requires_staging and not self.store.staged(
                    self.plugin_id, volume.namespace, volume.id, usage.key
                ):
                    os.makedirs(host_stage, mode=0o700, exist_ok=True)
                    self.client.node_stage(volume, plugin_stage, capability, context)
                    self.store.set_staged(self.plugin_id, volume.namespace, volume.id, usage.key, True)
                    staged_here = True
                host_target, plugin_target = self.publish_paths(volume, alloc_id, usage)
                os.makedirs(os.path.dirname(host_target), mode=0o700, exist_ok=True)
                if not is_mount_point(host_target):
                    self.client.node_publish(
                        volume,
                        plugin_stage if self.requires_staging else "",
                        plugin_target,
                        capability,
                        usage.read_only,
                        context,
                    )
            except BaseException:
                # Leave nothing behind: this alloc's use is gone, and a stage made for it alone too.
                left = self.store.drop_usage(self.plugin_id, volume.namespace, volume.id, usage.key, alloc_id)
                if staged_here and left == 0:
                    try:
                        self._unstage(volume, usage)
                    except CSIError:
                        pass  # still recorded as staged: the next mount reuses it, teardown retries it
                self._remove_empty_dirs(volume, alloc_id, usage)
                raise
            self.store.set_usage(replace(row, phase="mounted"))
            return MountInfo(source=host_target)

    # --- unmount -------------------------------------------------------------------------------

    def unmount(self, volume: Volume, alloc_id: str, usage: UsageOptions) -> None:
        """Unpublish (and unstage when last); succeeds when the mounts are already gone."""
        with self._lock(volume):
            row = self._usage_row(volume, alloc_id, usage, "unmounting")
            # Persist the intent first: a restart in the middle finishes it (resume_teardowns).
            self.store.set_usage(row)
            host_target, plugin_target = self.publish_paths(volume, alloc_id, usage)
            if os.path.exists(host_target) or is_mount_point(host_target):
                try:
                    self.client.node_unpublish(volume, plugin_target)
                except CSIError:
                    if is_mount_point(host_target):
                        raise
                if is_mount_point(host_target):
                    # OK or NotFound ("no longer known") only counts once the target is no mount.
                    raise CSIError(
                        f'volume "{volume.id}": CSI plugin "{self.plugin_id}" answered NodeUnpublishVolume but '
                        f"{host_target} is still mounted; check the plugin's logs, or unmount it by hand "
                        f"(umount {host_target})",
                        code="OK",
                        call="NodeUnpublishVolume",
                        volume=volume.id,
                    )
                # Some plugins leave the target behind; the CO owns cleaning the tree.
                if os.path.isdir(host_target) and not is_mount_point(host_target):
                    os.rmdir(host_target)
            left = self.store.drop_usage(self.plugin_id, volume.namespace, volume.id, usage.key, alloc_id)
            if self.requires_staging and left == 0:
                self._unstage(volume, usage)
            self._remove_empty_dirs(volume, alloc_id, usage)

    def _unstage(self, volume: Volume, usage: UsageOptions) -> None:
        host_stage, plugin_stage = self.staging_paths(volume, usage)
        self.client.node_unstage(volume, plugin_stage)
        if is_mount_point(host_stage):
            raise CSIError(
                f'volume "{volume.id}": CSI plugin "{self.plugin_id}" answered NodeUnstageVolume but {host_stage} is '
                f"still mounted; check the plugin's logs, or unmount it by hand (umount {host_stage})",
                code="OK",
                call="NodeUnstageVolume",
                volume=volume.id,
            )
        self.store.set_staged(self.plugin_id, volume.namespace, volume.id, usage.key, False)
        if os.path.isdir(host_stage) and not is_mount_point(host_stage):
            os.rmdir(host_stage)

    def _remove_empty_dirs(self, volume: Volume, alloc_id: str, usage: UsageOptions) -> None:
        host_target, _ = self.publish_paths(volume, alloc_id, usage)
        host_stage, _ = self.staging_paths(volume, usage)
        # One read of mountinfo for the whole walk up.
        entries = read_mountinfo()
        for leaf in (host_target, host_stage):
            path = leaf
            while path.startswith(self.host_root.rstrip("/") + "/"):
                try:
                    if os.path.isdir(path) and not is_mount_point(path, entries):
                        os.rmdir(path)
                except OSError:
                    break  # not empty: something else still lives there
                path = os.path.dirname(path)

    def resume_teardowns(self) -> list[str]:
        """Finish every unmount a previous process started; returns the allocs finished."""
        finished = []
        for row in self.store.usages(self.plugin_id, phase="unmounting"):
            data = json.loads(row.volume_json)
            volume = Volume(
                id=data["id"],
                plugin_id=data["plugin_id"],
                namespace=data["namespace"],
                external_id=data["external_id"],
                secrets=Secrets(),
            )
            usage = UsageOptions(
                AccessMode.parse(data["access_mode"]), AttachmentMode.parse(data["attachment_mode"]), data["read_only"]
            )
            self.unmount(volume, row.alloc_id, usage)
            finished.append(row.alloc_id)
        return finished


def forget_node_use(
    store: StateStore,
    *,
    plugin_id: str,
    host_root: str,
    volume: Volume,
    alloc_id: str,
    usage: UsageOptions,
    requires_staging: bool,
) -> list[str]:
    """Drop one allocation's node-side use of a volume without the plugin (it is gone), which is
    only safe when nothing of it is mounted any more; raises CSIError while something is.

    Returns what could not be undone through the plugin, as phrases for the operator."""
    target = resolve_under(host_root, "per-alloc", alloc_id, volume.id, usage.key, what="the publish path")
    stage = resolve_under(host_root, "staging", volume.namespace, volume.id, usage.key, what="the staging path")
    entries = read_mountinfo()
    if is_mount_point(target, entries):
        raise CSIError(
            f'volume "{volume.id}": its publish target {target} is still mounted and no instance of CSI plugin '
            f'"{plugin_id}" is registered to unmount it; start the plugin again, or unmount it by hand '
            f"(umount {target})",
            code="UNAVAILABLE",
            call="NodeUnpublishVolume",
            volume=volume.id,
        )
    left = store.drop_usage(plugin_id, volume.namespace, volume.id, usage.key, alloc_id)
    not_undone = [f"NodeUnpublishVolume of {target} (the plugin was not asked; the target is no mount)"]
    staged = store.staged(plugin_id, volume.namespace, volume.id, usage.key)
    if requires_staging and left == 0 and staged:
        if is_mount_point(stage, entries):
            raise CSIError(
                f'volume "{volume.id}": its staging path {stage} is still mounted and no instance of CSI plugin '
                f'"{plugin_id}" is registered to unstage it; start the plugin again, or unmount it by hand '
                f"(umount {stage})",
                code="UNAVAILABLE",
                call="NodeUnstageVolume",
                volume=volume.id,
            )
        store.set_staged(plugin_id, volume.namespace, volume.id, usage.key, False)
        not_undone.append(f"NodeUnstageVolume of {stage} (the plugin was not asked; the path is no mount)")
    for leaf in (target, stage if left == 0 else ""):
        path = leaf
        while path and path.startswith(host_root.rstrip("/") + "/"):
            try:
                if os.path.isdir(path) and not is_mount_point(path, entries):
                    os.rmdir(path)
            except OSError:
                break
            path = os.path.dirname(path)
    return not_undone


def controller_publish(controller: CSIClient, volume: Volume, csi_node_id: str, usage: UsageOptions) -> dict[str, str]:
    """ControllerPublishVolume when the plugin needs it, with the plugin's CSI node id (never ours)."""
    if _PUBLISH not in controller.controller_capabilities():
        return {}
    capability = VolumeCapability(usage.access_mode, usage.attachment_mode, volume.mount_options)
    # Nomad sends readonly for read claims even without PUBLISH_READONLY.
    return controller.controller_publish(volume, csi_node_id, capability, readonly=usage.read_only)


def controller_unpublish(controller: CSIClient, volume: Volume, csi_node_id: str) -> None:
    if _PUBLISH in controller.controller_capabilities():
        controller.controller_unpublish(volume, csi_node_id)
