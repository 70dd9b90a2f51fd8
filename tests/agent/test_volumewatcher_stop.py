"""The background volume watcher of a run stops at once: its thread waits between passes on the
registry's event queue, and stop() wakes it there instead of waiting out the pause."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from driversdk.agent.csi.registry import PluginRegistration, PluginRegistry
from driversdk.agent.csi.volumes import Claim, ClaimDetail, VolumeStore
from driversdk.agent.csi.volumewatcher import BackgroundWatcher
from driversdk.agent.state.runstate import RunState
from driversdk.csi.model import AccessMode, AttachmentMode, Volume, VolumeCapability

# Far longer than any test runs: a thread still alive after stop() was not woken.
HOUR = 3600.0


def past_claim(data: Path, alloc_id: str = "gone") -> None:
    """A claim of a stopped allocation that mounted nothing: the next pass releases it."""
    store = VolumeStore(str(data / "state.db"))
    if store.get("vol", "default") is None:
        cap = VolumeCapability(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.FILE_SYSTEM)
        store.register(Volume(id="vol", plugin_id="hostpath", capabilities=[cap]))
    runs = RunState(str(data))
    runs.alloc_started(alloc_id, "job", "app", 0, str(data / "allocs" / alloc_id))
    runs.alloc_update(alloc_id, state="stopped")
    runs.close()
    detail = ClaimDetail(plugin_id="hostpath").to_json()
    store.claim(Claim("default", "vol", alloc_id, "job", "write", "single-node-writer", "file-system", detail=detail))
    store.close()


def test_stop_wakes_the_thread_waiting_between_passes(tmp_path: Path) -> None:
    past_claim(tmp_path)
    said: list[str] = []
    first_pass = threading.Event()

    def say(volume: str, text: str) -> None:
        said.append(text)
        first_pass.set()

    watcher = BackgroundWatcher(str(tmp_path), PluginRegistry(), say, interval=HOUR)
    assert first_pass.wait(30), "the first pass did not run"
    # The thread has done its pass and waits (or is about to wait) an hour for the next one.
    watcher.stop()
    watcher._thread.join(timeout=0)
    assert not watcher._thread.is_alive()
    assert said == ['released the past claim of alloc gone (job job) on CSI volume "vol"']


def test_a_registration_still_starts_a_pass_at_once(tmp_path: Path) -> None:
    past_claim(tmp_path, "first")
    registry = PluginRegistry()
    said: queue.Queue[str] = queue.Queue()
    watcher = BackgroundWatcher(str(tmp_path), registry, lambda volume, text: said.put(text), interval=HOUR)
    try:
        assert "alloc first " in said.get(timeout=30)  # the first pass is done
        # A claim that becomes past after the first pass: only a pass a registration starts
        # frees it within the hour.
        past_claim(tmp_path, "second")
        registry.register(PluginRegistration("csi-node", "hostpath", "a1", str(tmp_path / "csi.sock")))
        assert "alloc second " in said.get(timeout=30)
    finally:
        watcher.stop()
    assert not watcher._thread.is_alive()
