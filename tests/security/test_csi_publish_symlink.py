"""A CSI node plugin owns the tree it publishes in: whatever it leaves at a target is re-checked
after NodePublishVolume, and the task gets a pin of what was checked, never the plugin's path.

The attack: NodePublishVolume replaces the target dir with ``symlink("/", target)``; the CO
resolved the target before the call and handed it on afterwards, so the app task got the host's
root at its volume's destination. Here a real plugin process (the reference hostpath plugin with
a hostile NodePublishVolume, tests/security/hostile_csi_plugin.py) answers over gRPC on a unix
socket, and the node volume manager is the one ``driversdk run`` uses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from driversdk.agent.csi.manager import NodeVolumeManager, pin_root
from driversdk.agent.csi.state import StateStore
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.mountinfo import is_mounted_at, read_mountinfo
from tests.csi.conftest import NODE_ID
from tests.csi.hostpathvol import MULTI, calls, make_volume

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="CSI publishes by mounting: root only")


def _mounts_under(path: Path) -> list[str]:
    return [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(path))]


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Callable[[str], CSIClient]]:
    """Start a plugin module (the reference one or the hostile one) on a unix socket."""
    procs: list[subprocess.Popen[bytes]] = []
    clients: list[CSIClient] = []

    def start(module: str) -> CSIClient:
        sock = tmp_path / "plugin" / "csi.sock"
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--endpoint", f"unix://{sock}", "--root", str(tmp_path / "plugin-root"),
             "--node-id", NODE_ID],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        procs.append(proc)
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the plugin did not start"
            time.sleep(0.05)
        client = CSIClient(str(sock), plugin="hostpath")
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()
    for proc in procs:
        proc.terminate()
        proc.wait(10)
    for point in sorted(_mounts_under(tmp_path), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _manager(client: CSIClient, tmp_path: Path) -> NodeVolumeManager:
    store = StateStore(str(tmp_path / "state.db"))
    root = tmp_path / "csi" / "node" / "hostpath"
    root.mkdir(parents=True, exist_ok=True)
    return NodeVolumeManager(client, plugin_id="hostpath", host_root=str(root), store=store, requires_staging=True)


def test_a_plugin_that_publishes_a_symlink_to_root_is_refused_and_leaves_nothing(
    plugin: Callable[[str], CSIClient], tmp_path: Path
) -> None:
    client = plugin("tests.security.hostile_csi_plugin")
    manager = _manager(client, tmp_path)
    volume = make_volume(client)
    target = Path(manager.publish_paths(volume, "alloc-a", MULTI)[0])
    with pytest.raises(CSIError) as info:
        manager.mount(volume, "alloc-a", MULTI)
    message = str(info.value)
    assert message.startswith(f'volume "{volume.id}": CSI plugin "hostpath" published it at {target}, but ')
    assert "passes through a symlink" in message and "unpublished and not handed to the task" in message
    assert info.value.call == "NodePublishVolume" and info.value.volume == volume.id
    # The planted symlink is gone (unlinked: / is still there), the publish and the stage undone.
    assert not os.path.lexists(target) and os.path.isdir("/etc")
    assert calls(client, "NodeUnpublishVolume") == 1 and calls(client, "NodeUnstageVolume") == 1
    assert _mounts_under(tmp_path) == []
    assert manager.store.usages("hostpath") == []
    assert not manager.store.staged("hostpath", volume.namespace, volume.id, MULTI.key)
    pins = Path(pin_root(manager.host_root))
    assert not pins.exists() or os.listdir(pins) == []


def test_the_task_gets_a_pin_that_a_later_swap_of_the_target_does_not_change(
    plugin: Callable[[str], CSIClient], tmp_path: Path
) -> None:
    client = plugin("driversdk.csi.hostpath")
    manager = _manager(client, tmp_path)
    volume = make_volume(client)
    info = manager.mount(volume, "alloc-a", MULTI)
    pinned = Path(info.pinned)
    assert pinned != Path(info.source) and is_mounted_at(str(pinned))
    assert not str(pinned).startswith(manager.host_root + "/"), "the pin lies outside the plugin's tree"
    pin_dir = os.lstat(pinned.parent)
    assert pin_dir.st_mode & 0o777 == 0o700 and pin_dir.st_uid == 0
    (Path(info.source) / "written").write_text("through the target\n")
    assert (pinned / "written").read_text() == "through the target\n", "the pin is the published volume"
    manager.unmount(volume, "alloc-a", MULTI)
    assert not os.path.lexists(pinned), "the pin goes before NodeUnpublishVolume"
    assert _mounts_under(tmp_path) == [] and manager.store.usages("hostpath") == []
