"""A plugin SIGKILLed mid-task and relaunched recovers the task and reports its real exit."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from drivers.raw_exec.store import RawState
from driversdk.errors import PluginCallError
from driversdk.model import TaskState
from driversdk.testing import AllocDir, DriverHarness
from tests.process_drivers import check_recovers_a_pre_kit_task
from tests.raw_exec.conftest import PLUGIN, Tracker, sh

pytestmark = pytest.mark.root

TIMEOUT = 60
WAIT_FOR_GO = sh("echo ready; while [ ! -e local/go ]; do sleep 0.05; done; echo after-go; exit 42")


def _wait_until(predicate: object, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_raw_exec_recover_running_task_after_plugin_sigkill(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=WAIT_FOR_GO)
    handle = harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    state = RawState.decode(handle.driver_state, handle.version)
    old_pid = harness.client.process.pid
    client = harness.restart_plugin()  # SIGKILL, like a crash
    assert client.process.pid != old_pid
    # The task and its supervisor outlived the plugin.
    assert os.path.exists(f"/proc/{state.task_pid}") and os.path.exists(f"/proc/{state.supervisor_pid}")
    client.recover_task(handle)
    client.recover_task(handle)  # already tracked: a no-op
    assert client.inspect_task(task.id).state == TaskState.RUNNING
    (alloc.path / "web/local/go").touch()
    result = client.wait_task(task.id, timeout=TIMEOUT)
    assert (result.exit_code, result.signal) == (42, 0)
    alloc.wait_for_output("web", b"after-go\n", timeout=10)


def test_raw_exec_recover_task_that_exited_while_the_plugin_was_down(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=WAIT_FOR_GO)
    handle = harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    state = RawState.decode(handle.driver_state, handle.version)
    os.kill(harness.client.process.pid, signal.SIGKILL)
    (alloc.path / "web/local/go").touch()
    _wait_until(lambda: os.path.exists(state.status_file))
    client = harness.restart_plugin()
    client.recover_task(handle)
    assert client.wait_task(task.id, timeout=TIMEOUT).exit_code == 42
    status = client.inspect_task(task.id)
    assert status.state == TaskState.EXITED and status.completed_at is not None


def test_raw_exec_recovered_task_can_be_signalled_exec_into_and_stopped(
    harness: DriverHarness, alloc: AllocDir
) -> None:
    task = alloc.task_config(
        "web", driver_config=sh("trap 'echo got-usr1' USR1; trap '' TERM; echo ready; while :; do sleep 0.1; done")
    )
    handle = harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    client = harness.restart_plugin()
    client.recover_task(handle)
    client.signal_task(task.id, "SIGUSR1")
    alloc.wait_for_output("web", b"got-usr1\n", timeout=TIMEOUT)
    assert client.exec_task(task.id, ["true"], timeout=30).result.exit_code == 0
    client.stop_task(task.id, timeout=0.5, signal="SIGTERM")
    assert client.wait_task(task.id, timeout=TIMEOUT).signal == signal.SIGKILL


def test_raw_exec_recover_fails_cleanly_when_the_supervisor_is_gone(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 120"))
    handle = harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    state = RawState.decode(handle.driver_state, handle.version)
    os.kill(harness.client.process.pid, signal.SIGKILL)
    os.kill(state.supervisor_pid, signal.SIGKILL)  # nobody is left to record the exit
    client = harness.restart_plugin()
    with pytest.raises(PluginCallError) as err:
        client.recover_task(handle)
    harness.forget(task.id)
    assert "cannot be recovered: its supervisor" in err.value.message and err.value.recoverable
    # The orphaned task went with its cgroup.
    _wait_until(lambda: not track.leftovers())


def test_raw_exec_recover_rejects_an_unknown_state_version(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("exit 0"))
    handle = harness.start(task)
    harness.client.wait_task(task.id, timeout=TIMEOUT)
    client = harness.restart_plugin()
    handle.version = 99
    with pytest.raises(PluginCallError) as err:
        client.recover_task(handle)
    assert "unknown state version" in err.value.message
    handle.version = 1
    client.recover_task(handle)


def test_raw_exec_recovers_a_task_its_pre_kit_version_started(
    plugin_config: dict[str, Any], alloc: AllocDir, no_leaks: None
) -> None:
    # That version's supervisor was drivers/raw_exec/launch.py (gone today), started with -c.
    check_recovers_a_pre_kit_task(PLUGIN, PLUGIN, plugin_config, alloc, sh)
