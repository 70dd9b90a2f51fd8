"""The hostpath plugin's identity service: its name, its capabilities, and always ready."""

from __future__ import annotations

import grpc
from google.protobuf import wrappers_pb2

from driversdk.csi.hostpath.plugin import NAME, VERSION, HostPathState
from driversdk.csi.hostpath.rpc import rpc
from driversdk.pb import csi_pb2, csi_pb2_grpc


class Identity(csi_pb2_grpc.IdentityServicer):
    def __init__(self, state: HostPathState) -> None:
        self.state = state

    @rpc()
    def GetPluginInfo(
        self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginInfoResponse:
        # The manifest reports per-RPC call counts, which fault tests read back.
        manifest = {f"calls.{k}": str(v) for k, v in self.state.faults.calls.items()}
        return csi_pb2.GetPluginInfoResponse(name=NAME, vendor_version=VERSION, manifest=manifest)

    @rpc()
    def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=self.state.advertised.plugin)

    @rpc()
    def Probe(self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext) -> csi_pb2.ProbeResponse:
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))
