"""A CSI client for one plugin socket: identity, controller and node calls with Python types.

Connecting checks the socket at once so an unusable one fails with a sentence naming it; every
call goes through the retry table of :mod:`driversdk.csi.retry`. A client may carry a
:class:`~driversdk.csi.cancel.Cancel` token (an interrupt ends its call in flight and its backoff
waits) and a deadline per call (all its attempts included), for teardown that must not wait out
a plugin that does not answer.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Generic, TypeVar

import grpc

from driversdk.csi.cancel import CallCancelled, Cancel
from driversdk.csi.errors import CallContext, CSIConnectError, CSIError, unpack
from driversdk.csi.model import AttachmentMode, Volume, VolumeCapability
from driversdk.csi.retry import policy_for
from driversdk.pb import csi_pb2, csi_pb2_grpc
from driversdk.plugin.host import rpc_call_of

log = logging.getLogger("driversdk.csi")
T = TypeVar("T")
Req = TypeVar("Req")

_STAGE = csi_pb2.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME
_PUBLISH = csi_pb2.ControllerServiceCapability.RPC.PUBLISH_UNPUBLISH_VOLUME


@dataclass(frozen=True)
class PluginInfo:
    name: str
    vendor_version: str
    manifest: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    max_volumes: int
    topology: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PluginVolume:
    """A volume as the plugin reports it (CreateVolume, ControllerGetVolume, ListVolumes)."""

    volume_id: str
    capacity_bytes: int  # 0: unknown
    context: dict[str, str] = field(default_factory=dict)
    snapshot_source: str = ""  # the snapshot it was created from
    clone_source: str = ""  # the volume it was cloned from
    topologies: tuple[dict[str, str], ...] = ()  # empty: reachable from every node
    published_node_ids: tuple[str, ...] = ()
    abnormal: bool = False
    condition: str = ""  # the plugin's condition message, when it reports one


@dataclass(frozen=True)
class PluginSnapshot:
    snapshot_id: str
    source_volume_id: str
    size_bytes: int  # 0: unknown
    created: datetime
    ready_to_use: bool


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; ``next_token`` is empty on the last one."""

    entries: tuple[T, ...]
    next_token: str = ""


def _plugin_volume(volume: csi_pb2.Volume) -> PluginVolume:
    source = volume.content_source
    return PluginVolume(
        volume_id=volume.volume_id,
        capacity_bytes=volume.capacity_bytes,
        context=dict(volume.volume_context),
        snapshot_source=source.snapshot.snapshot_id if source.HasField("snapshot") else "",
        clone_source=source.volume.volume_id if source.HasField("volume") else "",
        # Nomad's conversion leaves empty entries in front; there are none here.
        topologies=tuple(dict(t.segments) for t in volume.accessible_topology if t.segments),
    )


def _plugin_snapshot(snap: csi_pb2.Snapshot) -> PluginSnapshot:
    created = snap.creation_time.ToDatetime(tzinfo=UTC)
    return PluginSnapshot(snap.snapshot_id, snap.source_volume_id, snap.size_bytes, created, snap.ready_to_use)


def _with_status(
    volume: PluginVolume, published: Sequence[str], condition: csi_pb2.VolumeCondition | None
) -> PluginVolume:
    return replace(
        volume,
        published_node_ids=tuple(published),
        abnormal=condition is not None and condition.abnormal,
        condition=condition.message if condition is not None else "",
    )


def _topology_requirement(
    requisite: Sequence[Mapping[str, str]], preferred: Sequence[Mapping[str, str]]
) -> csi_pb2.TopologyRequirement:
    return csi_pb2.TopologyRequirement(
        requisite=[csi_pb2.Topology(segments=dict(t)) for t in requisite],
        preferred=[csi_pb2.Topology(segments=dict(t)) for t in preferred],
    )


def open_channel(socket_path: str, timeout: float = 1.0) -> grpc.Channel:
    """Dial a plugin's unix socket now, failing with the likely cause when it cannot be used."""
    try:
        mode = os.stat(socket_path).st_mode
    except PermissionError:
        mode = None
    except FileNotFoundError:
        raise CSIConnectError(
            f"failed to open CSI plugin socket {socket_path}: it does not exist; is the plugin running and "
            "listening there?",
            code="UNAVAILABLE",
            call="connect",
        ) from None
    if mode is not None and not stat.S_ISSOCK(mode):
        raise CSIConnectError(
            f"failed to open CSI plugin socket {socket_path}: it is not a unix socket",
            code="UNAVAILABLE",
            call="connect",
        )
    if mode is None or not os.access(socket_path, os.R_OK | os.W_OK):
        raise CSIConnectError(
            f"failed to open CSI plugin socket {socket_path}: permission denied; run as a user that may "
            "read and write the socket",
            code="PERMISSION_DENIED",
            call="connect",
        )
    # A plain connect, retried while refused for up to ``timeout`` (a plugin that is starting
    # may have bound its socket but not yet listen), tells a live listener from a stale socket.
    # gRPC's own eager dial (channel_ready_future) would too, but leaves a connectivity poller
    # behind that every close() then waits on (up to 200 ms); the channel connects on first use.
    if not _accepts(socket_path, timeout):
        raise CSIConnectError(
            f"failed to open grpc connection to CSI plugin socket {socket_path}: nothing accepted the connection "
            f"within {timeout:g}s (a stale socket left by a plugin that died?)",
            code="UNAVAILABLE",
            call="connect",
        )
    # Strict HTTP/2 servers reject a socket path as :authority. A subchannel of its own: gRPC
    # shares them per address across channels, and one an earlier client left in reconnect
    # backoff (its plugin died; a new one listens now) would fail this channel's first call.
    options = [("grpc.default_authority", "localhost"), ("grpc.use_local_subchannel_pool", 1)]
    return grpc.insecure_channel(f"unix:{socket_path}", options=options)


def _accepts(socket_path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            probe.settimeout(max(0.001, deadline - time.monotonic()))
            probe.connect(socket_path)
            return True
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # not listening (yet): a plugin between bind and listen, or replacing its socket
        except (TimeoutError, BlockingIOError):
            return False  # the listener's backlog is full and stays so
        finally:
            probe.close()
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.02, left))


class CSIClient:
    def __init__(
        self,
        socket_path: str,
        *,
        plugin: str = "",
        connect_timeout: float = 1.0,
        cancel: Cancel | None = None,
        call_timeout: float | None = None,
    ) -> None:
        """``cancel`` ends the call in flight and the waits between attempts; ``call_timeout``
        bounds each call, its retries included (else the retry table's per-attempt timeout)."""
        self.socket_path = socket_path
        self.plugin = plugin or os.path.basename(os.path.dirname(socket_path)) or socket_path
        self.cancel = cancel
        self.call_timeout = call_timeout
        if cancel is not None and cancel.cancelled:
            raise self._cancelled(CallContext("connect", self.plugin))
        self.channel = open_channel(socket_path, connect_timeout)
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.controller = csi_pb2_grpc.ControllerStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)
        self.attempts: dict[str, int] = {}

    def close(self) -> None:
        self.channel.close()

    def _call(self, about: CallContext, fn: grpc.UnaryUnaryMultiCallable[Req, T], request: Req) -> T:
        policy = policy_for(about.call)
        deadline = None if self.call_timeout is None else time.monotonic() + self.call_timeout
        for attempt in range(1, policy.attempts + 1):
            self.attempts[about.call] = self.attempts.get(about.call, 0) + 1
            timeout = policy.attempt_timeout
            if deadline is not None:
                timeout = max(0.001, min(timeout, deadline - time.monotonic()))
            try:
                return self._attempt(about, fn, request, timeout)
            except grpc.RpcError as err:
                failed = rpc_call_of(err)
                code = failed.code() if failed is not None else None
                wait = policy.backoff(attempt)
                in_time = deadline is None or time.monotonic() + wait < deadline
                if attempt < policy.attempts and code in policy.codes and in_time:
                    log.debug("retrying CSI call", extra={"call": about.call, "code": str(code), "wait": wait})
                    if self.cancel is not None and self.cancel.wait(wait):
                        raise self._cancelled(about) from None
                    if self.cancel is None:
                        time.sleep(wait)
                    continue
                raise unpack(err, about) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt(self, about: CallContext, fn: grpc.UnaryUnaryMultiCallable[Req, T], request: Req, timeout: float) -> T:
        """One attempt; the token, when cancelled, cancels it in flight."""
        if self.cancel is None:
            return fn(request, timeout=timeout)
        if self.cancel.cancelled:
            raise self._cancelled(about)
        future = fn.future(request, timeout=timeout)
        remove = self.cancel.on_cancel(future.cancel)
        try:
            return future.result()
        except grpc.FutureCancelledError:
            raise self._cancelled(about) from None
        except grpc.RpcError:
            if self.cancel.cancelled:  # cancelled while the answer (an error) was on its way
                raise self._cancelled(about) from None
            raise
        finally:
            remove()

    def _cancelled(self, about: CallContext) -> CallCancelled:
        what = f'{about.call} of volume "{about.volume}"' if about.volume else about.call
        reason = self.cancel.reason if self.cancel is not None else "interrupted"
        return CallCancelled(
            f'{reason}: {what} on CSI plugin "{about.plugin}" was given up',
            code="CANCELLED",
            call=about.call,
            volume=about.volume,
        )

    # --- identity ------------------------------------------------------------------------------

    def plugin_info(self) -> PluginInfo:
        resp = self._call(
            CallContext("GetPluginInfo", self.plugin), self.identity.GetPluginInfo, csi_pb2.GetPluginInfoRequest()
        )
        if not resp.name:
            raise CSIError("plugin returned empty name field", code="OK", call="GetPluginInfo")
        return PluginInfo(resp.name, resp.vendor_version, dict(resp.manifest))

    def plugin_capabilities(self) -> set[int]:
        resp = self._call(
            CallContext("GetPluginCapabilities", self.plugin),
            self.identity.GetPluginCapabilities,
            csi_pb2.GetPluginCapabilitiesRequest(),
        )
        return {c.service.type for c in resp.capabilities if c.HasField("service")}

    def probe(self) -> bool:
        resp = self._call(CallContext("Probe", self.plugin), self.identity.Probe, csi_pb2.ProbeRequest())
        # A missing `ready` means ready; only a present false means "still starting".
        return not resp.HasField("ready") or resp.ready.value

    # --- capabilities --------------------------------------------------------------------------

    def controller_capabilities(self) -> set[int]:
        resp = self._call(
            CallContext("ControllerGetCapabilities", self.plugin),
            self.controller.ControllerGetCapabilities,
            csi_pb2.ControllerGetCapabilitiesRequest(),
        )
        return {c.rpc.type for c in resp.capabilities if c.HasField("rpc")}

    def node_capabilities(self) -> set[int]:
        resp = self._call(
            CallContext("NodeGetCapabilities", self.plugin),
            self.node.NodeGetCapabilities,
            csi_pb2.NodeGetCapabilitiesRequest(),
        )
        return {c.rpc.type for c in resp.capabilities if c.HasField("rpc")}

    def node_info(self) -> NodeInfo:
        resp = self._call(CallContext("NodeGetInfo", self.plugin), self.node.NodeGetInfo, csi_pb2.NodeGetInfoRequest())
        if not resp.node_id:
            raise CSIError("plugin failed to return nodeid", code="OK", call="NodeGetInfo")
        max_volumes = resp.max_volumes_per_node or 2**63 - 1
        return NodeInfo(resp.node_id, max_volumes, dict(resp.accessible_topology.segments))

    # --- controller ----------------------------------------------------------------------------

    def validate_volume_capabilities(self, volume: Volume) -> str:
        """Raise CSIError when the plugin confirms capabilities that differ from the volume's.

        An answer without ``confirmed`` is not a failure (the spec lets a CO conclude only
        "confirmed"), but its ``message`` is returned so the operator sees why.
        """
        # Nomad sends no mount options here: a plugin echoing fs_type would otherwise fail the match.
        caps = [VolumeCapability(c.access_mode, c.attachment_mode).to_proto() for c in volume.capabilities]
        req = csi_pb2.ValidateVolumeCapabilitiesRequest(
            volume_id=volume.remote_id,
            volume_context=volume.context,
            volume_capabilities=caps,
            parameters=volume.parameters,
            secrets=dict(volume.secrets),
        )
        resp = self._call(
            CallContext("ValidateVolumeCapabilities", self.plugin, volume=volume.remote_id),
            self.controller.ValidateVolumeCapabilities,
            req,
        )
        problems = capability_mismatches(caps, resp)
        if problems:
            listing = "; ".join(problems)
            raise CSIError(
                f'volume "{volume.id}": volume capability validation failed: {listing}',
                code="OK",
                call="ValidateVolumeCapabilities",
                volume=volume.id,
                plugin_message=resp.message,
            )
        return "" if resp.HasField("confirmed") else resp.message

    def controller_publish(
        self, volume: Volume, node_id: str, capability: VolumeCapability, readonly: bool
    ) -> dict[str, str]:
        if not node_id:
            raise CSIError("missing NodeID", code="OK", call="ControllerPublishVolume", volume=volume.id)
        req = csi_pb2.ControllerPublishVolumeRequest(
            volume_id=volume.remote_id,
            node_id=node_id,
            volume_capability=capability.to_proto(),
            readonly=readonly,
            secrets=dict(volume.secrets),
            volume_context=volume.context,
        )
        resp = self._call(
            CallContext("ControllerPublishVolume", self.plugin, volume=volume.remote_id, node=node_id),
            self.controller.ControllerPublishVolume,
            req,
        )
        return dict(resp.publish_context)

    def controller_unpublish(self, volume: Volume, node_id: str) -> None:
        if not node_id:
            raise CSIError("missing NodeID", code="OK", call="ControllerUnpublishVolume", volume=volume.id)
        req = csi_pb2.ControllerUnpublishVolumeRequest(volume_id=volume.remote_id, node_id=node_id)
        try:
            self._call(
                CallContext("ControllerUnpublishVolume", self.plugin, volume=volume.remote_id, node=node_id),
                self.controller.ControllerUnpublishVolume,
                req,
            )
        except CSIError as err:
            if not err.ignorable:
                raise

    def create_volume(
        self,
        name: str,
        capabilities: Sequence[VolumeCapability],
        *,
        capacity_min: int = 0,
        capacity_max: int = 0,
        parameters: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        snapshot_id: str = "",
        clone_id: str = "",
        requisite: Sequence[Mapping[str, str]] = (),
        preferred: Sequence[Mapping[str, str]] = (),
    ) -> PluginVolume:
        """CreateVolume; idempotent by ``name``, so a retry after a lost answer is safe.

        The request is checked here first, so an impossible one never reaches the plugin.
        """
        call = "CreateVolume"
        problem = ""
        if not name:
            problem = "a volume to create needs a name"
        elif not capabilities:
            problem = f'volume "{name}": CreateVolume needs at least one capability'
        elif capacity_min < 0 or capacity_max < 0:
            problem = f'volume "{name}": capacity_min and capacity_max must not be negative'
        elif capacity_max and capacity_max < capacity_min:
            problem = f'volume "{name}": capacity_max ({capacity_max}) is smaller than capacity_min ({capacity_min})'
        elif snapshot_id and clone_id:
            problem = f'volume "{name}": set snapshot_id or clone_id, not both'
        if problem:
            raise CSIError(problem, code="OK", call=call, volume=name)
        req = csi_pb2.CreateVolumeRequest(
            name=name,
            volume_capabilities=[c.to_proto() for c in capabilities],
            parameters=dict(parameters or {}),
            secrets=dict(secrets or {}),
        )
        if capacity_min or capacity_max:
            req.capacity_range.CopyFrom(csi_pb2.CapacityRange(required_bytes=capacity_min, limit_bytes=capacity_max))
        if snapshot_id:
            req.volume_content_source.snapshot.snapshot_id = snapshot_id
        elif clone_id:
            req.volume_content_source.volume.volume_id = clone_id
        if requisite or preferred:
            req.accessibility_requirements.CopyFrom(_topology_requirement(requisite, preferred))
        resp = self._call(
            CallContext(call, self.plugin, volume=name, source=snapshot_id or clone_id),
            self.controller.CreateVolume,
            req,
        )
        return _plugin_volume(resp.volume)

    def delete_volume(self, volume_id: str, secrets: Mapping[str, str] | None = None) -> None:
        """DeleteVolume; idempotent: the spec has the plugin answer OK for a volume it no longer has."""
        if not volume_id:
            raise CSIError("DeleteVolume needs a volume ID", code="OK", call="DeleteVolume")
        req = csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=dict(secrets or {}))
        self._call(CallContext("DeleteVolume", self.plugin, volume=volume_id), self.controller.DeleteVolume, req)

    def controller_expand(
        self,
        volume: Volume,
        capacity_min: int,
        capacity_max: int,
        capability: VolumeCapability | None = None,
    ) -> tuple[int, bool]:
        """ControllerExpandVolume (EXPAND_VOLUME) with the volume's secrets; returns the new
        capacity and whether the node must expand it too (node_expansion_required)."""
        req = csi_pb2.ControllerExpandVolumeRequest(
            volume_id=volume.remote_id,
            capacity_range=csi_pb2.CapacityRange(required_bytes=capacity_min, limit_bytes=capacity_max),
            secrets=dict(volume.secrets),
        )
        if capability is not None:
            req.volume_capability.CopyFrom(capability.to_proto())
        resp = self._call(
            CallContext("ControllerExpandVolume", self.plugin, volume=volume.remote_id),
            self.controller.ControllerExpandVolume,
            req,
        )
        return resp.capacity_bytes, resp.node_expansion_required

    def node_expand(
        self,
        volume: Volume,
        target_path: str,
        staging_path: str,
        capacity_min: int,
        capacity_max: int,
        capability: VolumeCapability,
    ) -> int:
        """NodeExpandVolume (node EXPAND_VOLUME), without secrets as Nomad sends it; NotFound
        (nothing of it here any more) is ignorable and answers 0."""
        req = csi_pb2.NodeExpandVolumeRequest(
            volume_id=volume.remote_id,
            volume_path=target_path,
            staging_target_path=staging_path,
            capacity_range=csi_pb2.CapacityRange(required_bytes=capacity_min, limit_bytes=capacity_max),
            volume_capability=capability.to_proto(),
        )
        try:
            resp = self._call(
                CallContext("NodeExpandVolume", self.plugin, volume=volume.remote_id, path=target_path),
                self.node.NodeExpandVolume,
                req,
            )
        except CSIError as err:
            if not err.ignorable:
                raise
            return 0
        return resp.capacity_bytes

    def controller_get_volume(self, volume_id: str) -> PluginVolume:
        """ControllerGetVolume (GET_VOLUME): the volume with where it is published and its condition."""
        if not volume_id:
            raise CSIError("ControllerGetVolume needs a volume ID", code="OK", call="ControllerGetVolume")
        req = csi_pb2.ControllerGetVolumeRequest(volume_id=volume_id)
        resp = self._call(
            CallContext("ControllerGetVolume", self.plugin, volume=volume_id), self.controller.ControllerGetVolume, req
        )
        status = resp.status
        condition = status.volume_condition if status.HasField("volume_condition") else None
        return _with_status(_plugin_volume(resp.volume), status.published_node_ids, condition)

    def list_volumes(self, max_entries: int = 0, starting_token: str = "") -> Page[PluginVolume]:
        """One page of ListVolumes (LIST_VOLUMES); ``max_entries`` 0 means no limit."""
        if max_entries < 0:
            raise CSIError("ListVolumes max_entries must not be negative", code="OK", call="ListVolumes")
        req = csi_pb2.ListVolumesRequest(max_entries=max_entries, starting_token=starting_token)
        resp = self._call(
            CallContext("ListVolumes", self.plugin, token=starting_token), self.controller.ListVolumes, req
        )
        entries = tuple(
            _with_status(
                _plugin_volume(e.volume),
                e.status.published_node_ids,
                e.status.volume_condition if e.status.HasField("volume_condition") else None,
            )
            for e in resp.entries
        )
        return Page(entries, resp.next_token)

    def all_volumes(self, page_size: int = 100) -> Iterator[PluginVolume]:
        """Every volume, page by page."""
        token = ""
        while True:
            page = self.list_volumes(page_size, token)
            yield from page.entries
            if not page.next_token:
                return
            token = page.next_token

    def create_snapshot(
        self,
        volume_id: str,
        name: str,
        *,
        parameters: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> PluginSnapshot:
        """CreateSnapshot (CREATE_DELETE_SNAPSHOT); idempotent by ``name``."""
        if not volume_id or not name:
            raise CSIError(
                "CreateSnapshot needs a source volume ID and a snapshot name",
                code="OK",
                call="CreateSnapshot",
                volume=volume_id,
            )
        req = csi_pb2.CreateSnapshotRequest(
            source_volume_id=volume_id, name=name, parameters=dict(parameters or {}), secrets=dict(secrets or {})
        )
        resp = self._call(
            CallContext("CreateSnapshot", self.plugin, volume=volume_id, snapshot=name),
            self.controller.CreateSnapshot,
            req,
        )
        return _plugin_snapshot(resp.snapshot)

    def delete_snapshot(self, snapshot_id: str, secrets: Mapping[str, str] | None = None) -> None:
        """DeleteSnapshot; idempotent: the spec has the plugin answer OK for a snapshot it no longer has."""
        if not snapshot_id:
            raise CSIError("DeleteSnapshot needs a snapshot ID", code="OK", call="DeleteSnapshot")
        req = csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id, secrets=dict(secrets or {}))
        self._call(
            CallContext("DeleteSnapshot", self.plugin, snapshot=snapshot_id), self.controller.DeleteSnapshot, req
        )

    def list_snapshots(
        self,
        max_entries: int = 0,
        starting_token: str = "",
        *,
        volume_id: str = "",
        snapshot_id: str = "",
        secrets: Mapping[str, str] | None = None,
    ) -> Page[PluginSnapshot]:
        """One page of ListSnapshots (LIST_SNAPSHOTS), optionally of one volume or one snapshot."""
        if max_entries < 0:
            raise CSIError("ListSnapshots max_entries must not be negative", code="OK", call="ListSnapshots")
        req = csi_pb2.ListSnapshotsRequest(
            max_entries=max_entries,
            starting_token=starting_token,
            source_volume_id=volume_id,
            snapshot_id=snapshot_id,
            secrets=dict(secrets or {}),
        )
        resp = self._call(
            CallContext("ListSnapshots", self.plugin, volume=volume_id, snapshot=snapshot_id, token=starting_token),
            self.controller.ListSnapshots,
            req,
        )
        return Page(tuple(_plugin_snapshot(e.snapshot) for e in resp.entries), resp.next_token)

    # --- node ----------------------------------------------------------------------------------

    def node_stage(
        self,
        volume: Volume,
        staging_path: str,
        capability: VolumeCapability,
        publish_context: Mapping[str, str],
    ) -> None:
        req = csi_pb2.NodeStageVolumeRequest(
            volume_id=volume.remote_id,
            publish_context=dict(publish_context),
            staging_target_path=staging_path,
            volume_capability=capability.to_proto(),
            secrets=dict(volume.secrets),
            volume_context=volume.context,
        )
        self._call(
            CallContext("NodeStageVolume", self.plugin, volume=volume.remote_id, path=staging_path),
            self.node.NodeStageVolume,
            req,
        )

    def node_unstage(self, volume: Volume, staging_path: str) -> None:
        req = csi_pb2.NodeUnstageVolumeRequest(volume_id=volume.remote_id, staging_target_path=staging_path)
        try:
            self._call(
                CallContext("NodeUnstageVolume", self.plugin, volume=volume.remote_id), self.node.NodeUnstageVolume, req
            )
        except CSIError as err:
            if not err.ignorable:
                raise

    def node_publish(
        self,
        volume: Volume,
        staging_path: str,
        target_path: str,
        capability: VolumeCapability,
        readonly: bool,
        publish_context: Mapping[str, str],
    ) -> None:
        if not os.path.isabs(target_path) or (staging_path and not os.path.isabs(staging_path)):
            raise CSIError(
                f'volume "{volume.id}": refusing to send a relative path to the plugin ({target_path!r})',
                code="OK",
                call="NodePublishVolume",
                volume=volume.id,
            )
        req = csi_pb2.NodePublishVolumeRequest(
            volume_id=volume.remote_id,
            publish_context=dict(publish_context),
            staging_target_path=staging_path,
            target_path=target_path,
            volume_capability=capability.to_proto(),
            readonly=readonly,
            secrets=dict(volume.secrets),
            volume_context=volume.context,
        )
        self._call(
            CallContext("NodePublishVolume", self.plugin, volume=volume.remote_id, path=target_path),
            self.node.NodePublishVolume,
            req,
        )

    def node_unpublish(self, volume: Volume, target_path: str) -> None:
        req = csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume.remote_id, target_path=target_path)
        try:
            self._call(
                CallContext("NodeUnpublishVolume", self.plugin, volume=volume.remote_id),
                self.node.NodeUnpublishVolume,
                req,
            )
        except CSIError as err:
            if not err.ignorable:
                raise


def capability_mismatches(
    requested: list[csi_pb2.VolumeCapability], resp: csi_pb2.ValidateVolumeCapabilitiesResponse
) -> list[str]:
    """Nomad's rule: absent `confirmed` is success; one matching confirmed entry per requested
    capability suffices; values are compared, never object identity."""
    if resp.message:
        log.debug("plugin validation message", extra={"message": resp.message})
    if not resp.HasField("confirmed"):
        return []
    problems: list[str] = []
    for req in requested:
        reasons: list[str] = []
        for conf in resp.confirmed.volume_capabilities:
            reason = _mismatch(req, conf)
            if reason is None:
                break
            if reason:
                reasons.append(reason)
        else:
            problems.extend(reasons)
    return problems


def _mismatch(req: csi_pb2.VolumeCapability, conf: csi_pb2.VolumeCapability) -> str | None:
    """None: a match. "": not a match, but nothing wrong either. Otherwise: what differs."""
    mode_name = csi_pb2.VolumeCapability.AccessMode.Mode.Name
    if conf.access_mode.mode != req.access_mode.mode and conf.access_mode.mode != 0:
        return f"requested access mode {mode_name(req.access_mode.mode)}, got {mode_name(conf.access_mode.mode)}"
    if conf.HasField("block") and not req.HasField("block"):
        return "'block-device' access type was not requested but was validated by the controller"
    if not conf.HasField("mount"):
        return ""
    if not req.HasField("mount"):
        return "'file-system' access type was not requested but was validated by the controller"
    if conf.mount.fs_type != req.mount.fs_type:
        return f"requested filesystem type {req.mount.fs_type}, got {conf.mount.fs_type}"
    if not set(req.mount.mount_flags) <= set(conf.mount.mount_flags):
        # Flags may hold secrets: never print them.
        return "requested mount flags did not match available capabilities"
    return None


__all__ = [
    "AttachmentMode",
    "CSIClient",
    "NodeInfo",
    "Page",
    "PluginInfo",
    "PluginSnapshot",
    "PluginVolume",
    "capability_mismatches",
    "open_channel",
]
