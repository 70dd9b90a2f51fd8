"""A `driversdk run` keeps nothing running after it ends: no plugin, no server, no log collector.

The run is started as a bare command line under tests/agent/reaper_run.py, a child subreaper:
whatever the run leaves behind, even a process that detached from it, is re-parented there and
listed when the run has exited. The host's
process table is also searched for anything naming the test's dir (the data dir, the exec state).
Real CLI, real plugins, real dockerd and runc.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from tests.agent.runs import ROOT, cli, leaks, write_job
from tests.hostcheck import processes


def _run_under_reaper(job: Path, client: Path, interrupt_on: str | None = None) -> tuple[int, list[str], str]:
    wrapper = [sys.executable, "-m", "tests.agent.reaper_run"]
    if interrupt_on is not None:
        wrapper += ["--interrupt-on", interrupt_on]
    done = subprocess.run(
        [*wrapper, "--", *cli("run", str(job), "--client", str(client))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.rstrip("\n").rsplit("\n", 1)[-1]
    assert last.startswith("LEFT "), done.stdout + done.stderr
    result = json.loads(last.removeprefix("LEFT "))
    return int(result["code"]), list(result["left"]), done.stdout + done.stderr


@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_a_finished_run_leaves_no_process(engine: docker.DockerClient, tmp_path: Path, driver: str) -> None:
    job, client, _ = write_job(tmp_path, "echo done", driver=driver)
    code, left, output = _run_under_reaper(job, client)
    assert code == 0, output
    assert left == [], f"the run left processes behind: {left}"
    assert processes(str(tmp_path)) == []
    assert leaks(engine if driver == "docker" else None, tmp_path) == []


@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_a_run_stopped_with_ctrl_c_leaves_no_process(engine: docker.DockerClient, tmp_path: Path, driver: str) -> None:
    job, client, _ = write_job(tmp_path, "sleep 300", driver=driver)
    code, left, output = _run_under_reaper(job, client, interrupt_on='task "work" started')
    assert code == 1, output  # interrupted
    assert "interrupted: stopping tasks" in output
    assert left == [], f"the run left processes behind: {left}"
    assert processes(str(tmp_path)) == []
    assert leaks(engine if driver == "docker" else None, tmp_path) == []
