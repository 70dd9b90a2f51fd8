"""A task that ended while its run was dead: the next run on the data dir records how it ended
(its exit code, or "lost" when the driver cannot say) and reports no failed removal of it.
Real CLI, real exec plugin and tasks, the run (and its plugin) SIGKILLed as in test_run_faults."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.agent.runs import NO_RESTARTS, ROOT, cli, db_rows, leaks, start_run, wait_for, write_job


def _kill_run_then_let_the_task_exit(job: Path, client: Path, data: Path) -> None:
    """SIGKILL the run and its plugin (one process group) while the task runs; the task, which is
    not in that group, exits by itself afterwards."""
    proc = subprocess.Popen(
        cli("run", str(job), "--client", str(client)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        wait_for("the task to run", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'"))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(3)  # the task's `sleep 1; exit 5` is over


def _run_again(job: Path, client: Path) -> tuple[int, str]:
    proc = start_run(job, client)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in out + err
    return proc.returncode, out + err


@pytest.mark.timeout(180)
def test_a_task_that_ended_while_its_run_was_dead_is_recorded_with_its_exit_code(tmp_path: Path) -> None:
    job, client, data = write_job(tmp_path, "echo up; sleep 1; exit 5", driver="exec", restart=NO_RESTARTS)
    _kill_run_then_let_the_task_exit(job, client, data)
    code, out = _run_again(job, client)
    assert code == 1, out
    assert '==> task "work" finished with exit code 5' in out, out
    assert "destroy failed" not in out, out
    assert db_rows(data, "SELECT state, exit_code FROM run_tasks") == [("failed", 5)]
    assert leaks(None, tmp_path) == []


@pytest.mark.timeout(180)
def test_a_task_that_ended_unrecoverably_while_its_run_was_dead_is_lost_not_a_failed_destroy(
    tmp_path: Path,
) -> None:
    job, client, data = write_job(tmp_path, "echo up; sleep 1; exit 5", driver="exec", restart=NO_RESTARTS)
    _kill_run_then_let_the_task_exit(job, client, data)
    # What the exec driver kept of the task is gone too (a reboot clears its state dir): no
    # driver can tell how the task ended.
    shutil.rmtree(tmp_path / "exec-state" / "tasks")
    code, out = _run_again(job, client)
    assert code == 1, out
    assert '==> task "work" lost: it ended or went while no run followed it' in out, out
    assert "destroy failed" not in out, out
    assert "is not known" not in out, out
    assert db_rows(data, "SELECT state, exit_code FROM run_tasks") == [("lost", None)]
    status = subprocess.run(cli("status", "--data-dir", str(data)), capture_output=True, text=True, cwd=ROOT)
    assert "lost" in status.stdout, status.stdout
    assert leaks(None, tmp_path) == []
