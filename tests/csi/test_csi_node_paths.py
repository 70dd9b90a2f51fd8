"""The volume manager's cheap checks against real mounts and trees: statx's mount-root bit,
paths taken as named when no component is a symlink, and rmdir as the emptiness test."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

import driversdk.agent.csi.manager as manager_mod
import driversdk.mountinfo as mountinfo_mod
from driversdk.agent.csi.manager import NodeVolumeManager, UsageOptions, sweep_mount_root
from driversdk.agent.csi.state import StateStore
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.csi.model import AccessMode, AttachmentMode, Volume
from driversdk.mountinfo import is_mounted_at, mount_points, read_mountinfo, statx_mount_root
from driversdk.paths import UnsafePathError, resolve_under
from driversdk.pb import csi_pb2, csi_pb2_grpc
from tests.csi.hostpathvol import MULTI, calls, kept_stage, make_volume, tree

from .conftest import HostPathPlugin

USAGE = UsageOptions(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.FILE_SYSTEM)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def binds(tmp_path: Path) -> Iterator[list[str]]:
    """Mount points made by a test, unmounted afterwards (innermost first)."""
    made: list[str] = []
    yield made
    for point in reversed(made):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _needs_statx() -> None:
    if statx_mount_root("/") is None:
        pytest.skip("statx cannot tell mount roots here (libc without statx, or a kernel before 5.8)")


def test_statx_sees_a_bind_mount_of_the_same_filesystem(tmp_path: Path, binds: list[str]) -> None:
    _needs_statx()
    source, target, plain = tmp_path / "source", tmp_path / "target", tmp_path / "plain"
    for d in (source, target, plain):
        d.mkdir()
    (source / "sub").mkdir()
    _mount("--bind", str(source / "sub"), str(target))
    binds.append(str(target))
    # Same filesystem, so st_dev cannot tell these apart; the mount-root bit and mountinfo can.
    assert os.stat(target).st_dev == os.stat(tmp_path).st_dev
    assert statx_mount_root(str(target)) is True
    assert statx_mount_root(str(plain)) is False
    assert statx_mount_root(str(source / "sub")) is False  # the bind's source is no mount point
    assert statx_mount_root(str(tmp_path / "missing")) is False
    assert statx_mount_root(str(plain / "missing" / "deeper")) is False
    points = mount_points()
    for path in (target, plain, source / "sub"):
        assert is_mounted_at(str(path)) == (str(path) in points)


def test_statx_does_not_follow_a_symlink_to_a_mount(tmp_path: Path, binds: list[str]) -> None:
    _needs_statx()
    (tmp_path / "target").mkdir()
    _mount("--bind", str(tmp_path / "target"), str(tmp_path / "target"))
    binds.append(str(tmp_path / "target"))
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert statx_mount_root(str(tmp_path / "target")) is True
    assert statx_mount_root(str(tmp_path / "link")) is False


def test_statx_stacked_and_unmounted(tmp_path: Path, binds: list[str]) -> None:
    _needs_statx()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _mount("--bind", str(tmp_path / "a"), str(tmp_path / "b"))
    binds.append(str(tmp_path / "b"))
    _mount("-t", "tmpfs", "tmpfs", str(tmp_path / "b"))
    binds.append(str(tmp_path / "b"))
    assert statx_mount_root(str(tmp_path / "b")) is True
    subprocess.run(["umount", str(tmp_path / "b")], check=True)
    assert statx_mount_root(str(tmp_path / "b")) is True  # the bind below is still there
    subprocess.run(["umount", str(tmp_path / "b")], check=True)
    assert statx_mount_root(str(tmp_path / "b")) is False


def test_is_mounted_at_falls_back_to_mountinfo(
    tmp_path: Path, binds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "plain").mkdir()
    _mount("--bind", str(tmp_path / "target"), str(tmp_path / "target"))
    binds.append(str(tmp_path / "target"))
    monkeypatch.setattr(mountinfo_mod, "_statx", None)  # as on a libc without statx
    assert statx_mount_root(str(tmp_path / "target")) is None
    assert is_mounted_at(str(tmp_path / "target")) is True
    assert is_mounted_at(str(tmp_path / "plain")) is False


def test_statx_error_other_than_missing_is_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: object) -> int:
        import ctypes

        ctypes.set_errno(errno.ESTALE)
        return -1

    monkeypatch.setattr(mountinfo_mod, "_statx", failing)
    assert statx_mount_root("/anything") is None


# --- paths -------------------------------------------------------------------------------------


def _manager(tmp_path: Path, root: Path) -> NodeVolumeManager:
    store = StateStore(str(tmp_path / "state.db"))
    return NodeVolumeManager(None, plugin_id="hostpath", host_root=str(root), store=store,  # type: ignore[arg-type]
                             requires_staging=True)  # fmt: skip


@pytest.mark.parametrize("existing", ["", "staging", "staging/default", "staging/default/vol"])
def test_plain_paths_match_resolve_under(tmp_path: Path, existing: str) -> None:
    root = tmp_path / "root"
    (root / existing).mkdir(parents=True)
    manager = _manager(tmp_path, root)
    key = USAGE.key
    expect = resolve_under(str(root), "staging", "default", "vol", key, what="x")
    assert manager.staging_paths(Volume(id="vol", plugin_id="hostpath"), USAGE) == (
        expect,
        str(root / "staging" / "default" / "vol" / key),
    )


def test_a_symlink_inside_the_root_is_resolved_like_before(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "staging" / "elsewhere").mkdir(parents=True)
    (root / "staging" / "default").symlink_to(root / "staging" / "elsewhere")
    manager = _manager(tmp_path, root)
    host, inside = manager.staging_paths(Volume(id="vol", plugin_id="hostpath"), USAGE)
    assert host == str(root / "staging" / "elsewhere" / "vol" / USAGE.key)
    assert inside == str(root / "staging" / "elsewhere" / "vol" / USAGE.key)


@pytest.mark.parametrize("link_at", ["staging", "staging/default", "staging/default/vol"])
def test_a_planted_symlink_out_of_the_root_is_refused_at_any_depth(tmp_path: Path, link_at: str) -> None:
    root = tmp_path / "root"
    (root / link_at).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "outside").mkdir()
    (root / link_at).symlink_to(tmp_path / "outside")
    manager = _manager(tmp_path, root)
    with pytest.raises(UnsafePathError, match="outside"):
        manager.staging_paths(Volume(id="vol", plugin_id="hostpath"), USAGE)


@pytest.mark.parametrize("volume_id", ["..", ".", "a/../../..", ""])
def test_names_that_are_not_plain_go_through_resolve_under(tmp_path: Path, volume_id: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    manager = _manager(tmp_path, root)
    volume = Volume(id=volume_id, plugin_id="hostpath")
    try:
        expect: str | None = resolve_under(str(root), "staging", "default", volume_id, USAGE.key, what="x")
    except UnsafePathError:
        expect = None
    if expect is None:
        with pytest.raises(UnsafePathError):
            manager.staging_paths(volume, USAGE)
    else:
        assert manager.staging_paths(volume, USAGE)[0] == expect


def test_a_symlinked_root_is_resolved_once_and_cleaned_under(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "root").symlink_to(tmp_path / "real")
    manager = _manager(tmp_path, tmp_path / "root")
    host, inside = manager.staging_paths(Volume(id="vol", plugin_id="hostpath"), USAGE)
    assert host == str(tmp_path / "real" / "staging" / "default" / "vol" / USAGE.key)
    assert inside == str(tmp_path / "root" / "staging" / "default" / "vol" / USAGE.key)
    os.makedirs(host)
    NodeVolumeManager._remove_empty_from(host, str(tmp_path / "real"))
    assert os.listdir(tmp_path / "real") == []


# --- removing empty directories ----------------------------------------------------------------


def test_remove_empty_stops_at_a_mount_point(tmp_path: Path, binds: list[str]) -> None:
    root = tmp_path / "root"
    leaf = root / "per-alloc" / "alloc" / "vol" / "usage"
    leaf.mkdir(parents=True)
    vol = root / "per-alloc" / "alloc" / "vol"
    _mount("--bind", str(vol), str(vol))  # same filesystem: rmdir's EBUSY is what stops the walk
    binds.append(str(vol))
    NodeVolumeManager._remove_empty_from(str(leaf), str(root))
    assert not leaf.exists()
    assert vol.is_dir() and str(vol) in mount_points()


def test_remove_empty_stops_at_a_non_empty_directory_and_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    leaf = root / "staging" / "default" / "vol" / "usage"
    leaf.mkdir(parents=True)
    (root / "staging" / "default" / "other").write_text("x")
    NodeVolumeManager._remove_empty_from(str(leaf), str(root))
    assert sorted(os.listdir(root / "staging" / "default")) == ["other"]
    (root / "staging" / "default" / "other").unlink()
    NodeVolumeManager._remove_empty_from(str(root / "staging" / "default" / "gone"), str(root))
    assert root.is_dir() and os.listdir(root) == []


def test_makedirs_retries_when_a_teardown_removes_a_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.makedirs
    failures = [FileNotFoundError(errno.ENOENT, "removed meanwhile")]

    def racing(path: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        if failures:
            raise failures.pop()
        real(path, mode, exist_ok)

    monkeypatch.setattr(manager_mod.os, "makedirs", racing)
    manager_mod._makedirs(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir() and (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700


# --- removed directories' descriptors ----------------------------------------------------------


def _fds_under(path: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
        if target.startswith(str(path)):
            found.append(target)
    return found


def test_unmount_leaves_no_directory_and_no_descriptor(plugin: HostPathPlugin, tmp_path: Path) -> None:
    client = CSIClient(plugin.socket, plugin="hostpath")
    root = tmp_path / "csi"
    manager = NodeVolumeManager(client, plugin_id="hostpath", host_root=str(root),
                                store=StateStore(str(tmp_path / "state.db")), requires_staging=True)  # fmt: skip
    volume = make_volume(client)
    for alloc in ("alloc-a", "alloc-b"):
        manager.mount(volume, alloc, MULTI)
    manager.unmount(volume, "alloc-a", MULTI)  # not the last: the stage stays
    manager.unmount(volume, "alloc-b", MULTI)
    # The layout's own dirs and the volume's staging path stay (empty), as Nomad keeps them;
    # nothing of an allocation does.
    assert tree(root) == kept_stage(volume, MULTI)
    assert _fds_under(root) == []  # nothing of the tree is held open once unmount returns
    sweep_mount_root(str(root))  # the plugin's last instance stopped
    assert not root.exists()


def test_remove_empty_keeps_the_layout_dirs_and_falls_back_to_the_root(tmp_path: Path) -> None:
    from driversdk.agent.csi.manager import _remove_empty_below

    root = tmp_path / "root"
    for leaf in (root / "staging" / "default" / "vol" / "usage", root / "per-alloc" / "alloc" / "vol" / "usage"):
        leaf.mkdir(parents=True)
        _remove_empty_below(str(leaf), str(root))
    assert sorted(os.listdir(root)) == ["per-alloc", "staging"]  # made once, kept: fixed names only
    assert os.listdir(root / "staging") == [] and os.listdir(root / "per-alloc") == []
    # A tree the resolver reached through a symlink inside the root is under no layout dir: it goes
    # up to the root, as before.
    other = root / "elsewhere" / "vol" / "usage"
    other.mkdir(parents=True)
    _remove_empty_below(str(other), str(root))
    assert sorted(os.listdir(root)) == ["per-alloc", "staging"]


def _mounted_once(
    plugin: HostPathPlugin, tmp_path: Path
) -> tuple[CSIClient, Path, StateStore, NodeVolumeManager, Volume]:
    """A manager whose volume was mounted for alloc-a and unmounted: its layout and staging path kept."""
    client = CSIClient(plugin.socket, plugin="hostpath")
    root = tmp_path / "csi"
    store = StateStore(str(tmp_path / "state.db"))
    manager = NodeVolumeManager(client, plugin_id="hostpath", host_root=str(root), store=store, requires_staging=True)
    volume = make_volume(client)
    manager.mount(volume, "alloc-a", MULTI)
    manager.unmount(volume, "alloc-a", MULTI)
    return client, root, store, manager, volume


def test_a_plugin_that_swaps_its_kept_staging_dir_for_a_symlink_gets_a_refusal_and_leaves_nothing(
    plugin: HostPathPlugin, tmp_path: Path
) -> None:
    # The layout dirs outlive a mount, in a tree the plugin can write: a hostile plugin replaces
    # staging/ with a symlink out of the root between two mounts.
    _, root, store, manager, volume = _mounted_once(plugin, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(root / "staging")  # empty dirs (the kept staging path) and no mount
    (root / "staging").symlink_to(outside)
    with pytest.raises(UnsafePathError, match=f'the staging path of volume "{volume.id}" resolves to .* outside'):
        manager.mount(volume, "alloc-b", MULTI)
    assert os.listdir(outside) == []
    assert store.usages("hostpath") == []  # no "mounting" use left to hold a later stage
    assert [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(tmp_path))] == []
    # Once the symlink is gone, the volume mounts and unmounts cleanly again.
    (root / "staging").unlink()
    manager.mount(volume, "alloc-c", MULTI)
    manager.unmount(volume, "alloc-c", MULTI)
    assert [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(tmp_path))] == []
    assert store.usages("hostpath") == []


def test_a_plugin_that_swaps_the_kept_staging_path_itself_for_a_symlink_gets_a_refusal(
    plugin: HostPathPlugin, tmp_path: Path
) -> None:
    # The staging path outlives its unstage: a hostile plugin replaces that very directory with a
    # symlink out of the root, so the next stage would mount the volume over a host directory.
    client, root, store, manager, volume = _mounted_once(plugin, tmp_path)
    stage = root / "staging" / "default" / volume.id / MULTI.key
    outside = tmp_path / "outside"
    outside.mkdir()
    stage.rmdir()
    stage.symlink_to(outside)
    with pytest.raises(UnsafePathError, match=f'the staging path of volume "{volume.id}" resolves to .* outside'):
        manager.mount(volume, "alloc-b", MULTI)
    assert [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(tmp_path))] == []
    assert store.usages("hostpath") == [] and os.listdir(outside) == []
    assert calls(client, "NodeStageVolume") == 1


def test_sweep_removes_the_layout_and_kept_staging_paths_and_the_root(tmp_path: Path) -> None:
    root = tmp_path / "csi" / "node" / "plugin"
    for leaf in ("staging/default/vol/usage", "staging/prod/other/usage", "per-alloc/crashed-alloc/vol"):
        (root / leaf).mkdir(parents=True)
    sweep_mount_root(str(root))
    assert not root.exists() and (tmp_path / "csi" / "node").is_dir()
    sweep_mount_root(str(root))  # nothing left to sweep: fine


def test_sweep_never_enters_or_removes_a_mount_point(tmp_path: Path, binds: list[str]) -> None:
    # A volume still staged (its plugin was stopped first): the staging path is a mount of the
    # volume's content, whose empty directories are the user's and must stay.
    root = tmp_path / "root"
    volume = tmp_path / "volume"
    (volume / "empty-user-dir" / "deeper").mkdir(parents=True)
    stage = root / "staging" / "default" / "vol" / "usage"
    stage.mkdir(parents=True)
    (root / "staging" / "default" / "gone" / "usage").mkdir(parents=True)
    _mount("--bind", str(volume), str(stage))
    binds.append(str(stage))
    sweep_mount_root(str(root))
    assert (volume / "empty-user-dir" / "deeper").is_dir()
    assert tree_of(root) == ["staging", "staging/default", "staging/default/vol", "staging/default/vol/usage"]


def tree_of(root: Path) -> list[str]:
    found, points = [], mount_points()
    for top, dirs, files in os.walk(root):
        if top in points:
            dirs[:] = []  # a mount's content is not the layout
            continue
        found += [os.path.relpath(os.path.join(top, name), root) for name in dirs + files]
    return sorted(found)


def test_sweep_never_follows_a_symlink_and_leaves_what_is_deeper_than_the_layout(tmp_path: Path) -> None:
    # A hostile plugin plants a symlink to a host tree of empty directories, and a tree deeper
    # than the layout's four levels: neither the host tree nor the plugin's deep tree is touched.
    root = tmp_path / "root"
    host = tmp_path / "host"
    (host / "empty" / "dirs").mkdir(parents=True)
    (root / "staging" / "default").mkdir(parents=True)
    (root / "staging" / "default" / "link").symlink_to(host)
    (root / "per-alloc" / "a" / "vol" / "usage" / "fifth").mkdir(parents=True)
    (root / "per-alloc" / "link").symlink_to(host / "empty")
    sweep_mount_root(str(root))
    assert (host / "empty" / "dirs").is_dir()
    assert sorted(os.listdir(root / "staging" / "default")) == ["link"]
    assert (root / "per-alloc" / "a" / "vol" / "usage" / "fifth").is_dir()
    assert sorted(os.listdir(root / "per-alloc")) == ["a", "link"]


def test_sweep_skips_a_missing_root_and_follows_a_symlinked_one(tmp_path: Path) -> None:
    # The root is the runner's (the plugin sees only what is below it): a symlink there is the
    # operator's own (a data dir elsewhere), and it is swept where it leads.
    host = tmp_path / "host"
    (host / "staging" / "default").mkdir(parents=True)
    link = tmp_path / "root"
    link.symlink_to(host)
    sweep_mount_root(str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()
    sweep_mount_root(str(link))
    assert not host.exists()


class _BookkeepingStagePlugin(csi_pb2_grpc.NodeServicer):
    """A node plugin whose NodeStageVolume is bookkeeping (no mount at the staging path), as
    some real plugins do; NodePublishVolume bind-mounts a backing dir, and fails for targets
    naming ``failing``; the first ``litter`` NodeUnpublishVolume calls leave a file in the target."""

    def __init__(self, backing: Path, failing: str = "", litter: int = 0) -> None:
        self.backing = backing
        self.failing = failing
        self.litter = litter

    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        rpc = csi_pb2.NodeServiceCapability.RPC(type=csi_pb2.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME)
        return csi_pb2.NodeGetCapabilitiesResponse(capabilities=[csi_pb2.NodeServiceCapability(rpc=rpc)])

    def NodeStageVolume(
        self, request: csi_pb2.NodeStageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeStageVolumeResponse:
        return csi_pb2.NodeStageVolumeResponse()

    def NodeUnstageVolume(
        self, request: csi_pb2.NodeUnstageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnstageVolumeResponse:
        return csi_pb2.NodeUnstageVolumeResponse()

    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        if self.failing and self.failing in request.target_path:
            context.abort(grpc.StatusCode.INTERNAL, "backing store unavailable")
        os.makedirs(request.target_path, exist_ok=True)
        _mount("--bind", str(self.backing), request.target_path)
        return csi_pb2.NodePublishVolumeResponse()

    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        subprocess.run(["umount", request.target_path], capture_output=True)
        if self.litter:
            self.litter -= 1
            Path(request.target_path, "plugin-state.json").write_text("{}")
        elif os.path.isdir(request.target_path):
            os.rmdir(request.target_path)
        return csi_pb2.NodeUnpublishVolumeResponse()


@pytest.fixture
def node_plugin(tmp_path: Path) -> Iterator[Callable[..., NodeVolumeManager]]:
    """A manager for a :class:`_BookkeepingStagePlugin` served over a real unix socket."""
    servers: list[grpc.Server] = []

    def make(**behaviour: object) -> NodeVolumeManager:
        backing = tmp_path / "backing"
        backing.mkdir(exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        csi_pb2_grpc.add_NodeServicer_to_server(_BookkeepingStagePlugin(backing, **behaviour), server)  # type: ignore[arg-type]
        sock = tmp_path / "csi.sock"
        server.add_insecure_port(f"unix:{sock}")
        server.start()
        servers.append(server)
        return NodeVolumeManager(CSIClient(str(sock), plugin="bookkeeping"), plugin_id="bookkeeping",
                                 host_root=str(tmp_path / "csi"), store=StateStore(str(tmp_path / "state.db")),
                                 requires_staging=True)  # fmt: skip

    yield make
    for server in servers:
        server.stop(None)
    for e in read_mountinfo():
        if e.mount_point.startswith(str(tmp_path)):
            subprocess.run(["umount", "-l", e.mount_point], capture_output=True)


def mounts_in(path: Path) -> list[str]:
    return [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(path))]


def test_a_failed_publish_keeps_the_staging_path_another_alloc_stages_through(
    tmp_path: Path, node_plugin: Callable[..., NodeVolumeManager]
) -> None:
    # The stage is bookkeeping, so the staging path is an empty directory and no mount point:
    # rmdir alone would remove it from under alloc-a, whose volume is staged through it.
    manager = node_plugin(failing="alloc-b")
    root, store = tmp_path / "csi", manager.store
    volume = Volume(id="vol", plugin_id="bookkeeping")
    a = manager.mount(volume, "alloc-a", USAGE)
    stage = root / "staging" / "default" / "vol" / USAGE.key
    with pytest.raises(CSIError, match="backing store unavailable"):
        manager.mount(volume, "alloc-b", USAGE)
    assert stage.is_dir(), "the staging path of a volume staged for alloc-a stays"
    assert not (root / "per-alloc" / "alloc-b").exists(), "what alloc-b's mount made goes"
    assert is_mounted_at(a.source)
    manager.unmount(volume, "alloc-a", USAGE)
    assert store.usages("bookkeeping") == [] and not store.staged("bookkeeping", "default", "vol", USAGE.key)
    assert mounts_in(tmp_path) == []


def test_a_file_where_the_kept_staging_path_was_is_a_sentence_and_leaves_nothing(
    tmp_path: Path, node_plugin: Callable[..., NodeVolumeManager]
) -> None:
    # The staging path outlives its unstage in a tree the plugin writes: a file put there (by the
    # plugin, or a crash) refuses the next mount in a sentence, with nothing recorded or mounted.
    manager = node_plugin()
    volume = Volume(id="vol", plugin_id="bookkeeping")
    manager.mount(volume, "alloc-a", USAGE)
    manager.unmount(volume, "alloc-a", USAGE)
    stage = tmp_path / "csi" / "staging" / "default" / "vol" / USAGE.key
    stage.rmdir()
    stage.write_text("not a directory")
    with pytest.raises(CSIError) as info:
        manager.mount(volume, "alloc-b", USAGE)
    assert str(info.value) == (
        f'volume "vol": cannot make the staging path {stage} (File exists): the tree of CSI plugin '
        '"bookkeeping" holds something else there; remove it'
    )
    assert info.value.call == "NodeStageVolume" and info.value.volume == "vol"
    assert manager.store.usages("bookkeeping") == [] and mounts_in(tmp_path) == []
    assert not (tmp_path / "csi" / "per-alloc" / "alloc-b").exists()
    assert stage.read_text() == "not a directory", "what is not ours to remove stays"
    stage.unlink()  # the operator does as told
    manager.mount(volume, "alloc-c", USAGE)
    manager.unmount(volume, "alloc-c", USAGE)
    assert manager.store.usages("bookkeeping") == [] and mounts_in(tmp_path) == []


def test_a_plugin_that_leaves_files_in_its_unpublished_target_gets_a_sentence_and_a_resumable_teardown(
    tmp_path: Path, node_plugin: Callable[..., NodeVolumeManager]
) -> None:
    manager = node_plugin(litter=1)
    volume = Volume(id="vol", plugin_id="bookkeeping")
    target = Path(manager.mount(volume, "alloc-a", USAGE).source)
    with pytest.raises(CSIError) as info:
        manager.unmount(volume, "alloc-a", USAGE)
    assert str(info.value) == (
        f'volume "vol": cannot remove the unpublished target {target} (Directory not empty): the tree of '
        'CSI plugin "bookkeeping" holds something else there; remove it'
    )
    assert info.value.call == "NodeUnpublishVolume" and mounts_in(tmp_path) == []
    # The use stays "unmounting": once the operator removed the file, the teardown finishes.
    assert [(u.alloc_id, u.phase) for u in manager.store.usages("bookkeeping")] == [("alloc-a", "unmounting")]
    (target / "plugin-state.json").unlink()
    assert manager.resume_teardowns() == ["alloc-a"]
    assert manager.store.usages("bookkeeping") == [] and not (tmp_path / "csi" / "per-alloc" / "alloc-a").exists()
