"""CSI error kinds come from the gRPC call and code, never from a sentence's text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from driversdk.csi.client import CSIClient
from driversdk.csi.errors import IGNORABLE, CallContext, CSIError, unpack
from driversdk.csi.model import AccessMode, AttachmentMode, Volume, VolumeCapability
from driversdk.pb import csi_pb2

from .conftest import NODE_ID, HostPathPlugin


def _volume(client: CSIClient) -> Volume:
    cap = VolumeCapability(AccessMode.MULTI_NODE_MULTI_WRITER, AttachmentMode.FILE_SYSTEM)
    resp = client.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(name="vol1", volume_capabilities=[cap.to_proto()])
    )
    return Volume(id="nomad-vol1", plugin_id="hostpath", external_id=resp.volume.volume_id, capabilities=[cap])


def _calls(client: CSIClient, rpc: str) -> int:
    return int(client.plugin_info().manifest.get(f"calls.{rpc}", "0"))


def test_teardown_not_found_from_the_plugin_is_done(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path
) -> None:
    p = plugin_factory(
        "NodeUnpublishVolume=NOT_FOUND:2,NodeUnstageVolume=NOT_FOUND:1,ControllerUnpublishVolume=NOT_FOUND:1"
    )
    client = CSIClient(p.socket, plugin="hostpath")
    volume = _volume(client)
    target = str(tmp_path / "target")
    # Each call really reached the plugin and really got NotFound; the client calls it done.
    client.node_unpublish(volume, target)
    client.node_unstage(volume, str(tmp_path / "stage"))
    client.controller_unpublish(volume, NODE_ID)
    assert [
        _calls(client, rpc) for rpc in ("NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume")
    ] == [
        1,
        1,
        1,
    ]
    # The error behind that decision: kind and code as fields, the operator's sentence unchanged.
    with pytest.raises(grpc.RpcError) as raw:
        client.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume.remote_id, target_path=target)
        )
    err = unpack(raw.value, CallContext("NodeUnpublishVolume", plugin="hostpath", volume=volume.remote_id))
    assert err.ignorable and err.code == "NOT_FOUND"
    assert err.message == (
        f'{IGNORABLE}: volume "{volume.remote_id}" could not be found: '
        "rpc error: code = NotFound desc = injected fault: NodeUnpublishVolume fails with NOT_FOUND"
    )
    client.close()


def test_other_codes_and_other_calls_are_not_ignorable(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path
) -> None:
    p = plugin_factory("NodeUnpublishVolume=FAILED_PRECONDITION:1")
    client = CSIClient(p.socket, plugin="hostpath")
    volume = _volume(client)
    with pytest.raises(CSIError) as info:
        client.node_unpublish(volume, str(tmp_path / "target"))
    assert not info.value.ignorable and info.value.code == "FAILED_PRECONDITION"
    # NotFound on a call that is not a teardown is a real failure: the plugin's own NotFound
    # for a volume it does not have.
    gone = Volume(id="gone", plugin_id="hostpath", external_id="gone", capabilities=volume.capabilities)
    with pytest.raises(CSIError) as missing:
        client.controller_publish(gone, NODE_ID, gone.capabilities[0], readonly=False)
    assert missing.value.code == "NOT_FOUND" and not missing.value.ignorable
    client.close()


def test_sentence_text_decides_nothing() -> None:
    # A sentence that merely looks ignorable is not; only unpack, from call and code, marks it.
    lookalike = CSIError(f"{IGNORABLE}: volume", code="NOT_FOUND", call="NodeUnpublishVolume")
    assert not lookalike.ignorable
