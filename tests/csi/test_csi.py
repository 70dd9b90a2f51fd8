"""CSI against the real hostpath plugin process over gRPC on a unix socket."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from driversdk.agent.csi.manager import NodeVolumeManager, UsageOptions, controller_publish, controller_unpublish
from driversdk.agent.csi.registry import PluginRegistration, PluginRegistry, socket_path_for
from driversdk.agent.csi.state import StateStore
from driversdk.csi.client import CSIClient, capability_mismatches
from driversdk.csi.errors import CSIConnectError, CSIError, clean_detail
from driversdk.csi.fingerprint import fingerprint
from driversdk.csi.model import AccessMode, AttachmentMode, MountOptions, Secrets, Volume, VolumeCapability
from driversdk.csi.retry import RETRY_TABLE
from driversdk.pb import csi_pb2
from tests.csi.hostpathvol import MULTI, calls, kept_stage, make_volume, tree

from .conftest import NODE_ID, HostPathPlugin, mounts_under

RW = UsageOptions(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.FILE_SYSTEM)


# --- connecting -------------------------------------------------------------------------------


def test_csi_connect_missing_socket_names_it(tmp_path: Path) -> None:
    with pytest.raises(CSIConnectError) as info:
        CSIClient(str(tmp_path / "nope.sock"))
    assert f"failed to open CSI plugin socket {tmp_path}/nope.sock: it does not exist" in str(info.value)


def test_csi_connect_stale_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # a socket file nobody listens on, as a killed plugin leaves
    with pytest.raises(CSIConnectError, match="nothing accepted the connection"):
        CSIClient(path, connect_timeout=0.5)


def test_csi_connect_permission_denied(plugin: HostPathPlugin) -> None:
    # Root may open any socket, so the check runs in a forked child that drops to "nobody".
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        message = "connected"
        try:
            os.setgid(65534)
            os.setuid(65534)
            CSIClient(plugin.socket)
        except BaseException as err:
            message = str(err)
        os.write(write_end, message.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as fh:
        message = fh.read()
    os.waitpid(pid, 0)
    assert message == (
        f"failed to open CSI plugin socket {plugin.socket}: permission denied; run as a user that may read and "
        "write the socket"
    )


# --- identity and fingerprint -----------------------------------------------------------------


def test_csi_fingerprint(plugin: HostPathPlugin) -> None:
    client = CSIClient(plugin.socket, plugin="hostpath")
    fp = fingerprint(client, "hostpath")
    assert fp.healthy and fp.health_description == "healthy"
    assert fp.provider == "hostpath.csi.driversdk.io" and fp.provider_version == "0.1.0"
    assert fp.requires_controller and fp.requires_staging
    assert fp.node is not None and fp.node.node_id == NODE_ID and fp.node.max_volumes == 64
    assert "PUBLISH_UNPUBLISH_VOLUME" in fp.controller_capabilities
    assert fp.node_capabilities == frozenset({"STAGE_UNSTAGE_VOLUME", "GET_VOLUME_STATS", "EXPAND_VOLUME"})
    assert fp.requires_topologies, "NodeGetInfo reports topology, so the plugin advertises the constraint"
    client.close()


def test_csi_fingerprint_of_a_plugin_that_fails_probe(plugin_factory: Callable[..., HostPathPlugin]) -> None:
    p = plugin_factory("Probe=FAILED_PRECONDITION:5")
    client = CSIClient(p.socket, plugin="hostpath")
    fp = fingerprint(client, "hostpath")
    assert not fp.healthy
    assert fp.health_description.startswith("failed fingerprinting with error:")
    assert "FailedPrecondition" in fp.health_description
    assert fp.provider == "hostpath.csi.driversdk.io"  # the basic facts are kept
    assert calls(client, "Probe") == 1, "Probe is never retried"


# --- retries and errors -----------------------------------------------------------------------


def test_csi_retry_table_is_explicit() -> None:
    assert RETRY_TABLE["NodeStageVolume"].attempts == 3
    assert grpc.StatusCode.UNAVAILABLE in RETRY_TABLE["NodeStageVolume"].codes
    assert grpc.StatusCode.UNIMPLEMENTED not in RETRY_TABLE["NodeStageVolume"].codes
    for never in ("GetPluginInfo", "GetPluginCapabilities", "Probe", "NodeGetInfo", "NodeGetCapabilities"):
        assert RETRY_TABLE[never].attempts == 1


def test_csi_retryable_failure_is_really_retried(plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path) -> None:
    p = plugin_factory("NodeStageVolume=UNAVAILABLE:2")
    client = CSIClient(p.socket, plugin="hostpath")
    store = StateStore(str(tmp_path / "state.db"))
    manager = NodeVolumeManager(
        client, plugin_id="hostpath", host_root=str(tmp_path / "csi"), store=store, requires_staging=True
    )
    volume = make_volume(client)
    info = manager.mount(volume, "alloc-1", MULTI)
    assert calls(client, "NodeStageVolume") == 3, "two failures, then success"
    assert info.source in mounts_under(tmp_path / "csi")
    manager.unmount(volume, "alloc-1", MULTI)
    assert mounts_under(tmp_path / "csi") == []


def test_csi_non_retryable_failure_is_not_retried_and_leaves_nothing(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path
) -> None:
    p = plugin_factory("NodePublishVolume=INVALID_ARGUMENT:1")
    client = CSIClient(p.socket, plugin="hostpath")
    store = StateStore(str(tmp_path / "state.db"))
    manager = NodeVolumeManager(
        client, plugin_id="hostpath", host_root=str(tmp_path / "csi"), store=store, requires_staging=True
    )
    volume = make_volume(client)
    with pytest.raises(CSIError) as info:
        manager.mount(volume, "alloc-1", MULTI)
    err = info.value
    assert err.code == "INVALID_ARGUMENT" and err.call == "NodePublishVolume"
    assert (
        "rpc error: code = InvalidArgument desc = injected fault: NodePublishVolume fails with INVALID_ARGUMENT"
        in str(err)
    )
    assert calls(client, "NodePublishVolume") == 1
    # The stage made for this alloc alone was undone; no mount, no claim, no dirs.
    assert mounts_under(tmp_path / "csi") == []
    assert store.usages("hostpath") == []
    assert os.listdir(tmp_path / "csi" / "per-alloc") == [] and os.listdir(tmp_path / "csi" / "staging") == []


def test_csi_internal_error_sentence_keeps_code_and_cleans_detail() -> None:
    assert clean_detail("\x1b[31mboom\x1b[0m\n  at frame 1\n  at frame 2") == "boom"
    from driversdk.csi.errors import CallContext, unpack

    class FakeCall(grpc.RpcError, grpc.Call):  # type: ignore[misc]
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.INTERNAL

        def details(self) -> str:
            return "mount failed\nstack..."

    err = unpack(FakeCall(), CallContext("NodeStageVolume", plugin="hostpath", volume="v1"))
    assert str(err) == (
        "node plugin returned an internal error, check the plugin allocation logs for more information: "
        "rpc error: code = Internal desc = mount failed"
    )


# --- validation -------------------------------------------------------------------------------


def test_csi_validate_volume_capabilities(plugin: HostPathPlugin) -> None:
    client = CSIClient(plugin.socket)
    volume = make_volume(client)
    assert client.validate_volume_capabilities(volume) == ""
    block = Volume(
        id="blk",
        plugin_id="hostpath",
        external_id=volume.external_id,
        capabilities=[VolumeCapability(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.BLOCK_DEVICE)],
    )
    # Not confirmed is not a failure, but the plugin's reason reaches the operator.
    assert "only file-system access is supported" in client.validate_volume_capabilities(block)
    missing = Volume(id="gone", plugin_id="hostpath", external_id="gone", capabilities=volume.capabilities)
    with pytest.raises(CSIError, match='volume "gone" could not be found'):
        client.validate_volume_capabilities(missing)


def test_csi_capability_comparison_by_value() -> None:
    req = VolumeCapability(
        AccessMode.SINGLE_NODE_WRITER, AttachmentMode.FILE_SYSTEM, MountOptions("ext4", ("noatime",))
    )
    same = csi_pb2.ValidateVolumeCapabilitiesResponse()
    same.confirmed.volume_capabilities.append(req.to_proto())  # an equal but distinct object
    assert capability_mismatches([req.to_proto()], same) == []
    assert capability_mismatches([req.to_proto()], csi_pb2.ValidateVolumeCapabilitiesResponse()) == []
    other = VolumeCapability(AccessMode.MULTI_NODE_READER_ONLY, AttachmentMode.FILE_SYSTEM, MountOptions("xfs"))
    differs = csi_pb2.ValidateVolumeCapabilitiesResponse()
    differs.confirmed.volume_capabilities.append(other.to_proto())
    assert capability_mismatches([req.to_proto()], differs) == [
        "requested access mode SINGLE_NODE_WRITER, got MULTI_NODE_READER_ONLY"
    ]
    fs = VolumeCapability(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.FILE_SYSTEM, MountOptions("xfs"))
    fs_differs = csi_pb2.ValidateVolumeCapabilitiesResponse()
    fs_differs.confirmed.volume_capabilities.append(fs.to_proto())
    assert capability_mismatches([req.to_proto()], fs_differs) == ["requested filesystem type ext4, got xfs"]


def test_csi_model_names_and_redaction() -> None:
    assert AccessMode.parse("single-node-writer").csi == 1
    assert AccessMode.parse("multi-node-multi-writer").csi == 5
    with pytest.raises(Exception, match="unknown volume access mode: 'writer'"):
        AccessMode.parse("writer")
    opts = MountOptions("ext4", ("password=hunter2",))
    assert "hunter2" not in repr(opts) and "[REDACTED]" in repr(opts)
    assert "hunter2" not in repr(Secrets(password="hunter2"))
    merged = MountOptions("ext4", ("a",)).merged(MountOptions("", ("b",)))
    assert merged.fs_type == "ext4" and merged.mount_flags == ("b",)
    cap = VolumeCapability(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.BLOCK_DEVICE).to_proto()
    assert cap.HasField("block")  # set even though the message is empty
    assert RW.key == "rw-file-system-single-node-writer"


# --- node volume manager ----------------------------------------------------------------------


def test_csi_stage_once_publish_per_alloc(plugin: HostPathPlugin, tmp_path: Path) -> None:
    client = CSIClient(plugin.socket, plugin="hostpath")
    store = StateStore(str(tmp_path / "state.db"))
    root = tmp_path / "csi"
    manager = NodeVolumeManager(client, plugin_id="hostpath", host_root=str(root), store=store, requires_staging=True)
    volume = make_volume(client)
    node = client.node_info()
    context = controller_publish(client, volume, node.node_id, MULTI)
    assert context == {"published-by": "hostpath.csi.driversdk.io"}
    a = manager.mount(volume, "alloc-a", MULTI, context)
    b = manager.mount(volume, "alloc-b", MULTI, context)
    assert calls(client, "NodeStageVolume") == 1 and calls(client, "NodePublishVolume") == 2
    stage = root / "staging" / "default" / volume.id / MULTI.key
    assert a.source == str(root / "per-alloc" / "alloc-a" / volume.id / MULTI.key)
    assert sorted(mounts_under(root)) == sorted([str(stage), a.source, b.source])
    Path(a.source, "shared.txt").write_text("hello")
    assert Path(b.source, "shared.txt").read_text() == "hello"
    manager.unmount(volume, "alloc-a", MULTI)
    assert sorted(mounts_under(root)) == sorted([str(stage), b.source])
    manager.unmount(volume, "alloc-b", MULTI)
    assert mounts_under(root) == [] and calls(client, "NodeUnstageVolume") == 1
    manager.unmount(volume, "alloc-b", MULTI)  # already gone: still fine
    controller_unpublish(client, volume, node.node_id)
    # Nothing of the allocs; the volume's staging path stays, empty and no mount, for its next stage.
    assert tree(root) == kept_stage(volume, MULTI)
    manager.mount(volume, "alloc-c", MULTI, context)  # staged again through the kept path
    manager.unmount(volume, "alloc-c", MULTI)
    assert calls(client, "NodeStageVolume") == 2 and mounts_under(root) == []
    assert tree(root) == kept_stage(volume, MULTI)


def test_csi_controller_publish_uses_the_csi_node_id(plugin: HostPathPlugin) -> None:
    client = CSIClient(plugin.socket)
    volume = make_volume(client)
    with pytest.raises(CSIError) as info:
        controller_publish(client, volume, "nomad-node-uuid", MULTI)
    assert f'volume "{volume.external_id}" or node "nomad-node-uuid" could not be found' in str(info.value)


def test_csi_read_only_publish(plugin: HostPathPlugin, tmp_path: Path) -> None:
    client = CSIClient(plugin.socket)
    store = StateStore(str(tmp_path / "state.db"))
    root = tmp_path / "csi"
    manager = NodeVolumeManager(client, plugin_id="hostpath", host_root=str(root), store=store, requires_staging=True)
    volume = make_volume(client)
    ro = UsageOptions(AccessMode.MULTI_NODE_READER_ONLY, AttachmentMode.FILE_SYSTEM, read_only=True)
    info = manager.mount(volume, "alloc-r", ro)
    with pytest.raises(OSError):
        Path(info.source, "x").write_text("no")
    manager.unmount(volume, "alloc-r", ro)
    assert mounts_under(root) == []


def test_csi_plugin_killed_between_stage_and_publish(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path
) -> None:
    p = plugin_factory()
    client = CSIClient(p.socket, plugin="hostpath")
    store = StateStore(str(tmp_path / "state.db"))
    root = tmp_path / "csi"
    manager = NodeVolumeManager(client, plugin_id="hostpath", host_root=str(root), store=store, requires_staging=True)
    volume = make_volume(client)
    manager.mount(volume, "alloc-a", MULTI)
    p.kill()
    with pytest.raises(CSIError) as info:
        manager.mount(volume, "alloc-b", MULTI)
    assert info.value.code == "UNAVAILABLE"
    assert "is not answering NodePublishVolume" in str(info.value)
    assert [u.alloc_id for u in store.usages("hostpath")] == ["alloc-a"]
    # The plugin comes back (its socket was left behind and is replaced); work resumes.
    p2 = plugin_factory()
    client2 = CSIClient(p2.socket, plugin="hostpath")
    manager2 = NodeVolumeManager(client2, plugin_id="hostpath", host_root=str(root), store=store, requires_staging=True)
    manager2.mount(volume, "alloc-b", MULTI)
    manager2.unmount(volume, "alloc-a", MULTI)
    manager2.unmount(volume, "alloc-b", MULTI)
    assert mounts_under(root) == []


def test_csi_teardown_finishes_after_restart(plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path) -> None:
    p = plugin_factory()
    client = CSIClient(p.socket, plugin="hostpath")
    db = str(tmp_path / "state.db")
    root = tmp_path / "csi"
    manager = NodeVolumeManager(
        client, plugin_id="hostpath", host_root=str(root), store=StateStore(db), requires_staging=True
    )
    volume = make_volume(client)
    manager.mount(volume, "alloc-a", MULTI)
    p.kill()  # the teardown starts while the plugin is down, and the process "restarts"
    with pytest.raises(CSIError):
        manager.unmount(volume, "alloc-a", MULTI)
    p2 = plugin_factory()
    fresh = NodeVolumeManager(
        CSIClient(p2.socket), plugin_id="hostpath", host_root=str(root), store=StateStore(db), requires_staging=True
    )
    assert fresh.resume_teardowns() == ["alloc-a"]
    assert mounts_under(root) == []
    assert fresh.store.usages("hostpath") == []


# --- registry ---------------------------------------------------------------------------------


def test_csi_registry(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path / "state.db"))
    reg = PluginRegistry(store)
    events = reg.subscribe()
    assert not reg.deregister("csi-node", "hostpath", "alloc-1"), "deregister before register is safe"
    assert events.empty()
    old = PluginRegistration("csi-node", "hostpath", "alloc-1", socket_path_for(str(tmp_path), "alloc-1"))
    new = PluginRegistration("csi-node", "hostpath", "alloc-2", socket_path_for(str(tmp_path), "alloc-2"))
    assert old.socket_path != new.socket_path
    assert reg.register(old) and reg.register(new)
    assert not reg.register(new), "registering the same alloc twice is a no-op"
    assert reg.current("csi-node", "hostpath") == new
    assert [e.kind for e in (events.get_nowait(), events.get_nowait())] == ["registered", "registered"]
    assert events.empty()
    reloaded = PluginRegistry(StateStore(str(tmp_path / "state.db")))
    assert reloaded.instances("csi-node", "hostpath") == [new, old]
    assert reg.deregister("csi-node", "hostpath", "alloc-2")
    assert events.get_nowait().plugin == new
    assert reg.current("csi-node", "hostpath") == old, "the older instance takes over"
    assert reg.wait_for_plugin("csi-node", "hostpath", 1) == old
    with pytest.raises(CSIError, match="csi-node plugin 'other' did not become ready"):
        reg.wait_for_plugin("csi-node", "other", 0.5)
    with pytest.raises(CSIError, match="unknown CSI plugin type 'node'"):
        reg.current("node", "hostpath")


RETRYABLE = ["UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED", "DEADLINE_EXCEEDED"]
NOT_RETRYABLE = [
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "FAILED_PRECONDITION",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "INTERNAL",
    "UNIMPLEMENTED",
]


@pytest.mark.parametrize("code", RETRYABLE + NOT_RETRYABLE)
def test_csi_each_code_retried_only_when_the_table_says(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path, code: str
) -> None:
    p = plugin_factory(f"NodeStageVolume={code}:1")
    client = CSIClient(p.socket, plugin="hostpath")
    volume = make_volume(client)
    stage = tmp_path / "stage"
    stage.mkdir()
    capability = VolumeCapability(AccessMode.MULTI_NODE_MULTI_WRITER, AttachmentMode.FILE_SYSTEM)
    if code in RETRYABLE:
        client.node_stage(volume, str(stage), capability, {})
        assert calls(client, "NodeStageVolume") == 2
        client.node_unstage(volume, str(stage))
    else:
        with pytest.raises(CSIError) as info:
            client.node_stage(volume, str(stage), capability, {})
        assert info.value.code == code and info.value.call == "NodeStageVolume"
        assert calls(client, "NodeStageVolume") == 1
        assert "injected fault" in str(info.value)
    assert mounts_under(tmp_path / "stage") == []


def test_csi_paths_inside_the_plugin_differ_from_the_host(plugin: HostPathPlugin, tmp_path: Path) -> None:
    client = CSIClient(plugin.socket)
    manager = NodeVolumeManager(
        client,
        plugin_id="hostpath",
        host_root="/var/lib/driversdk/client/csi/node/hostpath",
        plugin_root="/local/csi",
        store=StateStore(str(tmp_path / "state.db")),
        requires_staging=True,
    )
    volume = Volume(id="vol", plugin_id="hostpath", namespace="prod")
    assert manager.staging_paths(volume, MULTI) == (
        "/var/lib/driversdk/client/csi/node/hostpath/staging/prod/vol/rw-file-system-multi-node-multi-writer",
        "/local/csi/staging/prod/vol/rw-file-system-multi-node-multi-writer",
    )
    assert manager.publish_paths(volume, "alloc-1", MULTI) == (
        "/var/lib/driversdk/client/csi/node/hostpath/per-alloc/alloc-1/vol/rw-file-system-multi-node-multi-writer",
        "/local/csi/per-alloc/alloc-1/vol/rw-file-system-multi-node-multi-writer",
    )


def test_csi_final_fingerprint_on_shutdown_reports_unhealthy(plugin: HostPathPlugin) -> None:
    from driversdk.csi.fingerprint import final_fingerprint

    client = CSIClient(plugin.socket)
    last = fingerprint(client, "hostpath")
    client.close()
    final = final_fingerprint(last)
    assert last.healthy and not final.healthy
    assert final.provider == last.provider and final.node == last.node
