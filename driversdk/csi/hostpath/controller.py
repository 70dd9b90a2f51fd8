"""The hostpath plugin's controller service: volumes are directories, snapshots are copies of them.

Capacity is bookkeeping (a directory has no size of its own): a volume has the capacity it was
created or expanded to, never more than the file system holding the root.
"""

from __future__ import annotations

import errno
import os
import shutil
import time

import grpc
from google.protobuf import timestamp_pb2, wrappers_pb2

from driversdk.csi.hostpath.plugin import (
    MAX_VOLUMES_PER_NODE,
    MULTI_NODE_MODES,
    NAME,
    HostPathState,
    capability_key,
    capability_of,
    capability_problem,
    check_capability,
    check_max_entries,
    check_name,
    check_range,
    derive_id,
    fail,
    fs_sizes,
    invalid,
    page,
    tree_bytes,
)
from driversdk.csi.hostpath.rpc import rpc
from driversdk.csi.hostpath.store import Publication, SnapshotRecord, State, VolumeRecord
from driversdk.mountinfo import is_mount_point, read_mountinfo
from driversdk.pb import csi_pb2, csi_pb2_grpc

_MODE_NAME = csi_pb2.VolumeCapability.AccessMode.Mode.Name
_RPC = csi_pb2.ControllerServiceCapability.RPC
VOLUME_CONTEXT = {"hostpath": "1"}


def _copy_tree(source: str, target: str, partial: str) -> None:
    """Copy a directory tree (symlinks as links) to ``target``, visible only once whole.

    The copy is made in the root's ``partial`` directory, on the same file system, and renamed.
    """
    tmp = os.path.join(partial, os.path.basename(os.path.dirname(target)) + "-" + os.path.basename(target))
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(source, tmp, symlinks=True)
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _topology_set(t: csi_pb2.Topology) -> frozenset[tuple[str, str]]:
    return frozenset(t.segments.items())


class Controller(csi_pb2_grpc.ControllerServicer):
    def __init__(self, state: HostPathState) -> None:
        self.state = state

    # --- helpers -------------------------------------------------------------------------------

    def _record(self, st: State, volume_id: str) -> VolumeRecord:
        """The volume's record; a pre-provisioned directory gets one named after it."""
        rec = st.volumes.get(volume_id)
        if rec is None:
            rec = st.volumes[volume_id] = VolumeRecord(volume_id=volume_id, name=volume_id)
        return rec

    def _by_name(self, st: State, name: str) -> VolumeRecord | None:
        for rec in st.volumes.values():
            if rec.name == name and self.state.volume_exists(rec.volume_id):
                return rec
        if name not in st.volumes and self.state.volume_exists(name):
            return self._record(st, name)
        return None

    def _volume(self, rec: VolumeRecord) -> csi_pb2.Volume:
        source = csi_pb2.VolumeContentSource()
        if rec.source_snapshot:
            source.snapshot.snapshot_id = rec.source_snapshot
        elif rec.source_volume:
            source.volume.volume_id = rec.source_volume
        volume = csi_pb2.Volume(
            capacity_bytes=rec.capacity,
            volume_id=rec.volume_id,
            volume_context=VOLUME_CONTEXT,
            accessible_topology=self.state.topologies(),
        )
        if rec.source_snapshot or rec.source_volume:
            volume.content_source.CopyFrom(source)
        return volume

    def _snapshot(self, rec: SnapshotRecord) -> csi_pb2.Snapshot:
        created = timestamp_pb2.Timestamp(seconds=rec.created_ns // 10**9, nanos=rec.created_ns % 10**9)
        return csi_pb2.Snapshot(
            size_bytes=rec.size,
            snapshot_id=rec.snapshot_id,
            source_volume_id=rec.source_volume_id,
            creation_time=created,
            ready_to_use=True,
        )

    def _reachable(self, requirement: csi_pb2.TopologyRequirement, context: grpc.ServicerContext) -> None:
        """RESOURCE_EXHAUSTED unless a volume under this root satisfies the requisite topologies.

        A volume here is reachable from every node sharing the root (x topologies); the spec's
        rule for n requisite topologies then reduces to "one set contains the other".
        """
        ours = {_topology_set(t) for t in self.state.topologies()}
        requisite = {_topology_set(t) for t in requirement.requisite}
        preferred = {_topology_set(t) for t in requirement.preferred}
        if requisite and not preferred <= requisite:
            invalid(context, "accessibility_requirements.preferred must be a subset of requisite")
        if requisite and not (ours <= requisite or requisite <= ours):
            nodes = ", ".join(sorted(self.state.nodes))
            fail(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"unable to provision in the requisite topology: volumes under this root are reachable from "
                f"nodes {nodes} ({len(ours)} topologies)",
            )

    def _refuse_beyond_file_system(self, rng: csi_pb2.CapacityRange, context: grpc.ServicerContext) -> None:
        """OUT_OF_RANGE when ``rng`` requires more bytes than the file system holding the volumes has."""
        total, _available = fs_sizes(self.state.volumes)
        if rng.required_bytes > total:
            fail(
                context,
                grpc.StatusCode.OUT_OF_RANGE,
                f"capacity_range.required_bytes {rng.required_bytes} is larger than the file system holding "
                f"the plugin root ({total} bytes)",
            )

    def _in_use(self, st: State, volume_id: str) -> str:
        rec = st.volumes.get(volume_id)
        if rec is not None and rec.published:
            return f"volume {volume_id} is published to node(s) {', '.join(sorted(rec.published))}"
        entries = read_mountinfo()
        for path, mount in (*st.staged.items(), *st.published.items()):
            if mount.volume_id == volume_id and is_mount_point(path, entries):
                return f"volume {volume_id} is mounted at {path}"
        return ""

    # --- capabilities --------------------------------------------------------------------------

    @rpc()
    def ControllerGetCapabilities(
        self, request: csi_pb2.ControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerGetCapabilitiesResponse:
        caps = [csi_pb2.ControllerServiceCapability(rpc=_RPC(type=t)) for t in self.state.advertised.controller]
        return csi_pb2.ControllerGetCapabilitiesResponse(capabilities=caps)

    # --- volumes -------------------------------------------------------------------------------

    @rpc()
    def CreateVolume(
        self, request: csi_pb2.CreateVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.CreateVolumeResponse:
        check_name(context, request.name)
        if not request.volume_capabilities:
            invalid(context, "volume_capabilities are required")
        for i, cap in enumerate(request.volume_capabilities):
            check_capability(context, cap, f"volume_capabilities[{i}]")
        rng = request.capacity_range
        if request.HasField("capacity_range"):
            check_range(context, rng)
        if request.mutable_parameters:
            invalid(context, "mutable_parameters need the MODIFY_VOLUME capability, which this plugin lacks")
        source = request.volume_content_source
        kind = source.WhichOneof("type") if request.HasField("volume_content_source") else None
        if request.HasField("volume_content_source") and kind is None:
            invalid(context, "volume_content_source needs a snapshot or a volume")
        if kind == "snapshot" and not source.snapshot.snapshot_id:
            invalid(context, "volume_content_source.snapshot.snapshot_id is required")
        if kind == "volume" and not source.volume.volume_id:
            invalid(context, "volume_content_source.volume.volume_id is required")
        # Nomad sends an empty requirement when the job has none: that means "anywhere".
        self._reachable(request.accessibility_requirements, context)
        self._refuse_beyond_file_system(rng, context)
        with self.state.store.transaction() as st:
            existing = self._by_name(st, request.name)
            if existing is not None:
                problem = self._incompatible(existing, request)
                if problem:
                    fail(
                        context,
                        grpc.StatusCode.ALREADY_EXISTS,
                        f"volume {request.name!r} already exists as {existing.volume_id} but {problem}",
                    )
                return csi_pb2.CreateVolumeResponse(volume=self._volume(existing))
            source_dir, source_size = "", 0
            if kind == "snapshot":
                snap = st.snapshots.get(source.snapshot.snapshot_id)
                if snap is None or not self.state.snapshot_exists(snap.snapshot_id):
                    fail(context, grpc.StatusCode.NOT_FOUND, f"snapshot {source.snapshot.snapshot_id} does not exist")
                source_dir, source_size = self.state.snapshot_dir(snap.snapshot_id), snap.size
            elif kind == "volume":
                if not self.state.volume_exists(source.volume.volume_id):
                    fail(context, grpc.StatusCode.NOT_FOUND, f"volume {source.volume.volume_id} does not exist")
                source_dir = self.state.volume_dir(source.volume.volume_id)
                source_size = self._record(st, source.volume.volume_id).capacity
            capacity = rng.required_bytes or rng.limit_bytes
            if source_size:
                if rng.limit_bytes and rng.limit_bytes < source_size:
                    fail(
                        context,
                        grpc.StatusCode.OUT_OF_RANGE,
                        f"capacity_range.limit_bytes {rng.limit_bytes} is smaller than the source "
                        f"({source_size} bytes)",
                    )
                capacity = max(capacity, source_size)
            volume_id = derive_id(
                request.name, lambda v: v in st.volumes or os.path.lexists(self.state.volume_dir(v)), "vol"
            )
            target = self.state.volume_dir(volume_id)
            if source_dir:
                _copy_tree(source_dir, target, self.state.partial)
            else:
                os.makedirs(target, exist_ok=True)
            rec = st.volumes[volume_id] = VolumeRecord(
                volume_id=volume_id,
                name=request.name,
                capacity=capacity,
                parameters=dict(request.parameters),
                source_snapshot=source.snapshot.snapshot_id if kind == "snapshot" else "",
                source_volume=source.volume.volume_id if kind == "volume" else "",
            )
            return csi_pb2.CreateVolumeResponse(volume=self._volume(rec))

    @staticmethod
    def _incompatible(rec: VolumeRecord, request: csi_pb2.CreateVolumeRequest) -> str:
        """Why an existing volume cannot answer this CreateVolume ("" when it can)."""
        rng = request.capacity_range
        if rng.required_bytes and rec.capacity < rng.required_bytes:
            return f"its capacity {rec.capacity} is below required_bytes {rng.required_bytes}"
        if rng.limit_bytes and rec.capacity > rng.limit_bytes:
            return f"its capacity {rec.capacity} is above limit_bytes {rng.limit_bytes}"
        if dict(request.parameters) != rec.parameters:
            return "it was created with other parameters"
        source = request.volume_content_source
        kind = source.WhichOneof("type") if request.HasField("volume_content_source") else None
        if kind == "snapshot":
            wanted = (source.snapshot.snapshot_id, "")
        elif kind == "volume":
            wanted = ("", source.volume.volume_id)
        else:
            wanted = ("", "")
        if wanted != (rec.source_snapshot, rec.source_volume):
            return "it was created from another content source"
        return ""

    @rpc(required=("volume_id",))
    def DeleteVolume(
        self, request: csi_pb2.DeleteVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.DeleteVolumeResponse:
        with self.state.store.transaction() as st:
            if not self.state.volume_exists(request.volume_id):
                st.volumes.pop(request.volume_id, None)
                return csi_pb2.DeleteVolumeResponse()  # already gone: idempotent
            busy = self._in_use(st, request.volume_id)
            if busy:
                fail(context, grpc.StatusCode.FAILED_PRECONDITION, busy)
            # Snapshots are copies, independent of their source: they stay.
            shutil.rmtree(self.state.volume_dir(request.volume_id))
            st.volumes.pop(request.volume_id, None)
        return csi_pb2.DeleteVolumeResponse()

    @rpc(required=("volume_id", "node_id"), capability="volume_capability")
    def ControllerPublishVolume(
        self, request: csi_pb2.ControllerPublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerPublishVolumeResponse:
        publish_context = {"published-by": NAME}
        if request.readonly:
            publish_context["readonly"] = "true"
        with self.state.store.transaction() as st:
            if not self.state.volume_exists(request.volume_id):
                fail(context, grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id} does not exist")
            if request.node_id not in self.state.nodes:
                fail(context, grpc.StatusCode.NOT_FOUND, f"node {request.node_id} is not known to this plugin")
            rec = self._record(st, request.volume_id)
            key = capability_key(request.volume_capability)
            mine = rec.published.get(request.node_id)
            if mine is not None:
                if mine.capability == key and mine.readonly == request.readonly:
                    return csi_pb2.ControllerPublishVolumeResponse(publish_context=publish_context)
                fail(
                    context,
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"volume {request.volume_id} is already published to node {request.node_id} with another "
                    "capability or readonly flag",
                )
            others = sorted(n for n in rec.published if n != request.node_id)
            modes = [request.volume_capability.access_mode.mode] + [
                capability_of(rec.published[n].capability).access_mode.mode for n in others
            ]
            if others and any(m not in MULTI_NODE_MODES for m in modes):
                fail(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"volume {request.volume_id} is published to node {others[0]} and its access mode "
                    f"{_MODE_NAME(modes[0])} is not MULTI_NODE",
                )
            on_node = sum(1 for v in st.volumes.values() if request.node_id in v.published)
            if on_node >= MAX_VOLUMES_PER_NODE:
                fail(
                    context,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"node {request.node_id} already has {on_node} volumes published, the most it takes",
                )
            rec.published[request.node_id] = Publication(capability=key, readonly=request.readonly)
        return csi_pb2.ControllerPublishVolumeResponse(publish_context=publish_context)

    @rpc(required=("volume_id",))
    def ControllerUnpublishVolume(
        self, request: csi_pb2.ControllerUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerUnpublishVolumeResponse:
        with self.state.store.transaction() as st:
            # Unknown volume or node, or not published there: nothing to undo, so OK.
            rec = st.volumes.get(request.volume_id)
            if rec is not None:
                if request.node_id:
                    rec.published.pop(request.node_id, None)
                else:
                    rec.published.clear()
        return csi_pb2.ControllerUnpublishVolumeResponse()

    @rpc(required=("volume_id", "volume_capabilities"))
    def ValidateVolumeCapabilities(
        self, request: csi_pb2.ValidateVolumeCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ValidateVolumeCapabilitiesResponse:
        for i, cap in enumerate(request.volume_capabilities):
            if not cap.HasField("access_mode"):
                invalid(context, f"volume_capabilities[{i}].access_mode is required")
        if request.mutable_parameters:
            invalid(context, "mutable_parameters need the MODIFY_VOLUME capability, which this plugin lacks")
        if not self.state.volume_exists(request.volume_id):
            fail(context, grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id} does not exist")
        for cap in request.volume_capabilities:
            problem = capability_problem(cap)
            if problem:
                # Not confirmed: say why, as the spec allows.
                return csi_pb2.ValidateVolumeCapabilitiesResponse(message=problem)
        confirmed = csi_pb2.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=request.volume_context,
            volume_capabilities=request.volume_capabilities,
            parameters=request.parameters,
        )
        return csi_pb2.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

    @rpc()
    def ListVolumes(
        self, request: csi_pb2.ListVolumesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ListVolumesResponse:
        check_max_entries(context, request.max_entries)
        with self.state.store.transaction() as st:
            ids = sorted(v for v in os.listdir(self.state.volumes) if self.state.volume_exists(v))
            chosen, token = page(context, ids, request.max_entries, request.starting_token)
            entries = []
            for volume_id in chosen:
                rec = st.volumes.get(volume_id) or VolumeRecord(volume_id=volume_id, name=volume_id)
                status = csi_pb2.ListVolumesResponse.VolumeStatus(published_node_ids=sorted(rec.published))
                entries.append(csi_pb2.ListVolumesResponse.Entry(volume=self._volume(rec), status=status))
        return csi_pb2.ListVolumesResponse(entries=entries, next_token=token)

    @rpc(required=("volume_id",))
    def ControllerGetVolume(
        self, request: csi_pb2.ControllerGetVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerGetVolumeResponse:
        with self.state.store.transaction() as st:
            if not self.state.volume_exists(request.volume_id):
                fail(context, grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id} does not exist")
            rec = st.volumes.get(request.volume_id) or VolumeRecord(request.volume_id, request.volume_id)
            status = csi_pb2.ControllerGetVolumeResponse.VolumeStatus(published_node_ids=sorted(rec.published))
            return csi_pb2.ControllerGetVolumeResponse(volume=self._volume(rec), status=status)

    @rpc()
    def GetCapacity(
        self, request: csi_pb2.GetCapacityRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetCapacityResponse:
        total, available = fs_sizes(self.state.volumes)
        if any(capability_problem(cap) for cap in request.volume_capabilities):
            available = 0  # nothing can be provisioned with a capability we cannot serve
        if request.HasField("accessible_topology"):
            ours = {_topology_set(t) for t in self.state.topologies()}
            if _topology_set(request.accessible_topology) not in ours:
                available = 0
        return csi_pb2.GetCapacityResponse(
            available_capacity=available, maximum_volume_size=wrappers_pb2.Int64Value(value=total)
        )

    @rpc(required=("volume_id", "capacity_range"))
    def ControllerExpandVolume(
        self, request: csi_pb2.ControllerExpandVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerExpandVolumeResponse:
        rng = request.capacity_range
        check_range(context, rng)
        if request.HasField("volume_capability"):
            check_capability(context, request.volume_capability, "volume_capability")
        self._refuse_beyond_file_system(rng, context)
        with self.state.store.transaction() as st:
            if not self.state.volume_exists(request.volume_id):
                fail(context, grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id} does not exist")
            rec = self._record(st, request.volume_id)
            wanted = rng.required_bytes or rng.limit_bytes
            if rng.limit_bytes and rec.capacity > rng.limit_bytes:
                fail(
                    context,
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"volume {rec.volume_id} already has {rec.capacity} bytes, more than limit_bytes "
                    f"{rng.limit_bytes}: volumes do not shrink",
                )
            rec.capacity = max(rec.capacity, wanted)
            # ONLINE expansion: published volumes grow too; the node reports the new size.
            return csi_pb2.ControllerExpandVolumeResponse(capacity_bytes=rec.capacity, node_expansion_required=True)

    # --- snapshots -----------------------------------------------------------------------------

    @rpc(required=("source_volume_id",))
    def CreateSnapshot(
        self, request: csi_pb2.CreateSnapshotRequest, context: grpc.ServicerContext
    ) -> csi_pb2.CreateSnapshotResponse:
        check_name(context, request.name)
        with self.state.store.transaction() as st:
            for snap in st.snapshots.values():
                if snap.name == request.name and self.state.snapshot_exists(snap.snapshot_id):
                    if snap.source_volume_id != request.source_volume_id:
                        fail(
                            context,
                            grpc.StatusCode.ALREADY_EXISTS,
                            f"snapshot {request.name!r} already exists as {snap.snapshot_id} of volume "
                            f"{snap.source_volume_id}",
                        )
                    return csi_pb2.CreateSnapshotResponse(snapshot=self._snapshot(snap))
            if not self.state.volume_exists(request.source_volume_id):
                fail(context, grpc.StatusCode.NOT_FOUND, f"volume {request.source_volume_id} does not exist")
            snapshot_id = derive_id(
                request.name, lambda s: s in st.snapshots or os.path.lexists(self.state.snapshot_dir(s)), "snap"
            )
            target = self.state.snapshot_dir(snapshot_id)
            source_dir = self.state.volume_dir(request.source_volume_id)
            needed, (_total, free) = tree_bytes(source_dir), fs_sizes(self.state.snapshots)
            if needed > free:
                fail(
                    context,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"a copy of volume {request.source_volume_id} needs {needed} bytes, {free} are free",
                )
            try:
                _copy_tree(source_dir, target, self.state.partial)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                fail(context, grpc.StatusCode.RESOURCE_EXHAUSTED, f"no space left for snapshot {request.name!r}")
            source = st.volumes.get(request.source_volume_id)
            size = source.capacity if source is not None and source.capacity else tree_bytes(target)
            rec = st.snapshots[snapshot_id] = SnapshotRecord(
                snapshot_id=snapshot_id,
                name=request.name,
                source_volume_id=request.source_volume_id,
                size=size,
                created_ns=time.time_ns(),
            )
            return csi_pb2.CreateSnapshotResponse(snapshot=self._snapshot(rec))

    @rpc(required=("snapshot_id",))
    def DeleteSnapshot(
        self, request: csi_pb2.DeleteSnapshotRequest, context: grpc.ServicerContext
    ) -> csi_pb2.DeleteSnapshotResponse:
        with self.state.store.transaction() as st:
            # Volumes made from a snapshot are copies: deleting it never affects them.
            if self.state.snapshot_exists(request.snapshot_id):
                shutil.rmtree(self.state.snapshot_dir(request.snapshot_id))
            st.snapshots.pop(request.snapshot_id, None)
        return csi_pb2.DeleteSnapshotResponse()

    @rpc()
    def ListSnapshots(
        self, request: csi_pb2.ListSnapshotsRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ListSnapshotsResponse:
        check_max_entries(context, request.max_entries)
        with self.state.store.transaction() as st:
            snaps = {k: v for k, v in st.snapshots.items() if self.state.snapshot_exists(k)}
            ids = sorted(
                k
                for k, v in snaps.items()
                if (not request.snapshot_id or k == request.snapshot_id)
                and (not request.source_volume_id or v.source_volume_id == request.source_volume_id)
            )
            chosen, token = page(context, ids, request.max_entries, request.starting_token)
            entries = [csi_pb2.ListSnapshotsResponse.Entry(snapshot=self._snapshot(snaps[k])) for k in chosen]
        return csi_pb2.ListSnapshotsResponse(entries=entries, next_token=token)

    @rpc(required=("snapshot_id",))
    def GetSnapshot(
        self, request: csi_pb2.GetSnapshotRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetSnapshotResponse:
        with self.state.store.transaction() as st:
            snap = st.snapshots.get(request.snapshot_id)
            if snap is None or not self.state.snapshot_exists(request.snapshot_id):
                fail(context, grpc.StatusCode.NOT_FOUND, f"snapshot {request.snapshot_id} does not exist")
            return csi_pb2.GetSnapshotResponse(snapshot=self._snapshot(snap))
