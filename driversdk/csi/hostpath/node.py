"""The hostpath plugin's node service: staging and publishing are bind mounts.

The mount table is the truth about what is set up (unless told to trust its records alone, a
fault mode: see HostPathState.trust_records); the store remembers with which capability
and readonly flag, so a repeated call can be told apart from an incompatible one. A record
whose path is no longer a mount (removed behind the plugin's back) is dropped when seen.
"""

from __future__ import annotations

import os

import grpc

from driversdk.csi.hostpath.plugin import (
    MAX_VOLUMES_PER_NODE,
    MULTI_NODE_MODES,
    TOPOLOGY_KEY,
    HostPathState,
    capability_key,
    capability_of,
    check_capability,
    check_range,
    fail,
    fs_sizes,
    require_path,
    run_command,
    tree_bytes,
)
from driversdk.csi.hostpath.rpc import rpc
from driversdk.csi.hostpath.store import NodeMount, State
from driversdk.mountinfo import MountEntry, is_mount_point, read_mountinfo
from driversdk.pb import csi_pb2, csi_pb2_grpc

_MODE_NAME = csi_pb2.VolumeCapability.AccessMode.Mode.Name
_NODE = csi_pb2.NodeServiceCapability.RPC


def _mounted(path: str, entries: list[MountEntry] | None = None) -> bool:
    return os.path.exists(path) and is_mount_point(path, entries)


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, state: HostPathState) -> None:
        self.state = state

    def _missing_volume(self, volume_id: str, context: grpc.ServicerContext) -> None:
        if not self.state.volume_exists(volume_id):
            fail(context, grpc.StatusCode.NOT_FOUND, f"volume {volume_id} does not exist")

    def _at_path(self, st: State, volume_id: str, path: str) -> tuple[NodeMount | None, bool]:
        """This volume's record at a staging or target path, and whether the path is a mount."""
        mount = st.published.get(path) or st.staged.get(path)
        if mount is not None and mount.volume_id != volume_id:
            mount = None
        return mount, _mounted(path)

    def _undo(
        self, records: dict[str, NodeMount], volume_id: str, path: str, context: grpc.ServicerContext, *, created: bool
    ) -> None:
        """Unmount ``volume_id`` from ``path`` (a staging or target path) and forget its record;
        ``created``: the plugin made the directory, so it removes it when empty. NOT_FOUND only
        when nothing of the volume was there and the volume does not exist either."""
        record = records.get(path)
        if record is not None and record.volume_id != volume_id:
            # Another volume is there: this one is not, which is what was asked.
            self._missing_volume(volume_id, context)
            return
        if record is None and self.state.trust_records:
            self._missing_volume(volume_id, context)
            return  # no record: "nothing to do", left mounted
        mounted = _mounted(path)
        if mounted:
            run_command("umount", path)
        if created and os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            os.rmdir(path)
        records.pop(path, None)
        if record is None and not mounted:
            self._missing_volume(volume_id, context)

    def _found_at(
        self, st: State, volume_id: str, volume_path: str, staging_path: str, context: grpc.ServicerContext
    ) -> bool:
        """NOT_FOUND unless the volume exists and is staged or published at ``volume_path``;
        returns whether that path is a mount. The volume is looked up before the paths are
        judged, so an unknown volume is NOT_FOUND whatever path comes with it (csi-sanity sends
        "some/path"), and a relative path is one the volume is not at."""
        self._missing_volume(volume_id, context)
        require_path(context, "staging_target_path", staging_path, required=False)
        if not os.path.isabs(volume_path):
            fail(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"volume {volume_id} is not staged or published at {volume_path!r}: not an absolute path",
            )
        record, mounted = self._at_path(st, volume_id, volume_path)
        if record is None and not mounted:
            fail(context, grpc.StatusCode.NOT_FOUND, f"volume {volume_id} is not staged or published at {volume_path}")
        return mounted

    @rpc()
    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        return csi_pb2.NodeGetCapabilitiesResponse(
            capabilities=[csi_pb2.NodeServiceCapability(rpc=_NODE(type=t)) for t in self.state.advertised.node]
        )

    @rpc()
    def NodeGetInfo(
        self, request: csi_pb2.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(
            node_id=self.state.node_id,
            max_volumes_per_node=MAX_VOLUMES_PER_NODE,
            accessible_topology=csi_pb2.Topology(segments={TOPOLOGY_KEY: self.state.node_id}),
        )

    @rpc(required=("volume_id",), paths=("staging_target_path",), capability="volume_capability")
    def NodeStageVolume(
        self, request: csi_pb2.NodeStageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeStageVolumeResponse:
        target = request.staging_target_path
        key = capability_key(request.volume_capability)
        with self.state.store.transaction() as st:
            self._missing_volume(request.volume_id, context)
            mounted = _mounted(target)
            record = st.staged.get(target)
            if record is not None and not mounted:
                del st.staged[target]  # unmounted behind our back: stale
                record = None
            if record is not None:
                if record.volume_id != request.volume_id:
                    fail(
                        context,
                        grpc.StatusCode.ALREADY_EXISTS,
                        f"staging path {target} already holds volume {record.volume_id}",
                    )
                if record.capability != key:
                    fail(
                        context,
                        grpc.StatusCode.ALREADY_EXISTS,
                        f"volume {request.volume_id} is already staged at {target} with another capability",
                    )
                return csi_pb2.NodeStageVolumeResponse()
            if not os.path.isdir(target):
                fail(context, grpc.StatusCode.FAILED_PRECONDITION, f"staging path {target} does not exist")
            if not mounted:
                run_command("mount", "--bind", self.state.volume_dir(request.volume_id), target)
            st.staged[target] = NodeMount(volume_id=request.volume_id, capability=key)
        return csi_pb2.NodeStageVolumeResponse()

    @rpc(required=("volume_id",), paths=("staging_target_path",))
    def NodeUnstageVolume(
        self, request: csi_pb2.NodeUnstageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnstageVolumeResponse:
        with self.state.store.transaction() as st:
            self._undo(st.staged, request.volume_id, request.staging_target_path, context, created=False)
        return csi_pb2.NodeUnstageVolumeResponse()

    @rpc(required=("volume_id",), paths=("target_path",), capability="volume_capability")
    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        require_path(context, "staging_target_path", request.staging_target_path, required=False)
        if not request.staging_target_path:
            fail(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "staging_target_path is required: this plugin stages volumes (STAGE_UNSTAGE_VOLUME)",
            )
        target, staging = request.target_path, request.staging_target_path
        key = capability_key(request.volume_capability)
        readonly = request.readonly or request.publish_context.get("readonly") == "true"
        mode = request.volume_capability.access_mode.mode
        with self.state.store.transaction() as st:
            self._missing_volume(request.volume_id, context)
            entries = read_mountinfo()
            staged = st.staged.get(staging)
            if staged is None and self.state.trust_records:
                fail(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"volume {request.volume_id} must be staged at {staging} before publishing",
                )
            if (staged is not None and staged.volume_id != request.volume_id) or not _mounted(staging, entries):
                fail(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"volume {request.volume_id} is not staged at {staging}: call NodeStageVolume first",
                )
            for path in [p for p in st.published if not _mounted(p, entries)]:
                del st.published[path]  # unmounted behind our back: stale
            mounted = _mounted(target, entries)
            record = st.published.get(target)
            if record is not None:
                if (record.volume_id, record.capability, record.readonly) != (request.volume_id, key, readonly):
                    fail(
                        context,
                        grpc.StatusCode.ALREADY_EXISTS,
                        f"target path {target} already holds volume {record.volume_id} with another capability "
                        "or readonly flag",
                    )
                return csi_pb2.NodePublishVolumeResponse()
            others = sorted(p for p, m in st.published.items() if m.volume_id == request.volume_id)
            modes = [mode] + [capability_of(st.published[p].capability).access_mode.mode for p in others]
            if others and any(m not in MULTI_NODE_MODES for m in modes):
                fail(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"volume {request.volume_id} is already published at {others[0]} on this node and access "
                    f"mode {_MODE_NAME(mode)} allows one target",
                )
            if not os.path.isdir(os.path.dirname(target)):
                fail(context, grpc.StatusCode.FAILED_PRECONDITION, f"parent of target path {target} does not exist")
            os.makedirs(target, exist_ok=True)  # the spec makes creating the target the plugin's job
            if not mounted:
                run_command("mount", "--bind", staging, target)
                if readonly:
                    run_command("mount", "-o", "remount,bind,ro", target)
            st.published[target] = NodeMount(
                volume_id=request.volume_id, capability=key, readonly=readonly, staging_path=staging
            )
        return csi_pb2.NodePublishVolumeResponse()

    @rpc(required=("volume_id",), paths=("target_path",))
    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        with self.state.store.transaction() as st:
            self._undo(st.published, request.volume_id, request.target_path, context, created=True)
        return csi_pb2.NodeUnpublishVolumeResponse()

    @rpc(required=("volume_id", "volume_path"))
    def NodeGetVolumeStats(
        self, request: csi_pb2.NodeGetVolumeStatsRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetVolumeStatsResponse:
        with self.state.store.transaction() as st:
            mounted = self._found_at(st, request.volume_id, request.volume_path, request.staging_target_path, context)
            volume = st.volumes.get(request.volume_id)
            capacity = volume.capacity if volume is not None else 0
        source = self.state.volume_dir(request.volume_id)
        fs_total, fs_free = fs_sizes(source)
        used = tree_bytes(source)
        total = capacity or fs_total
        st_inodes = os.statvfs(source)
        usage = [
            csi_pb2.VolumeUsage(
                unit=csi_pb2.VolumeUsage.BYTES, total=total, used=used, available=max(0, min(total - used, fs_free))
            ),
            csi_pb2.VolumeUsage(
                unit=csi_pb2.VolumeUsage.INODES,
                total=st_inodes.f_files,
                used=st_inodes.f_files - st_inodes.f_ffree,
                available=st_inodes.f_favail,
            ),
        ]
        if _NODE.VOLUME_CONDITION not in self.state.advertised.node:
            return csi_pb2.NodeGetVolumeStatsResponse(usage=usage)
        if mounted:
            condition = csi_pb2.VolumeCondition(abnormal=False, message="volume is mounted")
        else:
            condition = csi_pb2.VolumeCondition(
                abnormal=True, message=f"{request.volume_path} is no longer a mount of volume {request.volume_id}"
            )
        return csi_pb2.NodeGetVolumeStatsResponse(usage=usage, volume_condition=condition)

    @rpc(required=("volume_id", "volume_path"))
    def NodeExpandVolume(
        self, request: csi_pb2.NodeExpandVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeExpandVolumeResponse:
        if request.HasField("capacity_range"):
            check_range(context, request.capacity_range)
        if request.HasField("volume_capability"):
            check_capability(context, request.volume_capability, "volume_capability")
        with self.state.store.transaction() as st:
            self._found_at(st, request.volume_id, request.volume_path, request.staging_target_path, context)
            volume = st.volumes.get(request.volume_id)
            capacity = volume.capacity if volume is not None else 0
        wanted = request.capacity_range.required_bytes
        if wanted > capacity:
            fail(
                context,
                grpc.StatusCode.OUT_OF_RANGE,
                f"volume {request.volume_id} has {capacity} bytes; expand it with ControllerExpandVolume "
                f"before asking the node for {wanted}",
            )
        # A bind mount of a directory has no file system of its own to grow.
        return csi_pb2.NodeExpandVolumeResponse(capacity_bytes=capacity)
