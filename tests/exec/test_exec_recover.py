"""A plugin killed mid-task and relaunched recovers the task and still reports its real exit."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from drivers.exec.store import DriverState
from driversdk.errors import PluginCallError
from driversdk.model import TaskState
from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import PLUGIN, Tracker, sh
from tests.process_drivers import check_recovers_a_pre_kit_task

pytestmark = pytest.mark.root

TIMEOUT = 60
WAIT_FOR_GO = sh("echo ready; while [ ! -e /local/go ]; do sleep 0.05; done; echo after-go; exit 42")


def _wait_until(predicate: object, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_exec_recover_running_task_after_plugin_kill(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=WAIT_FOR_GO)
    handle = harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    old_pid = harness.client.process.pid
    client = harness.restart_plugin()
    assert client.process.pid != old_pid
    client.recover_task(handle)
    client.recover_task(handle)  # already tracked: a no-op
    assert client.inspect_task(task.id).state == TaskState.RUNNING
    (alloc.path / "web/local/go").touch()
    result = client.wait_task(task.id, timeout=TIMEOUT)
    assert (result.exit_code, result.signal) == (42, 0)
    # The task kept its log fifo across the plugin's death.
    alloc.wait_for_output("web", b"after-go\n", timeout=10)


def test_exec_recover_task_that_exited_while_plugin_was_down(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=WAIT_FOR_GO)
    handle = harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    state = DriverState.decode(handle.driver_state, handle.version)
    os.kill(harness.client.process.pid, signal.SIGKILL)
    (alloc.path / "web/local/go").touch()
    _wait_until(lambda: os.path.exists(state.status_file))
    client = harness.restart_plugin()
    client.recover_task(handle)
    result = client.wait_task(task.id, timeout=TIMEOUT)
    assert result.exit_code == 42
    status = client.inspect_task(task.id)
    assert status.state == TaskState.EXITED and status.completed_at is not None


def test_exec_recover_fails_cleanly_when_supervisor_is_gone(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 120"))
    handle = harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    state = DriverState.decode(handle.driver_state, handle.version)
    os.kill(harness.client.process.pid, signal.SIGKILL)
    os.kill(state.supervisor_pid, signal.SIGKILL)  # nobody is left to record the exit
    client = harness.restart_plugin()
    with pytest.raises(PluginCallError) as err:
        client.recover_task(handle)
    harness.forget(task.id)
    assert "cannot be recovered: its supervisor" in err.value.message and err.value.recoverable
    assert not track.leftovers()


def test_exec_recover_rejects_unknown_state_version(harness: DriverHarness, alloc: AllocDir) -> None:
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


def test_exec_recovered_task_can_be_stopped_signalled_and_exec_into(harness: DriverHarness, alloc: AllocDir) -> None:
    script = "trap 'echo got-usr1' USR1; echo ready; while :; do sleep 0.1; done"
    task = alloc.task_config("web", driver_config=sh(script))
    handle = harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    client = harness.restart_plugin()
    client.recover_task(handle)
    client.signal_task(task.id, "SIGUSR1")
    alloc.wait_for_output("web", b"got-usr1\n", timeout=TIMEOUT)
    assert client.exec_task(task.id, ["/bin/busybox", "true"], timeout=30).result.exit_code == 0
    client.stop_task(task.id, timeout=0.5, signal="SIGTERM")
    assert client.wait_task(task.id, timeout=TIMEOUT).signal == signal.SIGKILL


def test_exec_recovers_a_task_its_pre_kit_version_started(
    plugin_config: dict[str, Any], alloc: AllocDir, no_leaks: None
) -> None:
    # That version ran runc under a /bin/sh that wrote "<code>\n"; today's plugin must still find,
    # signal, stop, read and remove it (no container, cgroup, mount or state left: no_leaks).
    check_recovers_a_pre_kit_task(PLUGIN, PLUGIN, plugin_config, alloc, sh)
