"""The order of what every hostpath RPC does before its own logic, over real gRPC to the plugin
process: an RPC whose capability is not advertised answers UNIMPLEMENTED before any fault is
counted; an injected fault comes before the argument checks; the required arguments are judged
in order, each INVALID_ARGUMENT naming its field; an OSError of the method is INTERNAL naming
the RPC."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from driversdk.csi.client import open_channel
from driversdk.pb import csi_pb2 as C
from driversdk.pb import csi_pb2_grpc

from .conftest import HostPathPlugin, mounts_under

_Mode = C.VolumeCapability.AccessMode
SNW = C.VolumeCapability(access_mode=_Mode(mode=_Mode.SINGLE_NODE_WRITER), mount=C.VolumeCapability.MountVolume())
BLOCK = C.VolumeCapability(access_mode=_Mode(mode=_Mode.SINGLE_NODE_WRITER), block=C.VolumeCapability.BlockVolume())


def answer(fn: Callable[..., Message], request: Message) -> tuple[grpc.StatusCode, str]:
    try:
        fn(request, timeout=30)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.fixture
def channel_to(plugin_factory: Callable[..., HostPathPlugin]) -> Iterator[Callable[..., grpc.Channel]]:
    opened: list[grpc.Channel] = []

    def make(faults: str = "", options: tuple[str, ...] = ()) -> grpc.Channel:
        channel = open_channel(plugin_factory(faults, options).socket, timeout=10)
        opened.append(channel)
        return channel

    yield make
    for channel in opened:
        channel.close()


def calls_counted(channel: grpc.Channel) -> dict[str, str]:
    info = csi_pb2_grpc.IdentityStub(channel).GetPluginInfo(C.GetPluginInfoRequest(), timeout=30)
    return dict(info.manifest)


def test_an_unadvertised_rpc_is_unimplemented_before_its_fault_or_arguments(
    channel_to: Callable[..., grpc.Channel],
) -> None:
    channel = channel_to("DeleteSnapshot=UNAVAILABLE:1", ("--without", "CREATE_DELETE_SNAPSHOT"))
    code, detail = answer(csi_pb2_grpc.ControllerStub(channel).DeleteSnapshot, C.DeleteSnapshotRequest())
    assert (code, detail) == (
        grpc.StatusCode.UNIMPLEMENTED,
        "DeleteSnapshot is not served: this plugin does not advertise the controller capability CREATE_DELETE_SNAPSHOT",
    )
    assert "calls.DeleteSnapshot" not in calls_counted(channel), "the fault was not reached, nor the call counted"


def test_an_injected_fault_comes_before_the_argument_checks(channel_to: Callable[..., grpc.Channel]) -> None:
    channel = channel_to("NodeStageVolume=UNAVAILABLE:1")
    node = csi_pb2_grpc.NodeStub(channel)
    assert answer(node.NodeStageVolume, C.NodeStageVolumeRequest()) == (
        grpc.StatusCode.UNAVAILABLE,
        "injected fault: NodeStageVolume fails with UNAVAILABLE",
    )
    # The fault is spent: the same empty request now meets the argument checks.
    assert answer(node.NodeStageVolume, C.NodeStageVolumeRequest()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "volume_id is required",
    )
    assert calls_counted(channel)["calls.NodeStageVolume"] == "2"


def test_required_arguments_are_judged_in_order_each_naming_its_field(
    channel_to: Callable[..., grpc.Channel],
) -> None:
    channel = channel_to()
    node, controller = csi_pb2_grpc.NodeStub(channel), csi_pb2_grpc.ControllerStub(channel)
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    # Nothing here exists: every answer is about the arguments, none about a lookup.
    publish = [
        (C.NodePublishVolumeRequest(), "volume_id is required"),
        (C.NodePublishVolumeRequest(volume_id="nope"), "target_path is required"),
        (
            C.NodePublishVolumeRequest(volume_id="nope", target_path="rel"),
            "target_path must be an absolute path, got 'rel'",
        ),
        (C.NodePublishVolumeRequest(volume_id="nope", target_path="/t"), "volume_capability is required"),
        (
            C.NodePublishVolumeRequest(volume_id="nope", target_path="/t", volume_capability=BLOCK),
            "volume_capability: block access is not supported, hostpath volumes are directories",
        ),
    ]
    for request, detail in publish:
        assert answer(node.NodePublishVolume, request) == (invalid, detail)
    assert answer(node.NodeGetVolumeStats, C.NodeGetVolumeStatsRequest(volume_id="nope")) == (
        invalid,
        "volume_path is required",
    )
    assert answer(controller.ControllerPublishVolume, C.ControllerPublishVolumeRequest(volume_id="nope")) == (
        invalid,
        "node_id is required",
    )
    assert answer(controller.ControllerExpandVolume, C.ControllerExpandVolumeRequest(volume_id="nope")) == (
        invalid,
        "capacity_range is required",
    )
    validate = C.ValidateVolumeCapabilitiesRequest(volume_id="nope")
    assert answer(controller.ValidateVolumeCapabilities, validate) == (invalid, "volume_capabilities are required")


def test_an_os_error_of_the_method_is_internal_naming_the_rpc(
    channel_to: Callable[..., grpc.Channel], tmp_path: Path
) -> None:
    channel = channel_to()
    node, controller = csi_pb2_grpc.NodeStub(channel), csi_pb2_grpc.ControllerStub(channel)
    volume = controller.CreateVolume(C.CreateVolumeRequest(name="preamble", volume_capabilities=[SNW]), timeout=30)
    volume_id = volume.volume.volume_id
    stage = tmp_path / "stage"
    stage.mkdir()
    node.NodeStageVolume(
        C.NodeStageVolumeRequest(volume_id=volume_id, staging_target_path=str(stage), volume_capability=SNW),
        timeout=30,
    )
    target = tmp_path / "a-file"  # a file where the target directory is to be made
    target.write_text("")
    publish = C.NodePublishVolumeRequest(
        volume_id=volume_id, staging_target_path=str(stage), target_path=str(target), volume_capability=SNW
    )
    code, detail = answer(node.NodePublishVolume, publish)
    assert code == grpc.StatusCode.INTERNAL
    assert detail == f"NodePublishVolume: [Errno 17] File exists: '{target}'"
    assert mounts_under(tmp_path) == [str(stage)], "nothing was mounted at the target"
    node.NodeUnstageVolume(C.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=str(stage)), timeout=30)
    assert mounts_under(tmp_path) == []
