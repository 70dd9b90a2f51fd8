"""watch_exit on the raw_exec driver, called in-process as the SDK's server calls it."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from drivers.raw_exec.driver import RawExecDriver
from driversdk.errors import TaskNotFoundError
from driversdk.model import ExitResult
from driversdk.testing import AllocDir
from tests.raw_exec.conftest import sh

pytestmark = pytest.mark.root

TIMEOUT = 60


@pytest.fixture
def driver(plugin_config: dict[str, Any], no_leaks: None) -> Iterator[RawExecDriver]:
    drv = RawExecDriver()
    drv.set_config(plugin_config, None)
    yield drv
    drv.shutdown()


def test_raw_exec_watch_exit_reports_the_exit_once_without_a_thread(driver: RawExecDriver, alloc: AllocDir) -> None:
    with pytest.raises(TaskNotFoundError):
        driver.watch_exit("no-such-task", lambda result: None)
    task = alloc.task_config("web", driver_config=sh("read x < local/go; exit 3"))
    go = alloc.path / "web" / "local" / "go"
    os.mkfifo(go)  # the task blocks reading it until the test writes a line
    driver.start_task(task)
    try:
        threads = threading.active_count()
        seen: list[ExitResult] = []
        reported = threading.Event()

        def on_exit(result: ExitResult) -> None:
            seen.append(result)
            reported.set()

        assert driver.watch_exit(task.id, on_exit) is True
        assert threading.active_count() == threads  # the callback waits; no thread does
        assert not seen
        go.write_text("go\n")
        assert reported.wait(TIMEOUT)
        assert seen == [ExitResult(exit_code=3)]
        assert driver.wait_task(task.id) == ExitResult(exit_code=3)
        late: list[ExitResult] = []
        assert driver.watch_exit(task.id, late.append)  # already exited: called at once
        assert late == [ExitResult(exit_code=3)]
    finally:
        driver.destroy_task(task.id, force=True)
