"""driversdk.taskkit.shared and ``launch.py serve``: the shared supervisor, driven directly with
real processes. A launcher that names a pid file (as ``runc run --detach`` does) hands over a
task that is re-parented to the supervisor; one that ends before the launcher is still matched."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from driversdk.errors import DriverError
from driversdk.taskkit import shared
from driversdk.taskkit.supervisor import Launch, read_status

# Forks a child that forks the task and exits at once: the task (exit 7) is re-parented to the
# subreaper and reaped while the launcher still runs; the launcher writes its pid and exits later.
LAUNCHER = """
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    task = os.fork()
    if task == 0:
        os._exit(7)
    os.write(w, str(task).encode())
    os._exit(0)
os.wait()
task = int(os.read(r, 64))
time.sleep(0.5)
with open(sys.argv[1], "w") as fh:
    fh.write(str(task))
"""


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while read_status(str(path)) is None:
        assert time.monotonic() < deadline, f"no status in {path}"
        time.sleep(0.02)


def test_a_task_that_ends_before_its_launcher_writes_the_pid_file_gets_its_status(tmp_path: Path) -> None:
    state = tmp_path / "state"
    task_dir = state / "tasks" / "t1"
    task_dir.mkdir(parents=True)
    pid_file = str(task_dir / "task.pid")
    launch = Launch(path=sys.executable, argv=["python3", "-c", LAUNCHER, pid_file], env={}, cwd="/", pid_file=pid_file)
    out = os.open(os.devnull, os.O_WRONLY)
    try:
        run = shared.spawn(str(state), str(task_dir), launch, out, out, task="t1")
    finally:
        os.close(out)
    assert run.task.pid == int(Path(pid_file).read_text())
    _wait_for(task_dir / "exit_status")
    status = read_status(str(task_dir / "exit_status"))
    assert status is not None and (status.exit_code, status.signal) == (7, 0)
    assert shared.is_server(run.supervisor)
    shared.release(str(state))  # nothing left to supervise: it leaves at once
    assert not shared.is_server(run.supervisor)


def test_a_request_for_a_spec_outside_the_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "tasks").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    marker = tmp_path / "ran"
    launch = Launch(path="/bin/touch", argv=["touch", str(marker)], env={}, cwd="/")
    out = os.open(os.devnull, os.O_WRONLY)
    try:
        with pytest.raises(DriverError, match="is not a launch spec in this state dir"):
            shared.spawn(str(state), str(elsewhere), launch, out, out, task="evil")
    finally:
        os.close(out)
    assert not marker.exists()
    shared.release(str(state))
