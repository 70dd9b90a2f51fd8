"""raw_exec end to end through the runner CLI: `driversdk run` of a job with driver = "raw_exec"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.runs import NO_RESTARTS, ROOT, db_rows, wait_for
from tests.raw_exec.conftest import Tracker

pytestmark = pytest.mark.root


def _files(
    track: Tracker,
    *,
    enabled: bool,
    script: str = "echo hello from $NOMAD_TASK_NAME; pwd; echo oops >&2",
    restart: str = "",
) -> tuple[Path, Path, Path]:
    data = track.base / "data"
    job = track.base / "job.hcl"
    job.write_text(
        f"""job "raw" {{
  type = "batch"
  group "g" {{
    {restart}
    task "work" {{
      driver = "raw_exec"
      kill_timeout = "1s"
      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}
    }}
  }}
}}
"""
    )
    client = track.base / "client.hcl"
    client.write_text(
        f'data_dir = "{data}"\n'
        f'plugin "raw_exec" {{\n  config {{\n    enabled = {str(enabled).lower()}\n'
        f'    state_dir = "{track.state_dir}"\n    cgroup_parent = "{track.cgroup_parent}"\n  }}\n}}\n'
    )
    return job, client, data


def _run(job: Path, client: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
    )


def test_raw_exec_job_runs_through_the_runner_cli(track: Tracker, no_leaks: None) -> None:
    job, client, data = _files(track, enabled=True)
    done = _run(job, client)
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
    done = _run(job, client)
    assert done.returncode == 0, done.stdout + done.stderr
    (alloc,) = (data / "allocs").iterdir()
    assert (alloc / "work" / "local" / "f").read_text() == "a\n"
    assert (alloc / "alloc" / "data" / "f").read_text() == "b\n"
    assert (alloc / "alloc" / "logs" / "work.stdout.0").read_text() == f"{alloc / 'work' / 'secrets'}\n"


def test_raw_exec_job_on_a_client_that_did_not_enable_it_is_refused(track: Tracker, no_leaks: None) -> None:
    job, client, _ = _files(track, enabled=False)
    done = _run(job, client)
    assert done.returncode != 0
    assert (
        "error: task 'work': the raw_exec driver is disabled on this client; an operator enables it in the "
        'client config with plugin "raw_exec" { config { enabled = true } }'
    ) in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_raw_exec_plugin_killed_mid_run_is_relaunched_and_the_task_recovered(track: Tracker, no_leaks: None) -> None:
    job, client, data = _files(track, enabled=True, script="echo up; sleep 4; exit 7", restart=NO_RESTARTS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        rows = wait_for(
            "the raw_exec plugin", lambda: db_rows(data, "SELECT reattach FROM run_plugins WHERE driver='raw_exec'")
        )
        pid = int(json.loads(str(rows[0][0]))["pid"])  # type: ignore[index]
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
