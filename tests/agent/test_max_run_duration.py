"""A group's ``max_run_duration`` under `driversdk run` (real CLI, raw_exec plugin processes): the
allocation is stopped when it expires, its tasks killed (not failed), and a bad value is refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.agent.runs import ROOT, cli, raw_exec_client, raw_exec_job
from tests.raw_exec import conftest as raw_exec_fixtures
from tests.raw_exec.conftest import Tracker

track = raw_exec_fixtures.track
no_leaks = raw_exec_fixtures.no_leaks

pytestmark = pytest.mark.usefixtures("no_leaks")


def job(track: Tracker, limit: str, script: str) -> tuple[Path, Path]:
    path = raw_exec_job(track.base / "job.hcl", "long", script, task="app", group=f"max_run_duration = {limit}")
    return path, raw_exec_client(track)


def test_max_run_duration_stops_a_long_task_with_the_event(track: Tracker) -> None:
    path, client = job(track, '"3s"', "echo up; sleep 300")
    done = subprocess.run(
        cli("run", "--json", str(path), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    expired = [e for e in events if "allocation exceeded max_run_duration (3s)" in e["message"]]
    assert len(expired) == 1, done.stdout + done.stderr
    after = events[events.index(expired[0]) :]
    types = [e["type"] for e in after if e["task"] == "app"]
    assert "Killing" in types and "Killed" in types, types
    assert not any(e.get("fails_task") for e in events), "stopped on purpose, not failed"
    assert done.returncode == 0, done.stderr
    (alloc,) = (track.base / "data" / "allocs").iterdir()
    assert (alloc / "alloc" / "logs" / "app.stdout.0").read_text() == "up\n"


@pytest.mark.parametrize(
    ("limit", "why"),
    [
        ('"soon"', "max_run_duration 'soon' is not a duration such as \"30s\""),
        ('"-5s"', "max_run_duration '-5s' is negative; give a duration of zero or more"),
    ],
)
def test_max_run_duration_must_be_a_duration(track: Tracker, limit: str, why: str) -> None:
    path, client = job(track, limit, "true")
    done = subprocess.run(
        cli("validate", str(path), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode != 0, done.stdout
    assert why in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
