"""The node volume manager against a reference plugin process that loses its node records when it
is killed and started again (``--forget-node-state``: it then answers NodeUnpublish/NodeUnstage
of a path it does not know with OK and leaves the mount, and refuses NodePublish without its own
stage record, as third-party plugins that keep their records in memory do). Real gRPC over a
unix socket, real bind mounts checked in /proc/self/mountinfo."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from driversdk.agent.csi.manager import NodeVolumeManager
from driversdk.agent.csi.state import StateStore
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.mountinfo import is_mount_point
from tests.csi.hostpathvol import MULTI, make_volume

from .conftest import HostPathPlugin, mounts_under

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")

FORGET = ("--forget-node-state",)


def _manager(plugin: HostPathPlugin, tmp_path: Path) -> NodeVolumeManager:
    return NodeVolumeManager(CSIClient(plugin.socket, plugin="hostpath"), plugin_id="hostpath",
                             host_root=str(tmp_path / "csi"), store=StateStore(str(tmp_path / "state.db")),
                             requires_staging=True)  # fmt: skip


@pytest.mark.parametrize("staging_mount", ["kept", "gone"])
def test_a_plugin_restarted_without_its_records_mounts_again_and_leaves_no_mount(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path, staging_mount: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="driversdk.csi")
    first = plugin_factory(options=FORGET)
    manager = _manager(first, tmp_path)
    volume = make_volume(manager.client)
    manager.mount(volume, "alloc-a", MULTI)
    host_stage, _ = manager.staging_paths(volume, MULTI)
    first.kill()
    os.unlink(first.socket)  # stale: the next plugin's start is awaited by its socket appearing
    manager.client.close()
    if staging_mount == "gone":
        # What a plugin in a container leaves when its mount namespace goes: state.db still says
        # staged, the staging path is no mount.
        subprocess.run(["umount", host_stage], check=True)

    manager = _manager(plugin_factory(options=FORGET), tmp_path)
    try:
        info = manager.mount(volume, "alloc-b", MULTI)
        Path(info.pinned, "written").write_text("b\n")
        assert (Path(first.root) / "volumes" / volume.external_id / "written").read_text() == "b\n"
        # alloc-a's target is one the plugin no longer knows: it answers OK and leaves it mounted.
        manager.unmount(volume, "alloc-a", MULTI)
        host_target, _ = manager.publish_paths(volume, "alloc-a", MULTI)
        assert (
            f'volume "{volume.id}": CSI plugin "hostpath" answered NodeUnpublishVolume but {host_target} was still '
            "mounted: the plugin had lost its record of it, so the runner unmounted it"
        ) in caplog.messages
        manager.unmount(volume, "alloc-b", MULTI)
    finally:
        manager.close()
        manager.client.close()
    assert mounts_under(tmp_path / "csi") == []
    assert manager.store.usages("hostpath") == []
    assert not manager.store.staged("hostpath", volume.namespace, volume.id, MULTI.key)


def test_a_forgotten_target_whose_parent_became_a_symlink_is_not_followed(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path
) -> None:
    """The plugin's tree is the plugin's to write: while NodeUnpublishVolume runs it moves the
    alloc's directory away and puts a symlink in its place that leads to a mount outside the
    tree. The runner's own unmount must refuse, never unmount what the link leads to."""
    first = plugin_factory(options=FORGET)
    manager = _manager(first, tmp_path)
    volume = make_volume(manager.client)
    manager.mount(volume, "alloc-a", MULTI)
    first.kill()
    os.unlink(first.socket)  # stale: the next plugin's start is awaited by its socket appearing
    manager.client.close()
    manager = _manager(plugin_factory(faults="NodeUnpublishVolume=delay:2", options=FORGET), tmp_path)
    host_target, _ = manager.publish_paths(volume, "alloc-a", MULTI)
    alloc_dir = Path(host_target).parent.parent
    outside = tmp_path / "outside"
    victim = outside / Path(host_target).relative_to(alloc_dir)
    victim.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(victim), str(victim)], check=True)
    errors: list[BaseException] = []

    def unmount() -> None:
        try:
            manager.unmount(volume, "alloc-a", MULTI)
        except BaseException as err:  # handed to the test thread
            errors.append(err)

    worker = threading.Thread(target=unmount)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while manager.client.plugin_info().manifest.get("calls.NodeUnpublishVolume") != "1":
            assert time.monotonic() < deadline, "NodeUnpublishVolume never reached the plugin"
            time.sleep(0.02)  # the call is under way (it takes 2 s): the swap happens during it
        os.rename(alloc_dir, tmp_path / "moved")
        os.symlink(outside, alloc_dir)
        worker.join(60)
        assert not worker.is_alive()
        [err] = errors
        assert isinstance(err, CSIError)
        assert "answered NodeUnpublishVolume but" in str(err) and "passes through a symlink" in str(err), err
        assert is_mount_point(str(victim)), "the mount the symlink leads to was not touched"
    finally:
        subprocess.run(["umount", "-l", str(victim)], capture_output=True)
        manager.close()
        manager.client.close()
