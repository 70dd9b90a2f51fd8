"""A plugin killed inside StartTask leaves nothing behind: raw_exec's reconciler and the replace
of an abandoned start of the same task id. Real plugins, real processes, real cgroups."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from drivers.raw_exec import reconcile
from drivers.raw_exec.driver import task_key_for
from drivers.raw_exec.store import RawState
from driversdk.taskkit import owner as kit
from driversdk.testing import AllocDir, DriverHarness
from tests.raw_exec.conftest import PLUGIN, Tracker, sh

pytestmark = pytest.mark.root

TIMEOUT = 60


def _wait_until(predicate: Callable[[], object], timeout: float = TIMEOUT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached"
        time.sleep(0.05)


def _dead(pid: int) -> bool:
    """Gone, or a zombie its new parent (init, after its own parent was killed) has yet to reap."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.fixture
def quick_config(plugin_config: dict[str, Any]) -> dict[str, Any]:
    return {**plugin_config, "reconcile": {"enabled": True, "period": "1s", "creation_grace": "0s"}}


@pytest.fixture
def quick_harness(quick_config: dict[str, Any], no_leaks: None) -> Iterator[DriverHarness]:
    with DriverHarness(PLUGIN, plugin_config=quick_config) as h:
        yield h


def _pretend_start_never_returned(track: Tracker, task_id: str) -> reconcile.TaskRecord:
    """Rewrite a task's record as a start whose plugin died before handing back the handle."""
    path = kit.record_path(str(track.state_dir / "tasks" / task_key_for(task_id)))
    record = reconcile.load(path)
    assert record is not None and record.phase == "started"
    starting = dataclasses.replace(record, phase="starting", since=record.since - 3600)
    kit.save(starting)
    return starting


def test_raw_exec_plugin_killed_mid_start_task_leaves_nothing(
    quick_harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    # StartTask blocks, for real, on a stdout fifo nobody reads: record, state dir and cgroup
    # exist by then. The plugin is killed right there.
    alloc.add_task("slow", log_collection=False)
    task = alloc.task_config("slow", driver_config=sh("echo never"))
    for fifo in (task.stdout_path, task.stderr_path):
        os.mkfifo(fifo, 0o600)
    failed: list[BaseException] = []

    def start() -> None:
        try:
            quick_harness.client.start_task(task)
        except BaseException as err:
            failed.append(err)

    starter = threading.Thread(target=start)
    starter.start()
    _wait_until(lambda: track.cgroups(), what="the task's cgroup")
    os.kill(quick_harness.client.process.pid, signal.SIGKILL)
    starter.join(30)
    assert failed, "StartTask returned although its plugin was killed"
    left = track.leftovers()
    assert left.get("cgroups") and left.get("task state")
    relaunched = quick_harness.restart_plugin()
    _wait_until(lambda: not track.leftovers(), what="removal of the abandoned start")
    assert relaunched.capabilities().exec


def test_raw_exec_running_task_of_a_start_that_never_returned_is_removed(
    quick_harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 300"))
    state = RawState.decode(*(lambda h: (h.driver_state, h.version))(quick_harness.start(task)))
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    os.kill(quick_harness.client.process.pid, signal.SIGKILL)
    quick_harness.forget(task.id)  # the host never got the handle
    _pretend_start_never_returned(track, task.id)
    quick_harness.restart_plugin()
    _wait_until(lambda: not track.leftovers(), what="removal of the abandoned task")
    assert _dead(state.task_pid)
    # The state dir's shared supervisor has no task left: it goes on its own.
    _wait_until(lambda: _dead(state.supervisor_pid), what="the idle shared supervisor's exit")


def test_raw_exec_reconciler_spares_a_started_task_of_a_dead_plugin(
    quick_harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 300"))
    handle = quick_harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    client = quick_harness.restart_plugin()
    time.sleep(2.5)  # two passes with no grace
    state = RawState.decode(handle.driver_state, handle.version)
    assert not _dead(state.task_pid), "a started task belongs to the host"
    client.recover_task(handle)
    client.destroy_task(task.id, force=True)
    quick_harness.forget(task.id)
    assert not track.leftovers()


def test_raw_exec_start_of_the_same_task_id_replaces_an_abandoned_start(
    plugin_config: dict[str, Any], alloc: AllocDir, track: Tracker, no_leaks: None
) -> None:
    config = {**plugin_config, "reconcile": {"enabled": False}}
    with DriverHarness(PLUGIN, plugin_config=config) as h:
        task = alloc.task_config("web", driver_config=sh("echo ready; sleep 300"))
        first = RawState.decode(*(lambda hd: (hd.driver_state, hd.version))(h.start(task)))
        alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
        os.kill(h.client.process.pid, signal.SIGKILL)
        _pretend_start_never_returned(track, task.id)
        client = h.restart_plugin()
        second = RawState.decode(*(lambda hd: (hd.driver_state, hd.version))(client.start_task(task)))
        _wait_until(lambda: _dead(first.task_pid), what="the abandoned task's end")
        assert second.task_pid != first.task_pid and not _dead(second.task_pid)
