"""raw_exec tasks run under the state dir's one shared supervisor: a single process for many
tasks, each task its child, recovered through it after a plugin crash, and ended with an 'exit
status unknown' event when it is killed."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from drivers.raw_exec.store import RawState
from driversdk.model import TaskEvent, TaskHandle
from driversdk.taskkit.owner import ProcessIdentity, stat_fields
from driversdk.testing import AllocDir, DriverHarness
from tests.raw_exec.conftest import Tracker, sh

pytestmark = pytest.mark.root

TIMEOUT = 60
TASKS = 10


def _state(handle: TaskHandle) -> RawState:
    return RawState.decode(handle.driver_state, handle.version)


def _supervisors(state_dir: Path) -> list[int]:
    needle = str(state_dir).encode()
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if b"launch.py" in argv and needle in argv:
            found.append(int(name))
    return found


def _wait_until(predicate: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not reached"
        time.sleep(0.05)


def test_raw_exec_tasks_share_one_supervisor_and_survive_a_plugin_crash(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    go = alloc.path / "alloc" / "data" / "go"
    tasks = [
        alloc.task_config("web", driver_config=sh(f"while [ ! -e {go} ]; do sleep 0.2; done; exit {i}"))
        for i in range(TASKS)
    ]
    handles = [harness.start(t) for t in tasks]
    states = [_state(h) for h in handles]
    sup = states[0].supervisor_pid
    assert _supervisors(track.state_dir) == [sup]
    for s in states:
        fields = stat_fields(s.task_pid)
        assert fields is not None and int(fields[1]) == sup  # the task is the supervisor's child
    client = harness.restart_plugin()
    for handle in handles:
        client.recover_task(handle)
    assert _supervisors(track.state_dir) == [sup]
    killed = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["120"]})
    state = _state(harness.start(killed))
    assert state.supervisor_pid == sup  # adopted, not a second one
    os.kill(state.task_pid, signal.SIGKILL)
    assert (r := client.wait_task(killed.id, timeout=TIMEOUT)).signal == signal.SIGKILL and r.exit_code == 137
    go.touch()
    for i, task in enumerate(tasks):
        result = client.wait_task(task.id, timeout=TIMEOUT)
        assert (result.exit_code, result.signal) == (i, 0)


def test_raw_exec_supervisor_killed_ends_tasks_with_unknown_status(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    events: list[TaskEvent] = []
    stream = harness.client.task_events()
    threading.Thread(target=lambda: events.extend(stream), daemon=True).start()
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 300"))
    state = _state(harness.start(task))
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    os.kill(state.supervisor_pid, signal.SIGKILL)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == -1
    _wait_until(lambda: any("exit status unknown because the task supervisor" in e.message for e in events), "event")
    assert not ProcessIdentity(state.task_pid, state.task_start_time).alive()
    fresh = alloc.task_config("web", driver_config=sh("exit 6"))
    assert _state(harness.start(fresh)).supervisor_pid != state.supervisor_pid
    assert harness.client.wait_task(fresh.id, timeout=TIMEOUT).exit_code == 6
