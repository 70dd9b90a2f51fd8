"""raw_exec end to end through the runner CLI: `driversdk run` of a job with driver = "raw_exec"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.raw_exec.conftest import Tracker

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]


def _files(track: Tracker, *, enabled: bool) -> tuple[Path, Path, Path]:
    data = track.base / "data"
    job = track.base / "job.hcl"
    job.write_text(
        """job "raw" {
  group "g" {
    task "work" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo hello from $NOMAD_TASK_NAME; pwd; echo oops >&2"]
      }
    }
  }
}
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


def test_raw_exec_job_on_a_client_that_did_not_enable_it_is_refused(track: Tracker, no_leaks: None) -> None:
    job, client, _ = _files(track, enabled=False)
    done = _run(job, client)
    assert done.returncode != 0
    assert (
        "error: task 'work': the raw_exec driver is disabled on this client; an operator enables it in the "
        'client config with plugin "raw_exec" { config { enabled = true } }'
    ) in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
