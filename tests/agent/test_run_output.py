"""What `driversdk run` and `driversdk status` tell an operator, through the real CLI, raw_exec
plugin processes and (for a recoverable start failure) the Docker engine: every line about a task
names its job, allocation and task; ports are listed per allocation; `run --json` prints one JSON
event per line with Nomad's event types, failures included; Ctrl-C is reported as interrupted; a
task stopped on purpose is recorded dead (complete) with Nomad's Killing/Killed events, and
`status` shows a task's last event and why it failed."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

from driversdk.agent.events import EventType, RunEvent, RunEventType
from tests.agent.runs import ROOT, cli, raw_exec_client
from tests.raw_exec.conftest import Tracker, no_leaks, track  # noqa: F401 (fixtures)

WHERE = re.compile(r' \[job "([^"]+)", alloc ([0-9a-f]{8})\]$')

# Every `run --json` line: these fields, of these types.
SCHEMA: dict[str, tuple[type, ...]] = {
    "type": (str,),
    "kind": (str,),
    "job": (str,),
    "group": (str,),
    "alloc": (str,),
    "task": (str,),
    "time": (float, int),
    "exit_code": (int, type(None)),
    "signal": (int, type(None)),
    "message": (str,),
}


def files(
    track: Tracker,  # noqa: F811 (the fixture's value)
    body: str,
    *,
    job_type: str = "service",
    count: int = 1,
    extra: str = "",
) -> tuple[Path, Path]:
    job = track.base / "job.hcl"
    job.write_text(
        f"""job "shop" {{
  type = "{job_type}"
  group "web" {{
    count = {count}
    {extra}
    task "web" {{
      driver = "raw_exec"
      kill_timeout = "1s"
      config {{
        {body}
      }}
    }}
  }}
}}
"""
    )
    return job, raw_exec_client(track)


def sh(script: str) -> str:
    return f'command = "/bin/sh"\n        args = ["-c", "{script}"]'


def run(job: Path, client: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli("run", *flags, str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=180
    )


def status(client: Path, *flags: str) -> str:
    done = subprocess.run(
        cli("status", *flags, "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def json_lines(stdout: str) -> list[dict[str, Any]]:
    """Every line of stdout parsed, each checked against SCHEMA."""
    events = []
    for line in stdout.splitlines():
        event = json.loads(line)  # a plain-text line fails here
        assert isinstance(event, dict), line
        for key, types in SCHEMA.items():
            assert key in event and isinstance(event[key], types), (key, line)
        assert "name" not in event, line
        events.append(event)
    return events


def wait_for(proc: subprocess.Popen[str], needle: str) -> list[str]:
    assert proc.stdout is not None
    seen: list[str] = []
    while not seen or needle not in seen[-1]:
        line = proc.stdout.readline()
        assert line, f"the run ended before {needle!r}:\n" + "".join(seen) + proc.communicate()[1]
        seen.append(line)
    return seen


PORTS = 'network {\n      port "http" {}\n    }'


@pytest.mark.root
def test_count_3_lines_name_job_alloc_and_task_and_ports_per_alloc(track: Tracker, no_leaks: None) -> None:  # noqa: F811
    job, client = files(track, sh("echo hi"), job_type="batch", count=3, extra=PORTS)
    done = run(job, client)
    assert done.returncode == 0, done.stdout + done.stderr
    task_lines = [line for line in done.stdout.splitlines() if line.startswith('==> task "web"')]
    assert len(task_lines) == 9, done.stdout  # started, Terminated, finished for each of three
    allocs: dict[str, list[str]] = {}
    for line in task_lines:
        where = WHERE.search(line)
        assert where is not None and where.group(1) == "shop", line
        allocs.setdefault(where.group(2), []).append(line)
    assert len(allocs) == 3 and all(len(lines) == 3 for lines in allocs.values()), allocs
    ports = [line for line in done.stdout.splitlines() if line.startswith('==> group "web": ports: http ')]
    assert sorted(WHERE.search(line).group(2) for line in ports) == sorted(allocs), ports  # type: ignore[union-attr]
    assert len({line.split()[5] for line in ports}) == 3, "a port of its own for each allocation"


@pytest.mark.root
def test_run_json_is_one_event_per_line_with_nomad_types(track: Tracker, no_leaks: None) -> None:  # noqa: F811
    job, client = files(track, sh("exit 0"), job_type="batch", count=2, extra=PORTS)
    done = run(job, client, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    events = json_lines(done.stdout)
    tasks = [e for e in events if e["kind"] == "task"]
    assert {e["type"] for e in tasks} == {"Started", "Terminated", "finished"}, tasks
    for e in tasks:
        assert (e["job"], e["group"], e["task"]) == ("shop", "web", "web") and len(e["alloc"]) == 36, e
    terminated = [e for e in tasks if e["type"] == "Terminated"]
    assert len(terminated) == 2 and all(e["exit_code"] == 0 and e["message"] == "Exit Code: 0" for e in terminated)
    assert len({e["alloc"] for e in terminated}) == 2
    ports = [e for e in events if e["type"] == "ports"]
    assert sorted(e["alloc"] for e in ports) == sorted(e["alloc"] for e in terminated), ports


@pytest.mark.root
def test_a_start_failure_names_the_task_in_text_and_is_json_in_json(track: Tracker, no_leaks: None) -> None:  # noqa: F811
    job, client = files(track, 'command = "/no/such/command"', job_type="batch")
    text = run(job, client)
    assert text.returncode == 1
    (line,) = [s for s in text.stderr.splitlines() if s.startswith("error: ")]
    assert re.search(r"/no/such/command.* \[job \"shop\", alloc [0-9a-f]{8}, task \"web\"\]$", line), line
    assert "Traceback" not in text.stderr
    done = run(job, client, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error" not in done.stderr
    events = json_lines(done.stdout)
    last = events[-1]
    assert last["type"] == "error" and last["task"] == "web" and last["job"] == "shop" and len(last["alloc"]) == 36
    assert "/no/such/command" in last["message"]
    # status keeps the reason: the driver's failure, not a bare "failed"; the default restart
    # policy does not retry an error the driver calls unrecoverable (Nomad's words).
    out = status(client)
    said = "shop/web/web  raw_exec failed  Not Restarting: Error was unrecoverable; failed by Driver Failure: "
    assert out.count(said) == 2, out
    assert "/no/such/command" in out


@pytest.mark.root
def test_a_service_stopped_with_ctrl_c_is_killed_not_failed(track: Tracker, no_leaks: None) -> None:  # noqa: F811
    job, client = files(track, sh("echo up; exec sleep 300"))
    proc = subprocess.Popen(
        cli("run", str(job), "--client", str(client)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT,
    )  # fmt: skip
    try:
        wait_for(proc, '==> task "web" started')
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "==> interrupted: stopping tasks" in out, out + err
    assert re.search(r'==> task "web" stopping: Sent interrupt. Waiting 1s before force killing \[job "shop"', out)
    assert '==> task "web" Killed: Task successfully killed [job "shop"' in out, out
    assert "error" not in err and "Traceback" not in err
    line = status(client)
    assert "shop/web/web  raw_exec complete  Killed: Task successfully killed" in line, line
    assert "failed" not in line and "exit=137" not in line
    (row,) = json.loads(status(client, "--json"))
    assert row["state"] == "complete"
    types = [e["type"] for e in row["events"]]
    assert types[-4:] == ["Killing", "Terminated", "Killed", "finished"], types
    assert row["events"][-1]["message"].endswith("(stopped, not failed)")


@pytest.mark.root
def test_a_failed_tasks_status_gives_its_last_event_and_why(track: Tracker, no_leaks: None) -> None:  # noqa: F811
    restart = 'restart {\n      attempts = 1\n      delay = "1s"\n      interval = "5s"\n      mode = "fail"\n    }'
    job, client = files(track, sh("exit 3"), job_type="batch", extra=restart)
    done = run(job, client)
    assert done.returncode == 1, done.stdout + done.stderr
    line = status(client)
    assert "shop/web/web  raw_exec failed exit=3 restarts=1  Not Restarting: Exceeded allowed attempts 1" in line, line
    assert line.rstrip().endswith("; failed by Terminated: Exit Code: 3"), line


def test_ctrl_c_during_a_restart_delay_is_interrupted_not_the_start_error(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as sock:  # a registry port nothing listens on: a recoverable pull failure
        sock.bind(("127.0.0.1", 0))
        image = f"127.0.0.1:{sock.getsockname()[1]}/dsx-later:1"
    job = tmp_path / "job.hcl"
    job.write_text(
        f"""job "shop" {{
  type = "batch"
  group "web" {{
    restart {{
      attempts = 2
      delay    = "5m"
      interval = "1h"
      mode     = "fail"
    }}
    task "later" {{
      driver = "docker"
      config {{
        image = "{image}"
      }}
    }}
  }}
}}
"""
    )
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    proc = subprocess.Popen(
        cli("run", "--json", str(job), "--client", str(client)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        before = wait_for(proc, '"type": "Restarting"')
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # not the five minutes of the delay
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err  # today's code for an interrupted run
    events = json_lines("".join(before) + out)
    types = [e["type"] for e in events]
    assert types[-3:] == ["Restarting", "Killed", "interrupted"], types
    assert "Failed to pull" not in out.split('"Restarting"')[-1] and "error" not in err, out + err
    line = status(client)
    assert "shop/web/later  docker   complete  Killed: Task successfully killed" in line, line


def test_the_event_in_nomads_api_shape() -> None:
    event = RunEvent(
        "task", "Exit Code: 137, Signal: 9", job="shop", group="web", alloc_id="1a2b3c4d-0000", task="web",
        time=1700000000.5, type=EventType.TERMINATED, exit_code=137, signal=9,
    )  # fmt: skip
    api = event.to_api()
    assert api["Type"] == "Terminated" and api["Time"] == 1700000000500000000
    assert (api["ExitCode"], api["Signal"], api["DisplayMessage"]) == (137, 9, "Exit Code: 137, Signal: 9")
    assert api["Details"] == {"exit_code": "137", "signal": "9"}
    killing = RunEvent("task", "Sent interrupt. Waiting 5s before force killing", type=EventType.KILLING,
                       kill_timeout=5.0, task="web")  # fmt: skip
    assert killing.to_api()["KillTimeout"] == 5_000_000_000
    line = event.to_json()
    assert {k: line[k] for k in ("type", "job", "alloc", "task", "exit_code", "signal")} == {
        "type": "Terminated", "job": "shop", "alloc": "1a2b3c4d-0000", "task": "web", "exit_code": 137, "signal": 9,
    }  # fmt: skip
    assert event.text() == '==> task "web" Terminated: Exit Code: 137, Signal: 9 [job "shop", alloc 1a2b3c4d]'
    assert RunEvent("run", "interrupted: stopping tasks", type=RunEventType.INTERRUPTED).to_json()["type"] == (
        "interrupted"
    )
