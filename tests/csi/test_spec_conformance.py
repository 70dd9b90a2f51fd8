"""The reference hostpath plugin against the CSI spec's (v1.x) error rules, over real gRPC.

The plugin runs as a real process on a unix socket. ``CASES`` is the table of single calls:
(rpc, request, expected code) for every required field and documented error code of the
Identity, Controller and Node RPCs it advertises — required arguments are checked before any
lookup, so a request missing one answers INVALID_ARGUMENT even when what it names does not
exist. The scenario tests below cover what needs more than one call: idempotency,
ALREADY_EXISTS, FAILED_PRECONDITION, paging, snapshots, expansion; and the last tests check
that the advertised capabilities are exactly the implemented ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from driversdk.csi.client import open_channel
from driversdk.pb import csi_pb2, csi_pb2_grpc

from .conftest import NODE_ID, HostPathPlugin, mounts_under, start_plugin

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXISTS = grpc.StatusCode.ALREADY_EXISTS
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
ABORTED = grpc.StatusCode.ABORTED
OUT_OF_RANGE = grpc.StatusCode.OUT_OF_RANGE
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED

PEER = "csi-node-2"
KNOWN = "conformance-vol"  # created by the module fixture, never staged or published
GONE = "no-such-volume"
TB = 2**50  # larger than any test machine's disk
_Mode = csi_pb2.VolumeCapability.AccessMode
_CTRL = csi_pb2.ControllerServiceCapability.RPC
_NODE = csi_pb2.NodeServiceCapability.RPC
_SERVICE = csi_pb2.PluginCapability.Service


def cap(
    mode: int = _Mode.SINGLE_NODE_WRITER, *, block: bool = False, access_type: bool = True
) -> csi_pb2.VolumeCapability:
    c = csi_pb2.VolumeCapability(access_mode=_Mode(mode=mode))  # type: ignore[arg-type]
    if block:
        c.block.CopyFrom(csi_pb2.VolumeCapability.BlockVolume())
    elif access_type:
        c.mount.CopyFrom(csi_pb2.VolumeCapability.MountVolume())
    return c


SNW = cap()
MULTI = cap(_Mode.MULTI_NODE_MULTI_WRITER)
BLOCK = cap(block=True)
NO_MODE = csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume())
NO_ACCESS_TYPE = cap(access_type=False)
ALPHA_MODE = cap(_Mode.SINGLE_NODE_MULTI_WRITER)  # needs SINGLE_NODE_MULTI_WRITER, not advertised


def rng(required: int = 0, limit: int = 0) -> csi_pb2.CapacityRange:
    return csi_pb2.CapacityRange(required_bytes=required, limit_bytes=limit)


def topology(node: str) -> csi_pb2.Topology:
    return csi_pb2.Topology(segments={"topology.hostpath.csi/node": node})


def snapshot_source(snapshot_id: str) -> csi_pb2.VolumeContentSource:
    return csi_pb2.VolumeContentSource(snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=snapshot_id))


def volume_source(volume_id: str) -> csi_pb2.VolumeContentSource:
    return csi_pb2.VolumeContentSource(volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=volume_id))


@dataclass
class Stubs:
    channel: grpc.Channel
    identity: csi_pb2_grpc.IdentityStub
    controller: csi_pb2_grpc.ControllerStub
    node: csi_pb2_grpc.NodeStub
    group: csi_pb2_grpc.GroupControllerStub
    metadata: csi_pb2_grpc.SnapshotMetadataStub

    @classmethod
    def of(cls, socket: str) -> Stubs:
        ch = open_channel(socket, timeout=5)
        return cls(
            ch,
            csi_pb2_grpc.IdentityStub(ch),
            csi_pb2_grpc.ControllerStub(ch),
            csi_pb2_grpc.NodeStub(ch),
            csi_pb2_grpc.GroupControllerStub(ch),
            csi_pb2_grpc.SnapshotMetadataStub(ch),
        )

    def method(self, rpc: str) -> Callable[..., Message]:
        for stub in (self.identity, self.controller, self.node, self.group):
            fn = getattr(stub, rpc, None)
            if fn is not None:
                return fn  # type: ignore[no-any-return]
        raise KeyError(rpc)

    def code(self, rpc: str, request: Message) -> grpc.StatusCode:
        try:
            self.method(rpc)(request, timeout=30)
        except grpc.RpcError as err:
            return err.code()
        return OK


def expect(code: grpc.StatusCode, fn: Callable[..., Message], request: Message) -> str:
    """Call and assert the code; returns the status message."""
    with pytest.raises(grpc.RpcError) as info:
        fn(request, timeout=30)
    assert info.value.code() == code, info.value.details()
    return str(info.value.details())


# --- the table --------------------------------------------------------------------------------

C = csi_pb2
CASES: list[tuple[str, str, Message, grpc.StatusCode]] = [
    # Identity: all required, no arguments.
    ("identity-info", "GetPluginInfo", C.GetPluginInfoRequest(), OK),
    ("identity-caps", "GetPluginCapabilities", C.GetPluginCapabilitiesRequest(), OK),
    ("identity-probe", "Probe", C.ProbeRequest(), OK),
    ("controller-caps", "ControllerGetCapabilities", C.ControllerGetCapabilitiesRequest(), OK),
    ("node-caps", "NodeGetCapabilities", C.NodeGetCapabilitiesRequest(), OK),
    ("node-info", "NodeGetInfo", C.NodeGetInfoRequest(), OK),
    # CreateVolume
    ("create-no-name", "CreateVolume", C.CreateVolumeRequest(volume_capabilities=[SNW]), INVALID),
    ("create-no-caps", "CreateVolume", C.CreateVolumeRequest(name="t-create"), INVALID),
    ("create-no-mode", "CreateVolume", C.CreateVolumeRequest(name="t-create", volume_capabilities=[NO_MODE]), INVALID),
    (
        "create-no-access-type",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[NO_ACCESS_TYPE]),
        INVALID,
    ),
    ("create-block", "CreateVolume", C.CreateVolumeRequest(name="t-create", volume_capabilities=[BLOCK]), INVALID),
    (
        "create-one-unsupported-cap",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[SNW, BLOCK]),
        INVALID,
    ),
    (
        "create-unadvertised-mode",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[ALPHA_MODE]),
        INVALID,
    ),
    (
        "create-unknown-mode",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[cap(_Mode.UNKNOWN)]),
        INVALID,
    ),
    (
        "create-limit-below-required",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[SNW], capacity_range=rng(2048, 1024)),
        INVALID,
    ),
    (
        "create-negative-capacity",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[SNW], capacity_range=rng(-1)),
        INVALID,
    ),
    (
        "create-empty-capacity-range",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[SNW], capacity_range=rng()),
        INVALID,
    ),
    (
        "create-banned-char-in-name",
        "CreateVolume",
        C.CreateVolumeRequest(name="bad\x07name", volume_capabilities=[SNW]),
        INVALID,
    ),
    ("create-name-too-long", "CreateVolume", C.CreateVolumeRequest(name="n" * 129, volume_capabilities=[SNW]), INVALID),
    (
        "create-mutable-parameters-without-modify",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[SNW], mutable_parameters={"iops": "1"}),
        INVALID,
    ),
    (
        "create-empty-content-source",
        "CreateVolume",
        C.CreateVolumeRequest(
            name="t-create", volume_capabilities=[SNW], volume_content_source=C.VolumeContentSource()
        ),
        INVALID,
    ),
    (
        "create-snapshot-source-without-id",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[SNW], volume_content_source=snapshot_source("")),
        INVALID,
    ),
    (
        "create-unknown-snapshot-source",
        "CreateVolume",
        C.CreateVolumeRequest(
            name="t-create", volume_capabilities=[SNW], volume_content_source=snapshot_source("nope")
        ),
        NOT_FOUND,
    ),
    (
        "create-unknown-volume-source",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[SNW], volume_content_source=volume_source(GONE)),
        NOT_FOUND,
    ),
    (
        "create-capacity-beyond-storage",
        "CreateVolume",
        C.CreateVolumeRequest(name="t-create", volume_capabilities=[SNW], capacity_range=rng(TB)),
        OUT_OF_RANGE,
    ),
    (
        "create-unreachable-topology",
        "CreateVolume",
        C.CreateVolumeRequest(
            name="t-create",
            volume_capabilities=[SNW],
            accessibility_requirements=C.TopologyRequirement(requisite=[topology("elsewhere")]),
        ),
        EXHAUSTED,
    ),
    (
        "create-preferred-outside-requisite",
        "CreateVolume",
        C.CreateVolumeRequest(
            name="t-create",
            volume_capabilities=[SNW],
            accessibility_requirements=C.TopologyRequirement(
                requisite=[topology(NODE_ID)], preferred=[topology("elsewhere")]
            ),
        ),
        INVALID,
    ),
    # DeleteVolume
    ("delete-no-id", "DeleteVolume", C.DeleteVolumeRequest(), INVALID),
    ("delete-unknown-is-ok", "DeleteVolume", C.DeleteVolumeRequest(volume_id=GONE), OK),
    # ControllerPublishVolume
    (
        "cpublish-no-volume-id",
        "ControllerPublishVolume",
        C.ControllerPublishVolumeRequest(node_id=NODE_ID, volume_capability=SNW),
        INVALID,
    ),
    (
        "cpublish-no-node-id",
        "ControllerPublishVolume",
        C.ControllerPublishVolumeRequest(volume_id=KNOWN, volume_capability=SNW),
        INVALID,
    ),
    (
        "cpublish-no-capability",
        "ControllerPublishVolume",
        C.ControllerPublishVolumeRequest(volume_id=KNOWN, node_id=NODE_ID),
        INVALID,
    ),
    (
        "cpublish-args-before-lookup",
        "ControllerPublishVolume",
        C.ControllerPublishVolumeRequest(volume_id=GONE, node_id="nobody"),
        INVALID,
    ),
    (
        "cpublish-block",
        "ControllerPublishVolume",
        C.ControllerPublishVolumeRequest(volume_id=KNOWN, node_id=NODE_ID, volume_capability=BLOCK),
        INVALID,
    ),
    (
        "cpublish-unknown-volume",
        "ControllerPublishVolume",
        C.ControllerPublishVolumeRequest(volume_id=GONE, node_id=NODE_ID, volume_capability=SNW),
        NOT_FOUND,
    ),
    (
        "cpublish-unknown-node",
        "ControllerPublishVolume",
        C.ControllerPublishVolumeRequest(volume_id=KNOWN, node_id="nobody", volume_capability=SNW),
        NOT_FOUND,
    ),
    # ControllerUnpublishVolume
    ("cunpublish-no-volume-id", "ControllerUnpublishVolume", C.ControllerUnpublishVolumeRequest(), INVALID),
    (
        "cunpublish-no-volume-id-with-node",
        "ControllerUnpublishVolume",
        C.ControllerUnpublishVolumeRequest(node_id=NODE_ID),
        INVALID,
    ),
    (
        "cunpublish-unknown-volume-is-ok",
        "ControllerUnpublishVolume",
        C.ControllerUnpublishVolumeRequest(volume_id=GONE, node_id=NODE_ID),
        OK,
    ),
    (
        "cunpublish-unknown-node-is-ok",
        "ControllerUnpublishVolume",
        C.ControllerUnpublishVolumeRequest(volume_id=KNOWN, node_id="nobody"),
        OK,
    ),
    (
        "cunpublish-not-published-is-ok",
        "ControllerUnpublishVolume",
        C.ControllerUnpublishVolumeRequest(volume_id=KNOWN, node_id=NODE_ID),
        OK,
    ),
    # ValidateVolumeCapabilities
    (
        "validate-no-id",
        "ValidateVolumeCapabilities",
        C.ValidateVolumeCapabilitiesRequest(volume_capabilities=[SNW]),
        INVALID,
    ),
    ("validate-no-caps", "ValidateVolumeCapabilities", C.ValidateVolumeCapabilitiesRequest(volume_id=KNOWN), INVALID),
    (
        "validate-no-caps-unknown-volume",
        "ValidateVolumeCapabilities",
        C.ValidateVolumeCapabilitiesRequest(volume_id=GONE),
        INVALID,
    ),
    (
        "validate-cap-without-mode",
        "ValidateVolumeCapabilities",
        C.ValidateVolumeCapabilitiesRequest(volume_id=KNOWN, volume_capabilities=[NO_MODE]),
        INVALID,
    ),
    (
        "validate-unknown-volume",
        "ValidateVolumeCapabilities",
        C.ValidateVolumeCapabilitiesRequest(volume_id=GONE, volume_capabilities=[SNW]),
        NOT_FOUND,
    ),
    (
        "validate-known",
        "ValidateVolumeCapabilities",
        C.ValidateVolumeCapabilitiesRequest(volume_id=KNOWN, volume_capabilities=[SNW]),
        OK,
    ),
    # ListVolumes
    ("list-volumes", "ListVolumes", C.ListVolumesRequest(), OK),
    ("list-volumes-bad-token", "ListVolumes", C.ListVolumesRequest(starting_token="invalid-token"), ABORTED),
    ("list-volumes-negative-max", "ListVolumes", C.ListVolumesRequest(max_entries=-1), INVALID),
    # GetCapacity
    ("capacity", "GetCapacity", C.GetCapacityRequest(), OK),
    ("capacity-with-caps", "GetCapacity", C.GetCapacityRequest(volume_capabilities=[SNW]), OK),
    # ControllerGetVolume
    ("get-volume-no-id", "ControllerGetVolume", C.ControllerGetVolumeRequest(), INVALID),
    ("get-volume-unknown", "ControllerGetVolume", C.ControllerGetVolumeRequest(volume_id=GONE), NOT_FOUND),
    ("get-volume-known", "ControllerGetVolume", C.ControllerGetVolumeRequest(volume_id=KNOWN), OK),
    # ControllerExpandVolume
    ("cexpand-no-id", "ControllerExpandVolume", C.ControllerExpandVolumeRequest(capacity_range=rng(1024)), INVALID),
    ("cexpand-no-range", "ControllerExpandVolume", C.ControllerExpandVolumeRequest(volume_id=KNOWN), INVALID),
    ("cexpand-no-range-unknown", "ControllerExpandVolume", C.ControllerExpandVolumeRequest(volume_id=GONE), INVALID),
    (
        "cexpand-limit-below-required",
        "ControllerExpandVolume",
        C.ControllerExpandVolumeRequest(volume_id=KNOWN, capacity_range=rng(2048, 1024)),
        INVALID,
    ),
    (
        "cexpand-block",
        "ControllerExpandVolume",
        C.ControllerExpandVolumeRequest(volume_id=KNOWN, capacity_range=rng(1024), volume_capability=BLOCK),
        INVALID,
    ),
    (
        "cexpand-unknown",
        "ControllerExpandVolume",
        C.ControllerExpandVolumeRequest(volume_id=GONE, capacity_range=rng(1024)),
        NOT_FOUND,
    ),
    (
        "cexpand-beyond-storage",
        "ControllerExpandVolume",
        C.ControllerExpandVolumeRequest(volume_id=KNOWN, capacity_range=rng(TB)),
        OUT_OF_RANGE,
    ),
    # Snapshots
    ("csnap-no-source", "CreateSnapshot", C.CreateSnapshotRequest(name="t-snap"), INVALID),
    ("csnap-no-name", "CreateSnapshot", C.CreateSnapshotRequest(source_volume_id=KNOWN), INVALID),
    ("csnap-no-name-unknown-source", "CreateSnapshot", C.CreateSnapshotRequest(source_volume_id=GONE), INVALID),
    (
        "csnap-banned-char-in-name",
        "CreateSnapshot",
        C.CreateSnapshotRequest(source_volume_id=KNOWN, name="bad\x00"),
        INVALID,
    ),
    (
        "csnap-unknown-source",
        "CreateSnapshot",
        C.CreateSnapshotRequest(source_volume_id=GONE, name="t-snap"),
        NOT_FOUND,
    ),
    ("dsnap-no-id", "DeleteSnapshot", C.DeleteSnapshotRequest(), INVALID),
    ("dsnap-unknown-is-ok", "DeleteSnapshot", C.DeleteSnapshotRequest(snapshot_id="no-such-snapshot"), OK),
    ("list-snaps", "ListSnapshots", C.ListSnapshotsRequest(), OK),
    ("list-snaps-bad-token", "ListSnapshots", C.ListSnapshotsRequest(starting_token="invalid-token"), ABORTED),
    ("list-snaps-negative-max", "ListSnapshots", C.ListSnapshotsRequest(max_entries=-3), INVALID),
    ("list-snaps-unknown-id-is-empty", "ListSnapshots", C.ListSnapshotsRequest(snapshot_id="no-such-snapshot"), OK),
    ("get-snap-no-id", "GetSnapshot", C.GetSnapshotRequest(), INVALID),
    ("get-snap-unknown", "GetSnapshot", C.GetSnapshotRequest(snapshot_id="no-such-snapshot"), NOT_FOUND),
    # NodeStageVolume
    (
        "stage-no-volume-id",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(staging_target_path="/x/stage", volume_capability=SNW),
        INVALID,
    ),
    ("stage-no-path", "NodeStageVolume", C.NodeStageVolumeRequest(volume_id=KNOWN, volume_capability=SNW), INVALID),
    (
        "stage-relative-path",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(volume_id=KNOWN, staging_target_path="stage", volume_capability=SNW),
        INVALID,
    ),
    (
        "stage-no-capability",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(volume_id=KNOWN, staging_target_path="/x/stage"),
        INVALID,
    ),
    (
        "stage-args-before-lookup",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(volume_id=GONE, staging_target_path="/x/stage"),
        INVALID,
    ),
    (
        "stage-block",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(volume_id=KNOWN, staging_target_path="/x/stage", volume_capability=BLOCK),
        INVALID,
    ),
    (
        "stage-unknown-volume",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(volume_id=GONE, staging_target_path="/x/stage", volume_capability=SNW),
        NOT_FOUND,
    ),
    (
        "stage-missing-staging-dir",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(volume_id=KNOWN, staging_target_path="/x/stage", volume_capability=SNW),
        PRECONDITION,
    ),
    # NodeUnstageVolume
    ("unstage-no-volume-id", "NodeUnstageVolume", C.NodeUnstageVolumeRequest(staging_target_path="/x/s"), INVALID),
    ("unstage-no-path", "NodeUnstageVolume", C.NodeUnstageVolumeRequest(volume_id=KNOWN), INVALID),
    ("unstage-no-path-unknown", "NodeUnstageVolume", C.NodeUnstageVolumeRequest(volume_id=GONE), INVALID),
    (
        "unstage-relative-path",
        "NodeUnstageVolume",
        C.NodeUnstageVolumeRequest(volume_id=KNOWN, staging_target_path="rel"),
        INVALID,
    ),
    (
        "unstage-unknown-volume",
        "NodeUnstageVolume",
        C.NodeUnstageVolumeRequest(volume_id=GONE, staging_target_path="/x/stage"),
        NOT_FOUND,
    ),
    (
        "unstage-not-staged-is-ok",
        "NodeUnstageVolume",
        C.NodeUnstageVolumeRequest(volume_id=KNOWN, staging_target_path="/x/stage"),
        OK,
    ),
    # NodePublishVolume
    (
        "publish-no-volume-id",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(staging_target_path="/x/s", target_path="/x/t", volume_capability=SNW),
        INVALID,
    ),
    (
        "publish-no-target",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(volume_id=KNOWN, staging_target_path="/x/s", volume_capability=SNW),
        INVALID,
    ),
    (
        "publish-relative-target",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(volume_id=KNOWN, staging_target_path="/x/s", target_path="t", volume_capability=SNW),
        INVALID,
    ),
    (
        "publish-no-capability",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(volume_id=KNOWN, staging_target_path="/x/s", target_path="/x/t"),
        INVALID,
    ),
    (
        "publish-args-before-lookup",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(volume_id=GONE, target_path="/x/t"),
        INVALID,
    ),
    (
        "publish-block",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(
            volume_id=KNOWN, staging_target_path="/x/s", target_path="/x/t", volume_capability=BLOCK
        ),
        INVALID,
    ),
    (
        "publish-relative-staging",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(volume_id=KNOWN, staging_target_path="s", target_path="/x/t", volume_capability=SNW),
        INVALID,
    ),
    (
        "publish-no-staging-path",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(volume_id=KNOWN, target_path="/x/t", volume_capability=SNW),
        PRECONDITION,
    ),
    (
        "publish-unknown-volume",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(
            volume_id=GONE, staging_target_path="/x/s", target_path="/x/t", volume_capability=SNW
        ),
        NOT_FOUND,
    ),
    (
        "publish-before-stage",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(
            volume_id=KNOWN, staging_target_path="/x/s", target_path="/x/t", volume_capability=SNW
        ),
        PRECONDITION,
    ),
    # NodeUnpublishVolume
    ("unpublish-no-volume-id", "NodeUnpublishVolume", C.NodeUnpublishVolumeRequest(target_path="/x/t"), INVALID),
    ("unpublish-no-target", "NodeUnpublishVolume", C.NodeUnpublishVolumeRequest(volume_id=KNOWN), INVALID),
    ("unpublish-no-target-unknown", "NodeUnpublishVolume", C.NodeUnpublishVolumeRequest(volume_id=GONE), INVALID),
    (
        "unpublish-relative-target",
        "NodeUnpublishVolume",
        C.NodeUnpublishVolumeRequest(volume_id=KNOWN, target_path="t"),
        INVALID,
    ),
    (
        "unpublish-unknown-volume",
        "NodeUnpublishVolume",
        C.NodeUnpublishVolumeRequest(volume_id=GONE, target_path="/x/t"),
        NOT_FOUND,
    ),
    (
        "unpublish-not-published-is-ok",
        "NodeUnpublishVolume",
        C.NodeUnpublishVolumeRequest(volume_id=KNOWN, target_path="/x/t"),
        OK,
    ),
    # NodeGetVolumeStats
    ("stats-no-volume-id", "NodeGetVolumeStats", C.NodeGetVolumeStatsRequest(volume_path="/x/t"), INVALID),
    ("stats-no-path", "NodeGetVolumeStats", C.NodeGetVolumeStatsRequest(volume_id=KNOWN), INVALID),
    ("stats-no-path-unknown", "NodeGetVolumeStats", C.NodeGetVolumeStatsRequest(volume_id=GONE), INVALID),
    (
        "stats-relative-staging-path",
        "NodeGetVolumeStats",
        C.NodeGetVolumeStatsRequest(volume_id=KNOWN, volume_path="/x/t", staging_target_path="s"),
        INVALID,
    ),
    (
        "stats-unknown-volume",
        "NodeGetVolumeStats",
        C.NodeGetVolumeStatsRequest(volume_id=GONE, volume_path="/x/t"),
        NOT_FOUND,
    ),
    (
        "stats-not-at-path",
        "NodeGetVolumeStats",
        C.NodeGetVolumeStatsRequest(volume_id=KNOWN, volume_path="/x/t"),
        NOT_FOUND,
    ),
    # NodeExpandVolume
    ("nexpand-no-volume-id", "NodeExpandVolume", C.NodeExpandVolumeRequest(volume_path="/x/t"), INVALID),
    ("nexpand-no-path", "NodeExpandVolume", C.NodeExpandVolumeRequest(volume_id=KNOWN), INVALID),
    ("nexpand-no-path-unknown", "NodeExpandVolume", C.NodeExpandVolumeRequest(volume_id=GONE), INVALID),
    (
        "nexpand-limit-below-required",
        "NodeExpandVolume",
        C.NodeExpandVolumeRequest(volume_id=KNOWN, volume_path="/x/t", capacity_range=rng(2048, 1024)),
        INVALID,
    ),
    (
        "nexpand-block",
        "NodeExpandVolume",
        C.NodeExpandVolumeRequest(volume_id=KNOWN, volume_path="/x/t", volume_capability=BLOCK),
        INVALID,
    ),
    (
        "nexpand-unknown-volume",
        "NodeExpandVolume",
        C.NodeExpandVolumeRequest(volume_id=GONE, volume_path="/x/t"),
        NOT_FOUND,
    ),
    (
        "nexpand-not-at-path",
        "NodeExpandVolume",
        C.NodeExpandVolumeRequest(volume_id=KNOWN, volume_path="/x/t"),
        NOT_FOUND,
    ),
]


# --- what csi-sanity (kubernetes-csi/csi-test v5.3.1) expects, row by row ----------------------
# Its requests as it sends them: "some/path" is relative on purpose, and an unknown volume must
# answer NOT_FOUND before anything judges the path. The plugin runs as it starts by default, so
# only GA capabilities are advertised: the alpha RPCs answer UNIMPLEMENTED.

SANITY: list[tuple[str, str, Message, grpc.StatusCode]] = [
    ("sanity-stats-no-volume-id", "NodeGetVolumeStats", C.NodeGetVolumeStatsRequest(volume_path="some/path"), INVALID),
    ("sanity-stats-no-volume-path", "NodeGetVolumeStats", C.NodeGetVolumeStatsRequest(volume_id=GONE), INVALID),
    (
        "sanity-stats-volume-not-found",
        "NodeGetVolumeStats",
        C.NodeGetVolumeStatsRequest(volume_id=GONE, volume_path="some/path"),
        NOT_FOUND,
    ),
    (
        "sanity-stats-volume-not-at-path",
        "NodeGetVolumeStats",
        C.NodeGetVolumeStatsRequest(volume_id=KNOWN, volume_path="some/path"),
        NOT_FOUND,
    ),
    (
        "sanity-stats-unknown-volume-bad-staging-path",
        "NodeGetVolumeStats",
        C.NodeGetVolumeStatsRequest(volume_id=GONE, volume_path="/x/t", staging_target_path="s"),
        NOT_FOUND,
    ),
    (
        "sanity-nexpand-no-volume-id",
        "NodeExpandVolume",
        C.NodeExpandVolumeRequest(volume_path="/x/t", volume_capability=SNW),
        INVALID,
    ),
    (
        "sanity-nexpand-no-volume-path",
        "NodeExpandVolume",
        C.NodeExpandVolumeRequest(volume_id=KNOWN, volume_capability=SNW),
        INVALID,
    ),
    (
        "sanity-nexpand-volume-not-found",
        "NodeExpandVolume",
        C.NodeExpandVolumeRequest(volume_id=GONE, volume_path="some/path"),
        NOT_FOUND,
    ),
    (
        "sanity-nexpand-volume-not-at-path",
        "NodeExpandVolume",
        C.NodeExpandVolumeRequest(volume_id=KNOWN, volume_path="some/path", capacity_range=rng(1024)),
        NOT_FOUND,
    ),
    ("sanity-npublish-empty", "NodePublishVolume", C.NodePublishVolumeRequest(), INVALID),
    ("sanity-npublish-no-target", "NodePublishVolume", C.NodePublishVolumeRequest(volume_id=GONE), INVALID),
    (
        "sanity-npublish-no-capability",
        "NodePublishVolume",
        C.NodePublishVolumeRequest(volume_id=GONE, target_path="/x/t/target"),
        INVALID,
    ),
    ("sanity-nunpublish-empty", "NodeUnpublishVolume", C.NodeUnpublishVolumeRequest(), INVALID),
    ("sanity-nunpublish-no-target", "NodeUnpublishVolume", C.NodeUnpublishVolumeRequest(volume_id=GONE), INVALID),
    (
        "sanity-nstage-no-volume-id",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(
            staging_target_path="/x/s", volume_capability=SNW, publish_context={"device": "/dev/mock"}
        ),
        INVALID,
    ),
    (
        "sanity-nstage-no-staging-path",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(volume_id=GONE, volume_capability=SNW),
        INVALID,
    ),
    (
        "sanity-nstage-no-capability",
        "NodeStageVolume",
        C.NodeStageVolumeRequest(volume_id=KNOWN, staging_target_path="/x/s"),
        INVALID,
    ),
    (
        "sanity-nunstage-no-volume-id",
        "NodeUnstageVolume",
        C.NodeUnstageVolumeRequest(staging_target_path="/x/s"),
        INVALID,
    ),
    ("sanity-nunstage-no-staging-path", "NodeUnstageVolume", C.NodeUnstageVolumeRequest(volume_id=GONE), INVALID),
    ("sanity-list-volumes-bad-token", "ListVolumes", C.ListVolumesRequest(starting_token="invalid-token"), ABORTED),
    ("sanity-create-no-name", "CreateVolume", C.CreateVolumeRequest(), INVALID),
    ("sanity-create-no-capabilities", "CreateVolume", C.CreateVolumeRequest(name="sanity-no-caps"), INVALID),
    # Alpha RPCs are not advertised by default, so they are not served either.
    (
        "sanity-get-volume-alpha-off",
        "ControllerGetVolume",
        C.ControllerGetVolumeRequest(volume_id=KNOWN),
        UNIMPLEMENTED,
    ),
    ("sanity-get-snapshot-alpha-off", "GetSnapshot", C.GetSnapshotRequest(snapshot_id="s"), UNIMPLEMENTED),
]

# The spec's alpha RPCs: the plain table runs them against a plugin started with --alpha.
ALPHA_RPCS = frozenset({"ControllerGetVolume", "GetSnapshot"})


def _table_plugin(base: Path, options: tuple[str, ...] = ()) -> tuple[Stubs, HostPathPlugin]:
    plugin = start_plugin(str(base / "plugin" / "csi.sock"), str(base / "root"), options=options)
    stubs = Stubs.of(plugin.socket)
    stubs.controller.CreateVolume(C.CreateVolumeRequest(name=KNOWN, volume_capabilities=[SNW]), timeout=30)
    return stubs, plugin


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stubs]:
    """One plugin, started as an operator starts it, for the whole table: the table's calls
    change nothing it reads."""
    stubs, plugin = _table_plugin(tmp_path_factory.mktemp("conformance"))
    yield stubs
    stubs.channel.close()
    plugin.stop()


@pytest.fixture(scope="module")
def shared_alpha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stubs]:
    """The same with --alpha: GET_VOLUME, GET_SNAPSHOT and node VOLUME_CONDITION advertised."""
    stubs, plugin = _table_plugin(tmp_path_factory.mktemp("conformance-alpha"), ("--alpha",))
    yield stubs
    stubs.channel.close()
    plugin.stop()


@pytest.mark.parametrize(("rpc", "request_", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_conformance_table(request: pytest.FixtureRequest, rpc: str, request_: Message, code: grpc.StatusCode) -> None:
    stubs: Stubs = request.getfixturevalue("shared_alpha" if rpc in ALPHA_RPCS else "shared")
    assert stubs.code(rpc, request_) == code


@pytest.mark.parametrize(("rpc", "request_", "code"), [c[1:] for c in SANITY], ids=[c[0] for c in SANITY])
def test_conformance_csi_sanity_table(shared: Stubs, rpc: str, request_: Message, code: grpc.StatusCode) -> None:
    assert shared.code(rpc, request_) == code


def test_conformance_default_capabilities_are_all_ga(shared: Stubs) -> None:
    """csi-sanity fails a plugin on any capability its spec does not know ("Unknown capability:
    15"): by default only values the spec does not mark alpha are advertised."""
    ctrl = shared.controller.ControllerGetCapabilities(C.ControllerGetCapabilitiesRequest(), timeout=30)
    node = shared.node.NodeGetCapabilities(C.NodeGetCapabilitiesRequest(), timeout=30)
    alpha = [
        enum.Name(c.rpc.type)
        for enum, caps in ((_CTRL.Type, ctrl.capabilities), (_NODE.Type, node.capabilities))
        for c in caps
        if enum.DESCRIPTOR.values_by_number[c.rpc.type].GetOptions().Extensions[csi_pb2.alpha_enum_value]
    ]
    assert alpha == []


def test_conformance_table_covers_every_served_rpc(shared: Stubs) -> None:
    served = {name for name in dir(csi_pb2_grpc.IdentityServicer) if name[0].isupper()}
    served |= {name for name in dir(csi_pb2_grpc.ControllerServicer) if name[0].isupper()}
    served |= {name for name in dir(csi_pb2_grpc.NodeServicer) if name[0].isupper()}
    served -= {"ControllerModifyVolume"}  # not advertised: see test_conformance_unadvertised_rpcs_are_unimplemented
    assert served == {c[1] for c in CASES}


# --- scenarios --------------------------------------------------------------------------------


@pytest.fixture
def stubs(tmp_path: Path) -> Iterator[tuple[Stubs, HostPathPlugin]]:
    plugin = start_plugin(
        str(tmp_path / "plugin" / "csi.sock"), str(tmp_path / "root"), peers=(PEER,), options=("--alpha",)
    )
    s = Stubs.of(plugin.socket)
    yield s, plugin
    s.channel.close()
    plugin.stop()
    for mount in sorted(mounts_under(tmp_path), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True)


def create(s: Stubs, name: str, capability: csi_pb2.VolumeCapability = SNW, **kw: object) -> csi_pb2.Volume:
    req = C.CreateVolumeRequest(name=name, volume_capabilities=[capability], **kw)  # type: ignore[arg-type]
    return s.controller.CreateVolume(req, timeout=30).volume


def test_conformance_create_volume_idempotent_or_already_exists(stubs: tuple[Stubs, HostPathPlugin]) -> None:
    s, _ = stubs
    first = create(s, "data", capacity_range=rng(1 << 20), parameters={"tier": "gold"})
    assert first.capacity_bytes == 1 << 20 and first.volume_context == {"hostpath": "1"}
    assert list(first.accessible_topology) == [topology(NODE_ID), topology(PEER)]
    # The same name and compatible arguments: the same volume, nothing new provisioned.
    again = create(s, "data", capacity_range=rng(1 << 19, 1 << 21), parameters={"tier": "gold"})
    assert again == first
    assert len(s.controller.ListVolumes(C.ListVolumesRequest(), timeout=30).entries) == 1
    for kw in (
        {"capacity_range": rng(2 << 20), "parameters": {"tier": "gold"}},  # needs more than it has
        {"capacity_range": rng(0, 1 << 19), "parameters": {"tier": "gold"}},  # it is bigger than the limit
        {"capacity_range": rng(1 << 20), "parameters": {"tier": "bronze"}},
        {"capacity_range": rng(1 << 20), "parameters": {"tier": "gold"}, "volume_content_source": volume_source("x")},
    ):
        req = C.CreateVolumeRequest(name="data", volume_capabilities=[SNW], **kw)  # type: ignore[arg-type]
        message = expect(EXISTS, s.controller.CreateVolume, req)
        assert "'data' already exists" in message
    # Any Unicode name is allowed: the id is derived from it, and idempotency holds by name.
    spaced = create(s, "my data ✓")
    assert spaced.volume_id.startswith("vol-") and create(s, "my data ✓") == spaced
    # Topology: a requisite this root satisfies; Nomad's empty requirement means "anywhere".
    both = C.TopologyRequirement(requisite=[topology(NODE_ID), topology(PEER)], preferred=[topology(PEER)])
    assert create(s, "placed", accessibility_requirements=both).accessible_topology == first.accessible_topology
    assert create(s, "anywhere", accessibility_requirements=C.TopologyRequirement()).volume_id == "anywhere"


def test_conformance_delete_volume_idempotent_and_refused_while_published(
    stubs: tuple[Stubs, HostPathPlugin],
) -> None:
    s, plugin = stubs
    vol = create(s, "doomed")
    publish = C.ControllerPublishVolumeRequest(volume_id=vol.volume_id, node_id=NODE_ID, volume_capability=SNW)
    s.controller.ControllerPublishVolume(publish, timeout=30)
    message = expect(PRECONDITION, s.controller.DeleteVolume, C.DeleteVolumeRequest(volume_id=vol.volume_id))
    assert NODE_ID in message
    s.controller.ControllerUnpublishVolume(C.ControllerUnpublishVolumeRequest(volume_id=vol.volume_id), timeout=30)
    for _ in range(2):
        s.controller.DeleteVolume(C.DeleteVolumeRequest(volume_id=vol.volume_id), timeout=30)
    assert not os.path.exists(os.path.join(plugin.root, "volumes", vol.volume_id))
    expect(NOT_FOUND, s.controller.ControllerGetVolume, C.ControllerGetVolumeRequest(volume_id=vol.volume_id))


def test_conformance_list_volumes_pages(stubs: tuple[Stubs, HostPathPlugin]) -> None:
    s, _ = stubs
    names = [f"v{i}" for i in range(5)]
    for name in names:
        create(s, name)
    s.controller.ControllerPublishVolume(
        C.ControllerPublishVolumeRequest(volume_id="v3", node_id=PEER, volume_capability=SNW), timeout=30
    )
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        resp = s.controller.ListVolumes(C.ListVolumesRequest(max_entries=2, starting_token=token), timeout=30)
        assert len(resp.entries) <= 2
        seen += [e.volume.volume_id for e in resp.entries]
        for e in resp.entries:
            assert list(e.status.published_node_ids) == ([PEER] if e.volume.volume_id == "v3" else [])
        pages += 1
        token = resp.next_token
        if not token:
            break
    assert seen == names and pages == 3
    # A token stays valid when the volume it points at is deleted in between.
    first = s.controller.ListVolumes(C.ListVolumesRequest(max_entries=2), timeout=30)
    s.controller.DeleteVolume(C.DeleteVolumeRequest(volume_id="v2"), timeout=30)
    rest = s.controller.ListVolumes(C.ListVolumesRequest(starting_token=first.next_token), timeout=30)
    assert [e.volume.volume_id for e in rest.entries] == ["v3", "v4"] and rest.next_token == ""
    # max_entries larger than the list, and 0 (no limit), return everything without a token.
    for n in (0, 50):
        everything = s.controller.ListVolumes(C.ListVolumesRequest(max_entries=n), timeout=30)
        assert len(everything.entries) == 4 and everything.next_token == ""


def test_conformance_controller_publish_rules(stubs: tuple[Stubs, HostPathPlugin]) -> None:
    s, _ = stubs
    single = create(s, "single").volume_id
    req = C.ControllerPublishVolumeRequest(volume_id=single, node_id=NODE_ID, volume_capability=SNW)
    first = s.controller.ControllerPublishVolume(req, timeout=30)
    assert s.controller.ControllerPublishVolume(req, timeout=30) == first, "idempotent"
    # Same node, another readonly flag or capability: ALREADY_EXISTS.
    ro = C.ControllerPublishVolumeRequest(volume_id=single, node_id=NODE_ID, volume_capability=SNW, readonly=True)
    expect(EXISTS, s.controller.ControllerPublishVolume, ro)
    other_cap = C.ControllerPublishVolumeRequest(volume_id=single, node_id=NODE_ID, volume_capability=MULTI)
    expect(EXISTS, s.controller.ControllerPublishVolume, other_cap)
    # Another node with a single-node mode: FAILED_PRECONDITION naming where it is published.
    elsewhere = C.ControllerPublishVolumeRequest(volume_id=single, node_id=PEER, volume_capability=SNW)
    assert NODE_ID in expect(PRECONDITION, s.controller.ControllerPublishVolume, elsewhere)
    # Unpublish is idempotent; afterwards the other node may have it.
    unpublish = C.ControllerUnpublishVolumeRequest(volume_id=single, node_id=NODE_ID)
    for _ in range(2):
        s.controller.ControllerUnpublishVolume(unpublish, timeout=30)
    s.controller.ControllerPublishVolume(elsewhere, timeout=30)
    # MULTI_NODE volumes publish to several nodes; PUBLISH_READONLY is honoured in publish_context.
    shared = create(s, "shared", MULTI).volume_id
    for node, readonly in ((NODE_ID, False), (PEER, True)):
        r = C.ControllerPublishVolumeRequest(volume_id=shared, node_id=node, volume_capability=MULTI, readonly=readonly)
        ctx = s.controller.ControllerPublishVolume(r, timeout=30).publish_context
        assert ctx.get("readonly") == ("true" if readonly else None)
    got = s.controller.ControllerGetVolume(C.ControllerGetVolumeRequest(volume_id=shared), timeout=30)
    assert list(got.status.published_node_ids) == [NODE_ID, PEER] and got.volume.volume_id == shared
    # An empty node_id unpublishes from every node.
    s.controller.ControllerUnpublishVolume(C.ControllerUnpublishVolumeRequest(volume_id=shared), timeout=30)
    got = s.controller.ControllerGetVolume(C.ControllerGetVolumeRequest(volume_id=shared), timeout=30)
    assert list(got.status.published_node_ids) == []


def test_conformance_controller_publish_stops_at_max_volumes_per_node(stubs: tuple[Stubs, HostPathPlugin]) -> None:
    s, _ = stubs
    info = s.node.NodeGetInfo(C.NodeGetInfoRequest(), timeout=30)
    for i in range(info.max_volumes_per_node):
        volume_id = create(s, f"m{i:02d}").volume_id
        req = C.ControllerPublishVolumeRequest(volume_id=volume_id, node_id=NODE_ID, volume_capability=SNW)
        s.controller.ControllerPublishVolume(req, timeout=30)
    one_more = create(s, "one-more").volume_id
    req = C.ControllerPublishVolumeRequest(volume_id=one_more, node_id=NODE_ID, volume_capability=SNW)
    expect(EXHAUSTED, s.controller.ControllerPublishVolume, req)
    # Another node still has room, and so does this one after an unpublish.
    s.controller.ControllerPublishVolume(
        C.ControllerPublishVolumeRequest(volume_id=one_more, node_id=PEER, volume_capability=MULTI), timeout=30
    )
    s.controller.ControllerUnpublishVolume(C.ControllerUnpublishVolumeRequest(volume_id="m00"), timeout=30)
    multi = C.ControllerPublishVolumeRequest(volume_id=one_more, node_id=NODE_ID, volume_capability=MULTI)
    s.controller.ControllerPublishVolume(multi, timeout=30)


def test_conformance_node_stage_publish_rules(stubs: tuple[Stubs, HostPathPlugin], tmp_path: Path) -> None:
    s, _ = stubs
    vol = create(s, "nodevol").volume_id
    stage, other_stage = tmp_path / "stage", tmp_path / "stage2"
    stage.mkdir()
    other_stage.mkdir()
    target, second = tmp_path / "pub" / "t1", tmp_path / "pub" / "t2"
    target.parent.mkdir()
    stage_req = C.NodeStageVolumeRequest(volume_id=vol, staging_target_path=str(stage), volume_capability=SNW)
    for _ in range(2):
        s.node.NodeStageVolume(stage_req, timeout=30)  # idempotent
    assert mounts_under(stage) == [str(stage)]
    restage = C.NodeStageVolumeRequest(volume_id=vol, staging_target_path=str(stage), volume_capability=MULTI)
    expect(EXISTS, s.node.NodeStageVolume, restage)

    def publish(
        path: Path, staging: Path = stage, capability: csi_pb2.VolumeCapability = SNW, ro: bool = False
    ) -> C.NodePublishVolumeRequest:
        return C.NodePublishVolumeRequest(
            volume_id=vol,
            staging_target_path=str(staging),
            target_path=str(path),
            volume_capability=capability,
            readonly=ro,
        )

    # Publish before stage (STAGE_UNSTAGE_VOLUME is advertised): FAILED_PRECONDITION.
    expect(PRECONDITION, s.node.NodePublishVolume, publish(target, other_stage))
    for _ in range(2):
        s.node.NodePublishVolume(publish(target), timeout=30)  # the plugin creates the target; idempotent
    assert str(target) in mounts_under(tmp_path / "pub")
    expect(EXISTS, s.node.NodePublishVolume, publish(target, ro=True))
    expect(EXISTS, s.node.NodePublishVolume, publish(target, capability=MULTI))
    # A single-node mode allows one target on the node.
    expect(PRECONDITION, s.node.NodePublishVolume, publish(second))
    stats = s.node.NodeGetVolumeStats(C.NodeGetVolumeStatsRequest(volume_id=vol, volume_path=str(target)), timeout=30)
    assert not stats.volume_condition.abnormal
    unpublish = C.NodeUnpublishVolumeRequest(volume_id=vol, target_path=str(target))
    for _ in range(2):
        s.node.NodeUnpublishVolume(unpublish, timeout=30)
    assert not target.exists(), "the plugin removes the target it created"
    unstage = C.NodeUnstageVolumeRequest(volume_id=vol, staging_target_path=str(stage))
    for _ in range(2):
        s.node.NodeUnstageVolume(unstage, timeout=30)
    assert mounts_under(tmp_path) == []


def test_conformance_multi_node_volume_publishes_to_several_targets(
    stubs: tuple[Stubs, HostPathPlugin], tmp_path: Path
) -> None:
    s, _ = stubs
    vol = create(s, "multi", MULTI).volume_id
    stage = tmp_path / "stage"
    stage.mkdir()
    s.node.NodeStageVolume(
        C.NodeStageVolumeRequest(volume_id=vol, staging_target_path=str(stage), volume_capability=MULTI), timeout=30
    )
    for name in ("a", "b"):
        req = C.NodePublishVolumeRequest(
            volume_id=vol, staging_target_path=str(stage), target_path=str(tmp_path / name), volume_capability=MULTI
        )
        s.node.NodePublishVolume(req, timeout=30)
    (tmp_path / "a" / "f").write_text("x")
    assert (tmp_path / "b" / "f").read_text() == "x"
    for name in ("a", "b"):
        s.node.NodeUnpublishVolume(C.NodeUnpublishVolumeRequest(volume_id=vol, target_path=str(tmp_path / name)))
    s.node.NodeUnstageVolume(C.NodeUnstageVolumeRequest(volume_id=vol, staging_target_path=str(stage)))
    assert mounts_under(tmp_path) == []


def test_conformance_snapshots(stubs: tuple[Stubs, HostPathPlugin], tmp_path: Path) -> None:
    s, plugin = stubs
    src = create(s, "src", capacity_range=rng(1 << 20)).volume_id
    other = create(s, "other").volume_id
    Path(plugin.root, "volumes", src, "data.txt").write_text("v1")
    snap = s.controller.CreateSnapshot(
        C.CreateSnapshotRequest(source_volume_id=src, name="snap-1"), timeout=30
    ).snapshot
    assert snap.source_volume_id == src and snap.ready_to_use and snap.size_bytes == 1 << 20
    assert snap.creation_time.seconds > 0
    again = s.controller.CreateSnapshot(C.CreateSnapshotRequest(source_volume_id=src, name="snap-1"), timeout=30)
    assert again.snapshot == snap, "idempotent by name"
    message = expect(
        EXISTS, s.controller.CreateSnapshot, C.CreateSnapshotRequest(source_volume_id=other, name="snap-1")
    )
    assert src in message
    Path(plugin.root, "volumes", src, "data.txt").write_text("v2")  # the snapshot is a point in time
    for i in range(2, 5):
        s.controller.CreateSnapshot(C.CreateSnapshotRequest(source_volume_id=other, name=f"snap-{i}"), timeout=30)
    # Paging and filters.
    seen, token = [], ""
    while True:
        resp = s.controller.ListSnapshots(C.ListSnapshotsRequest(max_entries=3, starting_token=token), timeout=30)
        seen += [e.snapshot.snapshot_id for e in resp.entries]
        token = resp.next_token
        if not token:
            break
    assert seen == ["snap-1", "snap-2", "snap-3", "snap-4"]
    by_source = s.controller.ListSnapshots(C.ListSnapshotsRequest(source_volume_id=src), timeout=30)
    assert [e.snapshot.snapshot_id for e in by_source.entries] == ["snap-1"]
    by_id = s.controller.ListSnapshots(C.ListSnapshotsRequest(snapshot_id="snap-3"), timeout=30)
    assert [e.snapshot.source_volume_id for e in by_id.entries] == [other]
    assert s.controller.GetSnapshot(C.GetSnapshotRequest(snapshot_id="snap-1"), timeout=30).snapshot == snap
    # A volume from the snapshot (required by CREATE_DELETE_SNAPSHOT) holds its data, and may not be smaller.
    too_small = C.CreateVolumeRequest(
        name="restored",
        volume_capabilities=[SNW],
        capacity_range=rng(0, 1024),
        volume_content_source=snapshot_source("snap-1"),
    )
    expect(OUT_OF_RANGE, s.controller.CreateVolume, too_small)
    restored = create(s, "restored", volume_content_source=snapshot_source("snap-1"))
    assert restored.content_source.snapshot.snapshot_id == "snap-1" and restored.capacity_bytes == 1 << 20
    assert Path(plugin.root, "volumes", restored.volume_id, "data.txt").read_text() == "v1"
    # CLONE_VOLUME: a volume from a volume.
    clone = create(s, "clone", volume_content_source=volume_source(src))
    assert clone.content_source.volume.volume_id == src
    assert Path(plugin.root, "volumes", clone.volume_id, "data.txt").read_text() == "v2"
    # Snapshots outlive their source volume and delete idempotently.
    s.controller.DeleteVolume(C.DeleteVolumeRequest(volume_id=src), timeout=30)
    assert s.controller.GetSnapshot(C.GetSnapshotRequest(snapshot_id="snap-1"), timeout=30).snapshot == snap
    for _ in range(2):
        s.controller.DeleteSnapshot(C.DeleteSnapshotRequest(snapshot_id="snap-1"), timeout=30)
    expect(NOT_FOUND, s.controller.GetSnapshot, C.GetSnapshotRequest(snapshot_id="snap-1"))
    assert Path(plugin.root, "volumes", restored.volume_id, "data.txt").read_text() == "v1"


def test_conformance_expansion_and_stats(stubs: tuple[Stubs, HostPathPlugin], tmp_path: Path) -> None:
    s, plugin = stubs
    vol = create(s, "grow", capacity_range=rng(1 << 20)).volume_id
    stage = tmp_path / "stage"
    stage.mkdir()
    s.node.NodeStageVolume(
        C.NodeStageVolumeRequest(volume_id=vol, staging_target_path=str(stage), volume_capability=SNW), timeout=30
    )
    grow = C.ControllerExpandVolumeRequest(volume_id=vol, capacity_range=rng(2 << 20))
    for _ in range(2):  # idempotent; ONLINE: the volume is in use on the node
        resp = s.controller.ControllerExpandVolume(grow, timeout=30)
        assert resp.capacity_bytes == 2 << 20 and resp.node_expansion_required
    smaller = C.ControllerExpandVolumeRequest(volume_id=vol, capacity_range=rng(1 << 10))
    assert s.controller.ControllerExpandVolume(smaller, timeout=30).capacity_bytes == 2 << 20
    shrink = C.ControllerExpandVolumeRequest(volume_id=vol, capacity_range=rng(1 << 10, 1 << 20))
    expect(OUT_OF_RANGE, s.controller.ControllerExpandVolume, shrink)
    node_grow = C.NodeExpandVolumeRequest(
        volume_id=vol, volume_path=str(stage), staging_target_path=str(stage), capacity_range=rng(2 << 20)
    )
    assert s.node.NodeExpandVolume(node_grow, timeout=30).capacity_bytes == 2 << 20
    beyond = C.NodeExpandVolumeRequest(volume_id=vol, volume_path=str(stage), capacity_range=rng(4 << 20))
    expect(OUT_OF_RANGE, s.node.NodeExpandVolume, beyond)
    Path(plugin.root, "volumes", vol, "blob").write_bytes(b"x" * 4096)
    stats = s.node.NodeGetVolumeStats(C.NodeGetVolumeStatsRequest(volume_id=vol, volume_path=str(stage)), timeout=30)
    by_unit = {u.unit: u for u in stats.usage}
    size = by_unit[csi_pb2.VolumeUsage.BYTES]
    assert (size.total, size.used) == (2 << 20, 4096) and 0 <= size.available <= size.total - 4096
    assert by_unit[csi_pb2.VolumeUsage.INODES].total > 0
    assert stats.HasField("volume_condition") and not stats.volume_condition.abnormal
    # Unmounted behind the plugin's back: VOLUME_CONDITION reports it.
    subprocess.run(["umount", str(stage)], check=True)
    stats = s.node.NodeGetVolumeStats(C.NodeGetVolumeStatsRequest(volume_id=vol, volume_path=str(stage)), timeout=30)
    assert stats.volume_condition.abnormal and str(stage) in stats.volume_condition.message
    s.node.NodeUnstageVolume(C.NodeUnstageVolumeRequest(volume_id=vol, staging_target_path=str(stage)), timeout=30)


def test_conformance_get_capacity(stubs: tuple[Stubs, HostPathPlugin]) -> None:
    s, plugin = stubs
    resp = s.controller.GetCapacity(C.GetCapacityRequest(volume_capabilities=[SNW]), timeout=30)
    free = shutil.disk_usage(plugin.root)
    assert 0 < resp.available_capacity <= free.total and resp.maximum_volume_size.value == free.total
    assert (
        s.controller.GetCapacity(C.GetCapacityRequest(volume_capabilities=[BLOCK]), timeout=30).available_capacity == 0
    )
    elsewhere = C.GetCapacityRequest(accessible_topology=topology("elsewhere"))
    assert s.controller.GetCapacity(elsewhere, timeout=30).available_capacity == 0
    here = C.GetCapacityRequest(accessible_topology=topology(PEER))
    assert s.controller.GetCapacity(here, timeout=30).available_capacity > 0


def test_conformance_state_survives_a_restart(tmp_path: Path) -> None:
    socket, root = str(tmp_path / "plugin" / "csi.sock"), str(tmp_path / "root")
    plugin = start_plugin(socket, root, options=("--alpha",))
    s = Stubs.of(socket)
    vol = create(s, "kept", capacity_range=rng(1 << 20)).volume_id
    s.controller.ControllerPublishVolume(
        C.ControllerPublishVolumeRequest(volume_id=vol, node_id=NODE_ID, volume_capability=SNW), timeout=30
    )
    s.channel.close()
    plugin.kill()
    plugin = start_plugin(socket, root, options=("--alpha",))
    s = Stubs.of(socket)
    try:
        # Still the same volume for its name, still published, still refusing an incompatible size.
        assert create(s, "kept", capacity_range=rng(1 << 20)).volume_id == vol
        got = s.controller.ControllerGetVolume(C.ControllerGetVolumeRequest(volume_id=vol), timeout=30)
        assert list(got.status.published_node_ids) == [NODE_ID]
        expect(
            EXISTS,
            s.controller.CreateVolume,
            C.CreateVolumeRequest(name="kept", volume_capabilities=[SNW], capacity_range=rng(2 << 20)),
        )
    finally:
        s.channel.close()
        plugin.stop()


def test_conformance_ids_never_leave_the_root(stubs: tuple[Stubs, HostPathPlugin]) -> None:
    s, plugin = stubs
    keep = create(s, "keep").volume_id
    s.controller.CreateSnapshot(C.CreateSnapshotRequest(source_volume_id=keep, name="keep-snap"), timeout=30)
    for hostile in (".", "..", "../..", "/", "volumes/../.."):
        s.controller.DeleteVolume(C.DeleteVolumeRequest(volume_id=hostile), timeout=30)
        s.controller.DeleteSnapshot(C.DeleteSnapshotRequest(snapshot_id=hostile), timeout=30)
        expect(NOT_FOUND, s.controller.ControllerGetVolume, C.ControllerGetVolumeRequest(volume_id=hostile))
        expect(NOT_FOUND, s.controller.GetSnapshot, C.GetSnapshotRequest(snapshot_id=hostile))
        stage = C.NodeStageVolumeRequest(volume_id=hostile, staging_target_path="/x/s", volume_capability=SNW)
        expect(NOT_FOUND, s.node.NodeStageVolume, stage)
    assert os.path.isdir(os.path.join(plugin.root, "volumes", keep))
    assert os.path.isdir(os.path.join(plugin.root, "snapshots", "keep-snap"))
    # Such names are still valid names: their ids are derived, inside the root.
    for name in ("..", "../escape", ".hidden"):
        volume_id = create(s, name).volume_id
        assert volume_id.startswith("vol-")
        assert os.path.isdir(os.path.join(plugin.root, "volumes", volume_id))
    assert sorted(os.listdir(plugin.root)) == [
        "hostpath-state.json",
        "hostpath-state.lock",
        "partial",
        "snapshots",
        "volumes",
    ]
    assert os.listdir(os.path.join(plugin.root, "partial")) == []


def test_conformance_pre_provisioned_directory_is_a_volume(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "volumes" / "by-hand").mkdir(parents=True)
    plugin = start_plugin(str(tmp_path / "plugin" / "csi.sock"), str(root))
    s = Stubs.of(plugin.socket)
    try:
        ok = C.ValidateVolumeCapabilitiesRequest(volume_id="by-hand", volume_capabilities=[SNW])
        assert s.controller.ValidateVolumeCapabilities(ok, timeout=30).HasField("confirmed")
        block = C.ValidateVolumeCapabilitiesRequest(volume_id="by-hand", volume_capabilities=[BLOCK])
        answer = s.controller.ValidateVolumeCapabilities(block, timeout=30)
        assert not answer.HasField("confirmed") and "only file-system access" in answer.message
        listed = s.controller.ListVolumes(C.ListVolumesRequest(), timeout=30)
        assert [(e.volume.volume_id, e.volume.capacity_bytes) for e in listed.entries] == [("by-hand", 0)]
    finally:
        s.channel.close()
        plugin.stop()


# --- advertised == implemented ----------------------------------------------------------------

CONTROLLER_RPCS: dict[int, tuple[str, ...]] = {
    _CTRL.CREATE_DELETE_VOLUME: ("CreateVolume", "DeleteVolume"),
    _CTRL.PUBLISH_UNPUBLISH_VOLUME: ("ControllerPublishVolume", "ControllerUnpublishVolume"),
    _CTRL.LIST_VOLUMES: ("ListVolumes",),
    _CTRL.GET_CAPACITY: ("GetCapacity",),
    _CTRL.CREATE_DELETE_SNAPSHOT: ("CreateSnapshot", "DeleteSnapshot"),
    _CTRL.LIST_SNAPSHOTS: ("ListSnapshots",),
    _CTRL.EXPAND_VOLUME: ("ControllerExpandVolume",),
    _CTRL.GET_VOLUME: ("ControllerGetVolume",),
    _CTRL.MODIFY_VOLUME: ("ControllerModifyVolume",),
    _CTRL.GET_SNAPSHOT: ("GetSnapshot",),
}
NODE_RPCS: dict[int, tuple[str, ...]] = {
    _NODE.STAGE_UNSTAGE_VOLUME: ("NodeStageVolume", "NodeUnstageVolume"),
    _NODE.GET_VOLUME_STATS: ("NodeGetVolumeStats",),
    _NODE.EXPAND_VOLUME: ("NodeExpandVolume",),
}
REQUESTS: dict[str, Message] = {
    "CreateVolume": C.CreateVolumeRequest(),
    "DeleteVolume": C.DeleteVolumeRequest(),
    "ControllerPublishVolume": C.ControllerPublishVolumeRequest(),
    "ControllerUnpublishVolume": C.ControllerUnpublishVolumeRequest(),
    "ListVolumes": C.ListVolumesRequest(),
    "GetCapacity": C.GetCapacityRequest(),
    "CreateSnapshot": C.CreateSnapshotRequest(),
    "DeleteSnapshot": C.DeleteSnapshotRequest(),
    "ListSnapshots": C.ListSnapshotsRequest(),
    "ControllerExpandVolume": C.ControllerExpandVolumeRequest(),
    "ControllerGetVolume": C.ControllerGetVolumeRequest(),
    "ControllerModifyVolume": C.ControllerModifyVolumeRequest(),
    "GetSnapshot": C.GetSnapshotRequest(),
    "NodeStageVolume": C.NodeStageVolumeRequest(),
    "NodeUnstageVolume": C.NodeUnstageVolumeRequest(),
    "NodeGetVolumeStats": C.NodeGetVolumeStatsRequest(),
    "NodeExpandVolume": C.NodeExpandVolumeRequest(),
}


def test_conformance_advertises_exactly_this(shared: Stubs) -> None:
    plugin = shared.identity.GetPluginCapabilities(C.GetPluginCapabilitiesRequest(), timeout=30).capabilities
    assert {c.service.type for c in plugin if c.HasField("service")} == {
        _SERVICE.CONTROLLER_SERVICE,
        _SERVICE.VOLUME_ACCESSIBILITY_CONSTRAINTS,
    }
    expansion = csi_pb2.PluginCapability.VolumeExpansion
    assert [c.volume_expansion.type for c in plugin if c.HasField("volume_expansion")] == [expansion.ONLINE]
    ctrl = shared.controller.ControllerGetCapabilities(C.ControllerGetCapabilitiesRequest(), timeout=30)
    assert {_CTRL.Type.Name(c.rpc.type) for c in ctrl.capabilities} == {
        "CREATE_DELETE_VOLUME",
        "PUBLISH_UNPUBLISH_VOLUME",
        "LIST_VOLUMES",
        "GET_CAPACITY",
        "CREATE_DELETE_SNAPSHOT",
        "LIST_SNAPSHOTS",
        "CLONE_VOLUME",
        "PUBLISH_READONLY",
        "EXPAND_VOLUME",
        "LIST_VOLUMES_PUBLISHED_NODES",
    }
    node = shared.node.NodeGetCapabilities(C.NodeGetCapabilitiesRequest(), timeout=30)
    assert {_NODE.Type.Name(c.rpc.type) for c in node.capabilities} == {
        "STAGE_UNSTAGE_VOLUME",
        "GET_VOLUME_STATS",
        "EXPAND_VOLUME",
    }
    # VOLUME_ACCESSIBILITY_CONSTRAINTS: the node and its volumes say where they are.
    info = shared.node.NodeGetInfo(C.NodeGetInfoRequest(), timeout=30)
    assert info.accessible_topology == topology(NODE_ID)
    listed = shared.controller.ListVolumes(C.ListVolumesRequest(), timeout=30)
    assert [list(e.volume.accessible_topology) for e in listed.entries] == [[topology(NODE_ID)]]


def test_conformance_alpha_and_without_change_what_is_advertised_and_served(
    shared_alpha: Stubs, tmp_path: Path
) -> None:
    ctrl = shared_alpha.controller.ControllerGetCapabilities(C.ControllerGetCapabilitiesRequest(), timeout=30)
    node = shared_alpha.node.NodeGetCapabilities(C.NodeGetCapabilitiesRequest(), timeout=30)
    assert {"GET_VOLUME", "GET_SNAPSHOT"} <= {_CTRL.Type.Name(c.rpc.type) for c in ctrl.capabilities}
    assert "VOLUME_CONDITION" in {_NODE.Type.Name(c.rpc.type) for c in node.capabilities}
    plugin = start_plugin(
        str(tmp_path / "p" / "csi.sock"),
        str(tmp_path / "root"),
        options=("--without", "LIST_SNAPSHOTS", "--without", "EXPAND_VOLUME"),
    )
    s = Stubs.of(plugin.socket)
    try:
        ctrl = s.controller.ControllerGetCapabilities(C.ControllerGetCapabilitiesRequest(), timeout=30)
        names = {_CTRL.Type.Name(c.rpc.type) for c in ctrl.capabilities}
        assert "LIST_SNAPSHOTS" not in names and "EXPAND_VOLUME" not in names and "CREATE_DELETE_SNAPSHOT" in names
        node = s.node.NodeGetCapabilities(C.NodeGetCapabilitiesRequest(), timeout=30)
        assert "EXPAND_VOLUME" not in {_NODE.Type.Name(c.rpc.type) for c in node.capabilities}
        caps = s.identity.GetPluginCapabilities(C.GetPluginCapabilitiesRequest(), timeout=30).capabilities
        assert not any(c.HasField("volume_expansion") for c in caps), "no expansion at all: no expansion type"
        assert s.code("ListSnapshots", C.ListSnapshotsRequest()) == UNIMPLEMENTED
        req = C.ControllerExpandVolumeRequest(volume_id=KNOWN, capacity_range=rng(1024))
        assert s.code("ControllerExpandVolume", req) == UNIMPLEMENTED
    finally:
        s.channel.close()
        plugin.stop()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "driversdk.csi.hostpath",
            "--endpoint",
            f"unix://{tmp_path}/b.sock",
            "--without",
            "NOPE",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "capability 'NOPE' is not one this plugin has" in bad.stderr


@pytest.mark.parametrize("which", ["shared", "shared_alpha"])
def test_conformance_advertised_rpcs_answer_and_others_are_unimplemented(
    request: pytest.FixtureRequest, which: str
) -> None:
    shared: Stubs = request.getfixturevalue(which)
    ctrl = {
        c.rpc.type
        for c in shared.controller.ControllerGetCapabilities(
            C.ControllerGetCapabilitiesRequest(), timeout=30
        ).capabilities
    }
    node = {
        c.rpc.type for c in shared.node.NodeGetCapabilities(C.NodeGetCapabilitiesRequest(), timeout=30).capabilities
    }
    checked = 0
    for table, advertised in ((CONTROLLER_RPCS, ctrl), (NODE_RPCS, node)):
        for capability, rpcs in table.items():
            for rpc in rpcs:
                code = shared.code(rpc, REQUESTS[rpc])
                if capability in advertised:
                    assert code != UNIMPLEMENTED, rpc
                else:
                    assert code == UNIMPLEMENTED, rpc
                checked += 1
    assert checked == len(REQUESTS)


def test_conformance_unadvertised_rpcs_are_unimplemented(shared: Stubs) -> None:
    # MODIFY_VOLUME is not advertised; neither are GROUP_CONTROLLER_SERVICE and SNAPSHOT_METADATA_SERVICE.
    assert shared.code("ControllerModifyVolume", C.ControllerModifyVolumeRequest(volume_id=KNOWN)) == UNIMPLEMENTED
    req = C.GroupControllerGetCapabilitiesRequest()
    assert shared.code("GroupControllerGetCapabilities", req) == UNIMPLEMENTED
    stream = shared.metadata.GetMetadataAllocated(C.GetMetadataAllocatedRequest(snapshot_id="x"), timeout=30)
    with pytest.raises(grpc.RpcError) as info:
        list(stream)
    assert info.value.code() == UNIMPLEMENTED
    # Controller VOLUME_CONDITION is not advertised, so volumes carry no condition there.
    listed = shared.controller.ListVolumes(C.ListVolumesRequest(), timeout=30)
    assert all(not e.status.HasField("volume_condition") for e in listed.entries)
