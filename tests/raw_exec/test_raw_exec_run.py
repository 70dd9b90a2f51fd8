"""raw_exec end to end through the runner CLI: `driversdk run` of a job with driver = "raw_exec"."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.agent.runs import (
    NO_RESTARTS,
    db_rows,
    plugin_pid,
    raw_exec_client,
    raw_exec_job,
    run_cli,
    start_run,
    wait_for,
)
from tests.raw_exec.conftest import Tracker

pytestmark = pytest.mark.root


def _files(
    track: Tracker,
    *,
    enabled: bool,
    script: str = "echo hello from $NOMAD_TASK_NAME; pwd; echo oops >&2",
    restart: str = "",
) -> tuple[Path, Path, Path]:
    job = raw_exec_job(track.base / "job.hcl", "raw", script, job_type="batch", group=restart)
    return job, raw_exec_client(track, enabled=enabled), track.base / "data"


def test_raw_exec_job_runs_through_the_runner_cli(track: Tracker, no_leaks: None) -> None:
    job, client, data = _files(track, enabled=True)
    done = run_cli("run", str(job), "--client", str(client))
    assert done.returncode == 0, done.stdout + done.stderr
    assert '==> task "work" started (raw_exec' in done.stdout, done.stdout
    assert '==> task "work" finished with exit code 0' in done.stdout, done.stdout
    (alloc,) = (data / "allocs").iterdir()
    logs = alloc / "alloc" / "logs"
    # A host process: its working dir is the task dir on the host.
    assert (logs / "work.stdout.0").read_text() == f"hello from work\n{alloc / 'work'}\n"
    assert (logs / "work.stderr.0").read_text() == "oops\n"
    assert "Traceback" not in done.stdout + done.stderr


def test_raw_exec_task_dirs_in_its_environment_are_host_paths(track: Tracker, no_leaks: None) -> None:
    # Without file-system isolation /local is the host's /local: the env names the real dirs.
    script = "echo a > $NOMAD_TASK_DIR/f; echo b > $NOMAD_ALLOC_DIR/data/f; echo $NOMAD_SECRETS_DIR"
    job, client, data = _files(track, enabled=True, script=script)
    done = run_cli("run", str(job), "--client", str(client))
    assert done.returncode == 0, done.stdout + done.stderr
    (alloc,) = (data / "allocs").iterdir()
    assert (alloc / "work" / "local" / "f").read_text() == "a\n"
    assert (alloc / "alloc" / "data" / "f").read_text() == "b\n"
    assert (alloc / "alloc" / "logs" / "work.stdout.0").read_text() == f"{alloc / 'work' / 'secrets'}\n"


def test_raw_exec_job_on_a_client_that_did_not_enable_it_is_refused(track: Tracker, no_leaks: None) -> None:
    job, client, _ = _files(track, enabled=False)
    done = run_cli("run", str(job), "--client", str(client))
    assert done.returncode != 0
    assert (
        "error: task 'work': the raw_exec driver is disabled on this client; an operator enables it in the "
        'client config with plugin "raw_exec" { config { enabled = true } }'
    ) in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_raw_exec_plugin_killed_mid_run_is_relaunched_and_the_task_recovered(track: Tracker, no_leaks: None) -> None:
    job, client, data = _files(track, enabled=True, script="echo up; sleep 4; exit 7", restart=NO_RESTARTS)
    proc = start_run(job, client)
    try:
        pid = int(str(wait_for("the raw_exec plugin", lambda: plugin_pid(data, "raw_exec"))))
        wait_for("the task to run", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'"))
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out + err
    assert "driver plugin 'raw_exec' exited; relaunching it and recovering the task" in out, out
    assert '==> task "work" recovered (raw_exec' in out, out
    assert '==> task "work" finished with exit code 7' in out, out
    assert "Traceback" not in out + err
