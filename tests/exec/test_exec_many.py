"""Many tasks on one plugin: the driver waits for all of them without a thread per task."""

from __future__ import annotations

import pytest

from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import Tracker, sh

pytestmark = pytest.mark.root

TIMEOUT = 120
TASKS = 50
# Threads the plugin may add while its tasks go from 1 to 50 that are not per task: the gRPC
# server's pool grows only when every worker is busy, and calls here come one at a time.
SLACK = 5


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError(f"no Threads line in /proc/{pid}/status")


def test_exec_fifty_tasks_add_no_thread_per_task(harness: DriverHarness, track: Tracker) -> None:
    names = [f"t{i}" for i in range(TASKS)]
    alloc = AllocDir.create(track.base / "allocs", tasks=names)
    track.alloc_ids.add(alloc.alloc_id)
    go = alloc.path / "alloc" / "data" / "go"  # /alloc/data/go in every task: releases them all
    tasks = [
        alloc.task_config(name, driver_config=sh(f"while [ ! -e /alloc/data/go ]; do sleep 1; done; exit {i}"))
        for i, name in enumerate(names)
    ]
    try:
        pid = harness.client.process.pid
        # Threads are counted with no WaitTask open: the sync gRPC server holds a thread per open
        # call, which is the SDK's side of the problem and not the driver's.
        harness.start(tasks[0])
        with_one = _threads(pid)
        for task in tasks[1:]:
            harness.start(task)
        with_all = _threads(pid)
        assert with_all <= with_one + SLACK, f"{with_one} threads with 1 task, {with_all} with {TASKS}"

        go.touch()
        for i, task in enumerate(tasks):
            result = harness.client.wait_task(task.id, timeout=TIMEOUT)
            assert (result.exit_code, result.signal, result.oom_killed) == (i, 0, False)
        for task in tasks:
            harness.client.destroy_task(task.id, force=False)
            harness.forget(task.id)
    finally:
        alloc.close()
