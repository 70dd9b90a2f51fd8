"""driversdk.childwait.wait_child: a child's exit seen through its pidfd, the child reaped (no
zombie left), a child that outlives the timeout left running. Real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from driversdk.childwait import wait_child


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_an_exiting_child_is_seen_and_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert wait_child(child, 30)
    assert child.returncode == 3
    assert _state(child.pid) is None  # reaped: not even a zombie


def test_a_child_that_outlives_the_timeout_is_left_running() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert not wait_child(child, 0.2)
        assert child.poll() is None and _state(child.pid) in ("S", "R")
        child.send_signal(signal.SIGTERM)
        assert wait_child(child, 30)
        assert child.returncode == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_a_child_already_gone_or_reaped_elsewhere_counts_as_exited() -> None:
    child = subprocess.Popen(["true"])
    os.waitpid(child.pid, 0)  # reaped behind Popen's back, as a process-wide reaper could
    assert wait_child(child, 5)
    done = subprocess.Popen(["true"])
    done.wait()
    assert wait_child(done, 5)
