"""Checks both process drivers (exec, raw_exec) must pass; each driver's tests call them with its
own plugin, config and shell task, so the two stay held to one standard."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from driversdk.driver import DriverPlugin
from driversdk.errors import TaskNotFoundError
from driversdk.model import ExitResult
from driversdk.testing import AllocDir, DriverHarness

TIMEOUT = 60
LOW_SOFT = 1024
Shell = Callable[[str], dict[str, Any]]


def check_watch_exit(driver: DriverPlugin, alloc: AllocDir, task_reads: str, sh: Shell) -> None:
    """watch_exit called in-process as the SDK's server calls it: an unknown task is refused,
    the callback comes once without a thread of its own, and at once after the exit.
    ``task_reads`` is where the task sees the "web" task's local/go (a fifo it blocks on)."""
    with pytest.raises(TaskNotFoundError):
        driver.watch_exit("no-such-task", lambda result: None)
    task = alloc.task_config("web", driver_config=sh(f"read x < {task_reads}; exit 3"))
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


@contextlib.contextmanager
def _low_soft_nofile() -> Iterator[int]:
    """Lower this process's soft open-file limit (children inherit it) while the block runs;
    yields the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LOW_SOFT, hard), hard))
    try:
        yield hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def check_tasks_keep_nofile(plugin: list[str], plugin_config: dict[str, Any], allocs: Path, sh: Shell) -> None:
    """The plugin raises its own open-file limit (one pidfd per task it waits for); its tasks get
    the limit it was started with, as Nomad's tasks get the agent's (Go restores it for children)."""
    names = ["first", "second"]
    alloc = AllocDir.create(allocs, tasks=names)
    try:
        with _low_soft_nofile() as hard:
            if hard <= LOW_SOFT:
                pytest.skip(f"the hard open-file limit {hard} leaves nothing to raise")
            harness = DriverHarness(plugin, plugin_config=plugin_config)
        with harness as h:
            pid = h.client.process.pid
            # The first task makes the plugin start its process watcher, which raises the limit.
            for name in names:
                task = alloc.task_config(name, driver_config=sh("ulimit -n; ulimit -Hn"))
                h.start(task)
                assert h.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
                h.client.destroy_task(task.id, force=False)
                h.forget(task.id)
                shown = alloc.wait_for_output(name, b"\n", 30).split()
                assert shown == [str(LOW_SOFT).encode(), str(hard).encode()]
            with open(f"/proc/{pid}/limits") as fh:
                line = next(x for x in fh if x.startswith("Max open files"))
            assert line.split()[3] == str(hard), f"the plugin did not raise its own limit: {line!r}"
    finally:
        alloc.close()
