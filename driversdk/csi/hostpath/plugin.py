"""The hostpath plugin's identity, controller and node services.

Honest to the spec: it advertises exactly what it implements (CONTROLLER_SERVICE;
CREATE_DELETE_VOLUME, PUBLISH_UNPUBLISH_VOLUME, LIST_VOLUMES; STAGE_UNSTAGE_VOLUME), answers
each documented error code, and every call is idempotent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
from google.protobuf import wrappers_pb2

from driversdk.csi.hostpath.faults import Faults
from driversdk.mountinfo import is_mount_point
from driversdk.pb import csi_pb2, csi_pb2_grpc

NAME = "hostpath.csi.driversdk.io"
VERSION = "0.1.0"
T = TypeVar("T")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_SUPPORTED_MODES = {
    csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER,
    csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY,
    csi_pb2.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY,
    csi_pb2.VolumeCapability.AccessMode.MULTI_NODE_SINGLE_WRITER,
    csi_pb2.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER,
}


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(done.stderr.strip() or f"{args[0]} failed")


class HostPathState:
    def __init__(self, root: str, node_id: str, faults: Faults) -> None:
        self.root = root
        self.volumes = os.path.join(root, "volumes")
        os.makedirs(self.volumes, exist_ok=True)
        self.node_id = node_id
        self.faults = faults
        self.published: dict[str, set[str]] = {}  # volume -> nodes (controller bookkeeping)
        self.lock = threading.Lock()

    def volume_dir(self, volume_id: str) -> str:
        return os.path.join(self.volumes, volume_id)


def _guard(state: HostPathState, rpc: str, context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
    delay = state.faults.before(rpc, context)
    if delay:
        time.sleep(delay)
    try:
        return fn()
    except OSError as err:
        context.abort(grpc.StatusCode.INTERNAL, f"{rpc}: {err}")
    raise AssertionError("unreachable")  # pragma: no cover


def _check_capability(cap: csi_pb2.VolumeCapability, context: grpc.ServicerContext) -> None:
    if not cap.HasField("access_mode"):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_capability.access_mode is required")
    if cap.HasField("block"):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "block access is not supported: volumes are directories")
    if cap.access_mode.mode not in _SUPPORTED_MODES:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"access mode {cap.access_mode.mode} is not supported")


def _require_volume(state: HostPathState, volume_id: str, context: grpc.ServicerContext) -> str:
    if not volume_id:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_id is required")
    path = state.volume_dir(volume_id)
    if not _SAFE_ID.match(volume_id) or not os.path.isdir(path):
        context.abort(grpc.StatusCode.NOT_FOUND, f"volume {volume_id} does not exist")
    return path


def _absolute(path: str, field: str, context: grpc.ServicerContext) -> None:
    if not path:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field} is required")
    if not os.path.isabs(path):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field} must be an absolute path, got {path!r}")


class Identity(csi_pb2_grpc.IdentityServicer):
    def __init__(self, state: HostPathState) -> None:
        self.state = state

    def GetPluginInfo(
        self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginInfoResponse:
        def run() -> csi_pb2.GetPluginInfoResponse:
            # The manifest reports per-RPC call counts, which fault tests read back.
            manifest = {f"calls.{k}": str(v) for k, v in self.state.faults.calls.items()}
            return csi_pb2.GetPluginInfoResponse(name=NAME, vendor_version=VERSION, manifest=manifest)

        return _guard(self.state, "GetPluginInfo", context, run)

    def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        service = csi_pb2.PluginCapability.Service(type=csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE)
        resp = csi_pb2.GetPluginCapabilitiesResponse(capabilities=[csi_pb2.PluginCapability(service=service)])
        return _guard(self.state, "GetPluginCapabilities", context, lambda: resp)

    def Probe(self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext) -> csi_pb2.ProbeResponse:
        return _guard(
            self.state, "Probe", context, lambda: csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))
        )


class Controller(csi_pb2_grpc.ControllerServicer):
    def __init__(self, state: HostPathState) -> None:
        self.state = state

    def ControllerGetCapabilities(
        self, request: csi_pb2.ControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerGetCapabilitiesResponse:
        rpc = csi_pb2.ControllerServiceCapability.RPC
        caps = [
            csi_pb2.ControllerServiceCapability(rpc=rpc(type=t))
            for t in (rpc.CREATE_DELETE_VOLUME, rpc.PUBLISH_UNPUBLISH_VOLUME, rpc.LIST_VOLUMES)
        ]
        resp = csi_pb2.ControllerGetCapabilitiesResponse(capabilities=caps)
        return _guard(self.state, "ControllerGetCapabilities", context, lambda: resp)

    def CreateVolume(
        self, request: csi_pb2.CreateVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.CreateVolumeResponse:
        def run() -> csi_pb2.CreateVolumeResponse:
            if not request.name or not _SAFE_ID.match(request.name):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "name is required: letters, digits, . _ -")
            if not request.volume_capabilities:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_capabilities are required")
            for cap in request.volume_capabilities:
                _check_capability(cap, context)
            os.makedirs(self.state.volume_dir(request.name), exist_ok=True)
            return csi_pb2.CreateVolumeResponse(
                volume=csi_pb2.Volume(volume_id=request.name, volume_context={"hostpath": "1"})
            )

        return _guard(self.state, "CreateVolume", context, run)

    def DeleteVolume(
        self, request: csi_pb2.DeleteVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.DeleteVolumeResponse:
        def run() -> csi_pb2.DeleteVolumeResponse:
            if not request.volume_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_id is required")
            with self.state.lock:
                if self.state.published.get(request.volume_id):
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"volume {request.volume_id} is published")
            if _SAFE_ID.match(request.volume_id):
                shutil.rmtree(self.state.volume_dir(request.volume_id), ignore_errors=True)
            return csi_pb2.DeleteVolumeResponse()

        return _guard(self.state, "DeleteVolume", context, run)

    def ControllerPublishVolume(
        self, request: csi_pb2.ControllerPublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerPublishVolumeResponse:
        def run() -> csi_pb2.ControllerPublishVolumeResponse:
            _require_volume(self.state, request.volume_id, context)
            _check_capability(request.volume_capability, context)
            if request.node_id != self.state.node_id:
                context.abort(grpc.StatusCode.NOT_FOUND, f"node {request.node_id} is not known to this plugin")
            with self.state.lock:
                self.state.published.setdefault(request.volume_id, set()).add(request.node_id)
            return csi_pb2.ControllerPublishVolumeResponse(publish_context={"published-by": NAME})

        return _guard(self.state, "ControllerPublishVolume", context, run)

    def ControllerUnpublishVolume(
        self, request: csi_pb2.ControllerUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerUnpublishVolumeResponse:
        def run() -> csi_pb2.ControllerUnpublishVolumeResponse:
            with self.state.lock:
                nodes = self.state.published.get(request.volume_id, set())
                if request.node_id:
                    nodes.discard(request.node_id)
                else:
                    nodes.clear()
            return csi_pb2.ControllerUnpublishVolumeResponse()

        return _guard(self.state, "ControllerUnpublishVolume", context, run)

    def ValidateVolumeCapabilities(
        self, request: csi_pb2.ValidateVolumeCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ValidateVolumeCapabilitiesResponse:
        def run() -> csi_pb2.ValidateVolumeCapabilitiesResponse:
            _require_volume(self.state, request.volume_id, context)
            if not request.volume_capabilities:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_capabilities are required")
            for cap in request.volume_capabilities:
                if cap.HasField("block") or cap.access_mode.mode not in _SUPPORTED_MODES:
                    # Not confirmed: say why, as the spec allows.
                    return csi_pb2.ValidateVolumeCapabilitiesResponse(
                        message="hostpath volumes are directories: only file-system access is supported"
                    )
            confirmed = csi_pb2.ValidateVolumeCapabilitiesResponse.Confirmed(
                volume_context=request.volume_context, volume_capabilities=request.volume_capabilities
            )
            return csi_pb2.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

        return _guard(self.state, "ValidateVolumeCapabilities", context, run)

    def ListVolumes(
        self, request: csi_pb2.ListVolumesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ListVolumesResponse:
        def run() -> csi_pb2.ListVolumesResponse:
            names = sorted(os.listdir(self.state.volumes))
            entries = [
                csi_pb2.ListVolumesResponse.Entry(
                    volume=csi_pb2.Volume(volume_id=n),
                    status=csi_pb2.ListVolumesResponse.VolumeStatus(
                        published_node_ids=sorted(self.state.published.get(n, set()))
                    ),
                )
                for n in names
            ]
            return csi_pb2.ListVolumesResponse(entries=entries)

        return _guard(self.state, "ListVolumes", context, run)


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, state: HostPathState) -> None:
        self.state = state

    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        rpc = csi_pb2.NodeServiceCapability.RPC
        resp = csi_pb2.NodeGetCapabilitiesResponse(
            capabilities=[csi_pb2.NodeServiceCapability(rpc=rpc(type=rpc.STAGE_UNSTAGE_VOLUME))]
        )
        return _guard(self.state, "NodeGetCapabilities", context, lambda: resp)

    def NodeGetInfo(
        self, request: csi_pb2.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetInfoResponse:
        resp = csi_pb2.NodeGetInfoResponse(
            node_id=self.state.node_id,
            max_volumes_per_node=64,
            accessible_topology=csi_pb2.Topology(segments={"topology.hostpath.csi/node": self.state.node_id}),
        )
        return _guard(self.state, "NodeGetInfo", context, lambda: resp)

    def NodeStageVolume(
        self, request: csi_pb2.NodeStageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeStageVolumeResponse:
        def run() -> csi_pb2.NodeStageVolumeResponse:
            source = _require_volume(self.state, request.volume_id, context)
            _absolute(request.staging_target_path, "staging_target_path", context)
            _check_capability(request.volume_capability, context)
            target = request.staging_target_path
            if not os.path.isdir(target):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"staging path {target} does not exist")
            if not is_mount_point(target):
                _run("mount", "--bind", source, target)
            return csi_pb2.NodeStageVolumeResponse()

        return _guard(self.state, "NodeStageVolume", context, run)

    def NodeUnstageVolume(
        self, request: csi_pb2.NodeUnstageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnstageVolumeResponse:
        def run() -> csi_pb2.NodeUnstageVolumeResponse:
            if not request.volume_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_id is required")
            _absolute(request.staging_target_path, "staging_target_path", context)
            if os.path.exists(request.staging_target_path) and is_mount_point(request.staging_target_path):
                _run("umount", request.staging_target_path)
            return csi_pb2.NodeUnstageVolumeResponse()

        return _guard(self.state, "NodeUnstageVolume", context, run)

    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        def run() -> csi_pb2.NodePublishVolumeResponse:
            _require_volume(self.state, request.volume_id, context)
            _absolute(request.target_path, "target_path", context)
            _check_capability(request.volume_capability, context)
            if not request.staging_target_path:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "staging_target_path is required: this plugin stages volumes (STAGE_UNSTAGE_VOLUME)",
                )
            if not is_mount_point(request.staging_target_path):
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"volume {request.volume_id} is not staged at the given path"
                )
            target = request.target_path
            if not os.path.isdir(os.path.dirname(target)):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"parent of target path {target} does not exist")
            os.makedirs(target, exist_ok=True)
            if not is_mount_point(target):
                _run("mount", "--bind", request.staging_target_path, target)
                if request.readonly:
                    _run("mount", "-o", "remount,bind,ro", target)
            return csi_pb2.NodePublishVolumeResponse()

        return _guard(self.state, "NodePublishVolume", context, run)

    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        def run() -> csi_pb2.NodeUnpublishVolumeResponse:
            if not request.volume_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_id is required")
            _absolute(request.target_path, "target_path", context)
            target = request.target_path
            if os.path.exists(target):
                if is_mount_point(target):
                    _run("umount", target)
                os.rmdir(target)  # we created it, so we remove it
            return csi_pb2.NodeUnpublishVolumeResponse()

        return _guard(self.state, "NodeUnpublishVolume", context, run)
