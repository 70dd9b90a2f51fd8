"""Cancelling CSI calls: a call the plugin never answers ends when its token is cancelled or its
per-call deadline passes, against the real reference plugin told to hang (no timing asserted: a
call that does not end fails the bounded join)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from driversdk.agent.csi.manager import NodeVolumeManager
from driversdk.agent.csi.state import StateStore
from driversdk.csi.cancel import CallCancelled, Cancel
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from tests.csi.conftest import HostPathPlugin, mounts_under
from tests.csi.hostpathvol import MULTI, make_volume

JOIN = 30.0  # a call still running after this hangs


def _calls(plugin: HostPathPlugin, rpc: str) -> int:
    probe = CSIClient(plugin.socket, plugin="hostpath")
    try:
        return int(probe.plugin_info().manifest.get(f"calls.{rpc}", "0"))
    finally:
        probe.close()


def _in_background(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


@pytest.mark.timeout(90)
def test_cancel_ends_a_publish_the_plugin_never_answers_and_the_manager_undoes_its_mount(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path
) -> None:
    plugin = plugin_factory("NodePublishVolume=hang")
    cancel = Cancel()
    client = CSIClient(plugin.socket, plugin="hostpath", cancel=cancel)
    store = StateStore(str(tmp_path / "state.db"))
    root = tmp_path / "csi"
    manager = NodeVolumeManager(client, plugin_id="hostpath", host_root=str(root), store=store, requires_staging=True)
    volume = make_volume(CSIClient(plugin.socket, plugin="hostpath"))
    thread, errors = _in_background(lambda: manager.mount(volume, "alloc-a", MULTI))
    while _calls(plugin, "NodePublishVolume") == 0:
        assert thread.is_alive(), errors
        time.sleep(0.05)
    cancel.cancel()
    thread.join(JOIN)
    assert not thread.is_alive(), "the cancelled publish still waits for the plugin"
    manager.close()
    [err] = errors
    assert isinstance(err, CallCancelled) and err.call == "NodePublishVolume"
    assert (
        str(err)
        == f'interrupted: NodePublishVolume of volume "{volume.remote_id}" on CSI plugin "hostpath" was given up'
    )
    assert _calls(plugin, "NodePublishVolume") == 1, "a cancelled call is not retried"
    # The unstage of the mount's undo was given up too: the stage stays recorded for a teardown.
    assert store.usages("hostpath") == []
    assert store.staged("hostpath", volume.namespace, volume.id, MULTI.key)
    later = NodeVolumeManager(
        CSIClient(plugin.socket, plugin="hostpath"), plugin_id="hostpath", host_root=str(root), store=store,
        requires_staging=True,
    )  # fmt: skip
    later.unmount(volume, "alloc-a", MULTI)
    later.close()
    assert mounts_under(root) == []
    with pytest.raises(CallCancelled):
        CSIClient(plugin.socket, plugin="hostpath", cancel=cancel)  # a cancelled token opens nothing new


@pytest.mark.timeout(90)
def test_call_timeout_bounds_a_call_the_plugin_never_answers(plugin_factory: Callable[..., HostPathPlugin]) -> None:
    plugin = plugin_factory("NodeUnpublishVolume=hang")
    client = CSIClient(plugin.socket, plugin="hostpath", call_timeout=1.0)
    volume = make_volume(CSIClient(plugin.socket, plugin="hostpath"))
    thread, errors = _in_background(lambda: client.node_unpublish(volume, "/nowhere/target"))
    thread.join(JOIN)
    assert not thread.is_alive(), "the call outlived its deadline"
    [err] = errors
    assert isinstance(err, CSIError) and not isinstance(err, CallCancelled)
    assert err.code == "DEADLINE_EXCEEDED" and err.call == "NodeUnpublishVolume"
