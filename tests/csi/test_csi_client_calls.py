"""The client's controller calls for volume and snapshot management, against the real plugin."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.csi.model import AccessMode, AttachmentMode, VolumeCapability
from driversdk.pb import csi_pb2
from tests.csi.hostpathvol import calls

from .conftest import NODE_ID, HostPathPlugin

RW = VolumeCapability(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.FILE_SYSTEM)
BLOCK = VolumeCapability(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.BLOCK_DEVICE)
HERE = {"topology.hostpath.csi/node": NODE_ID}


def test_csi_client_create_get_list_delete_volume(plugin_factory: Callable[..., HostPathPlugin]) -> None:
    plugin = plugin_factory(options=("--alpha",))  # ControllerGetVolume: GET_VOLUME is alpha
    client = CSIClient(plugin.socket, plugin="hostpath")
    vol = client.create_volume("web", [RW], capacity_min=1 << 20, parameters={"tier": "gold"}, requisite=[HERE])
    assert (vol.volume_id, vol.capacity_bytes, vol.context) == ("web", 1 << 20, {"hostpath": "1"})
    assert vol.topologies == (HERE,) and vol.snapshot_source == "" and vol.clone_source == ""
    assert client.create_volume("web", [RW], capacity_min=1 << 20, parameters={"tier": "gold"}) == vol
    for name in ("a", "b", "c"):
        client.create_volume(name, [RW])
    client.controller.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(volume_id="web", node_id=NODE_ID, volume_capability=RW.to_proto())
    )
    got = client.controller_get_volume("web")
    assert got.published_node_ids == (NODE_ID,) and got.capacity_bytes == 1 << 20
    page = client.list_volumes(max_entries=2)
    assert [v.volume_id for v in page.entries] == ["a", "b"] and page.next_token
    rest = client.list_volumes(max_entries=2, starting_token=page.next_token)
    assert [v.volume_id for v in rest.entries] == ["c", "web"] and rest.next_token == ""
    assert rest.entries[1].published_node_ids == (NODE_ID,)
    assert [v.volume_id for v in client.all_volumes(page_size=1)] == ["a", "b", "c", "web"]
    for _ in range(2):
        client.delete_volume("a")
    assert [v.volume_id for v in client.all_volumes()] == ["b", "c", "web"]
    client.close()


def test_csi_client_volume_errors_are_operator_sentences(plugin_factory: Callable[..., HostPathPlugin]) -> None:
    plugin = plugin_factory(options=("--alpha",))
    client = CSIClient(plugin.socket, plugin="hostpath")
    client.create_volume("db", [RW], capacity_min=1 << 20)
    with pytest.raises(CSIError) as info:
        client.create_volume("db", [RW], capacity_min=2 << 20)
    assert info.value.code == "ALREADY_EXISTS"
    assert str(info.value).startswith(
        'volume "db" already exists but is incompatible with these parameters: rpc error: code = AlreadyExists desc = '
    )
    with pytest.raises(CSIError) as info:
        client.create_volume("restore", [RW], snapshot_id="missing")
    assert str(info.value).startswith('volume "restore" content source "missing" does not exist: ')
    with pytest.raises(CSIError) as info:
        client.create_volume("far", [RW], requisite=[{"topology.hostpath.csi/node": "elsewhere"}])
    assert info.value.code == "RESOURCE_EXHAUSTED"
    assert str(info.value).startswith('unable to provision "far" in accessible_topology: ')
    with pytest.raises(CSIError) as info:
        client.create_volume("huge", [RW], capacity_min=2**50)
    assert str(info.value).startswith('unsupported capacity_range for volume "huge": ')
    with pytest.raises(CSIError) as info:
        client.create_volume("blk", [BLOCK])
    assert info.value.code == "INVALID_ARGUMENT"
    with pytest.raises(CSIError) as info:
        client.list_volumes(starting_token="bogus")
    assert str(info.value).startswith('invalid starting token "bogus": rpc error: code = Aborted desc = ')
    with pytest.raises(CSIError) as info:
        client.controller_get_volume("nope")
    assert info.value.code == "NOT_FOUND" and 'for volume "nope"' in str(info.value)
    # Impossible requests are refused before any call.
    before = calls(client, "CreateVolume")
    for kwargs, message in (
        ({"name": "", "capabilities": [RW]}, "a volume to create needs a name"),
        ({"name": "x", "capabilities": []}, 'volume "x": CreateVolume needs at least one capability'),
        (
            {"name": "x", "capabilities": [RW], "capacity_min": 10, "capacity_max": 5},
            'volume "x": capacity_max (5) is smaller than capacity_min (10)',
        ),
        (
            {"name": "x", "capabilities": [RW], "snapshot_id": "s", "clone_id": "c"},
            'volume "x": set snapshot_id or clone_id, not both',
        ),
    ):
        with pytest.raises(CSIError, match=message.replace("(", r"\(").replace(")", r"\)")):
            client.create_volume(**kwargs)  # type: ignore[arg-type]
    assert calls(client, "CreateVolume") == before
    client.close()


def test_csi_client_snapshots(plugin: HostPathPlugin) -> None:
    client = CSIClient(plugin.socket, plugin="hostpath")
    client.create_volume("src", [RW], capacity_min=1 << 20)
    client.create_volume("other", [RW])
    Path(plugin.root, "volumes", "src", "f").write_text("data")
    snap = client.create_snapshot("src", "nightly")
    assert (snap.snapshot_id, snap.source_volume_id, snap.size_bytes, snap.ready_to_use) == (
        "nightly",
        "src",
        1 << 20,
        True,
    )
    assert snap.created.tzinfo is not None and snap.created.year >= 2024
    assert client.create_snapshot("src", "nightly") == snap
    with pytest.raises(CSIError) as info:
        client.create_snapshot("other", "nightly")
    assert str(info.value).startswith(
        'snapshot "nightly" already exists but is incompatible with volume ID "other": rpc error: code = '
        "AlreadyExists desc = "
    )
    client.create_snapshot("other", "weekly")
    page = client.list_snapshots(max_entries=1)
    assert [s.snapshot_id for s in page.entries] == ["nightly"] and page.next_token
    assert [s.snapshot_id for s in client.list_snapshots(starting_token=page.next_token).entries] == ["weekly"]
    assert [s.snapshot_id for s in client.list_snapshots(volume_id="other").entries] == ["weekly"]
    assert client.list_snapshots(snapshot_id="nightly").entries == (snap,)
    with pytest.raises(CSIError, match='invalid starting token "x"'):
        client.list_snapshots(starting_token="x")
    restored = client.create_volume("restored", [RW], snapshot_id="nightly")
    assert restored.snapshot_source == "nightly"
    assert Path(plugin.root, "volumes", restored.volume_id, "f").read_text() == "data"
    clone = client.create_volume("clone", [RW], clone_id="src")
    assert clone.clone_source == "src"
    for _ in range(2):
        client.delete_snapshot("nightly")
    assert client.list_snapshots(snapshot_id="nightly").entries == ()
    client.close()


def test_csi_client_retries_volume_management_calls(plugin_factory: Callable[..., HostPathPlugin]) -> None:
    p = plugin_factory("CreateVolume=UNAVAILABLE:2,DeleteVolume=ABORTED:1")
    client = CSIClient(p.socket, plugin="hostpath")
    client.create_volume("v", [RW])
    assert calls(client, "CreateVolume") == 3, "two transient failures, then success"
    client.delete_volume("v")
    assert calls(client, "DeleteVolume") == 2
    client.close()
