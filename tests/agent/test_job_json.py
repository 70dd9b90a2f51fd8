"""Job files in Nomad's API format (JSON, `nomad job run -json`): the same model, checks and
problems as their HCL twins, run end to end by the real CLI; and refusals found while an
allocation is set up exit 2 (refused), not 1 (a task failed)."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
from pathlib import Path

import pytest

from driversdk.jobspec.job import Job, parse_job, static_problems
from tests.agent.runs import ROOT, cli, raw_exec_client
from tests.raw_exec import conftest as raw_exec_fixtures
from tests.raw_exec.conftest import Tracker

track = raw_exec_fixtures.track
no_leaks = raw_exec_fixtures.no_leaks

FIXTURES = ROOT / "tests" / "jobspec" / "fixtures"

# 32-exec-basic.hcl as Nomad's API spells it.
EXEC_TWIN = {
    "Job": {
        "ID": "exec-example",
        "Name": "exec-example",
        "TaskGroups": [
            {
                "Name": "g",
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "exec",
                        "Config": {
                            "command": "/bin/sleep",
                            "args": ["1"],
                            "pid_mode": "private",
                            "ipc_mode": "private",
                            "cap_drop": ["all"],
                        },
                    }
                ],
            }
        ],
    }
}

# 01-docs-job-basic.hcl (docker) as Nomad's API spells it, the bare job object this time.
DOCKER_TWIN = {
    "ID": "docs",
    "Name": "docs",
    "Region": "us",
    "Datacenters": ["us-west-1", "us-east-1"],
    "Type": "service",
    "Priority": 50,
    "AllAtOnce": False,
    "Constraints": [{"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": None}],
    "Update": {"Stagger": 30_000_000_000, "MaxParallel": 2},
    "Meta": {"owner": "platform"},
    "TaskGroups": [
        {
            "Name": "webs",
            "Count": 5,
            "Networks": [{"DynamicPorts": [{"Label": "http"}], "ReservedPorts": [{"Label": "https", "Value": 443}]}],
            "Tasks": [
                {
                    "Name": "frontend",
                    "Driver": "docker",
                    "Config": {"image": "hashicorp/web-frontend"},
                    "Env": {"DB_HOST": "db01.example.com", "DB_USER": "web", "DB_PASS": "loremipsum"},
                    "Resources": {"CPU": 500, "MemoryMB": 128, "Networks": None, "Devices": None},
                    # Unset, as `nomad job inspect` writes it.
                    "Artifacts": [],
                    "Templates": None,
                    "Lifecycle": None,
                    "KillSignal": "",
                    "Meta": {},
                }
            ],
        }
    ],
    # What `nomad job inspect` adds: the server's, no job file's.
    "Status": "running",
    "Affinities": None,
    "Multiregion": None,
    "Periodic": None,
    "ModifyIndex": 42,
}

# 24-host-volume-runtime-destination.hcl: Volumes is a map by name, VolumeMounts a list.
VOLUME_TWIN = {
    "Job": {
        "ID": "shop",
        "TaskGroups": [
            {
                "Name": "web",
                "Volumes": {"certs": {"Name": "certs", "Type": "host", "Source": "ca-certificates", "ReadOnly": True}},
                "Tasks": [
                    {
                        "Name": "web",
                        "Driver": "docker",
                        "VolumeMounts": [
                            {
                                "Volume": "certs",
                                "Destination": "${NOMAD_ALLOC_DIR}/certs",
                                "PropagationMode": "host-to-task",
                            }
                        ],
                        "Config": {"image": "busybox:1"},
                    }
                ],
            }
        ],
    }
}

# Blocks whose API names differ from the job file's, and durations in nanoseconds.
RENAMED_HCL = """job "renamed" {
  type = "batch"
  group "g" {
    ephemeral_disk {
      size = 200
    }
    restart {
      attempts = 2
      delay    = "15s"
      interval = "10m"
      mode     = "fail"
    }
    task "init" {
      driver       = "raw_exec"
      kill_timeout = "250ms"
      kill_signal  = "SIGINT"
      lifecycle {
        hook = "prestart"
      }
      logs {
        max_files     = 3
        max_file_size = 4
      }
      template {
        data            = "[[ env `HOME` ]]"
        destination     = "local/out.txt"
        left_delimiter  = "[["
        right_delimiter = "]]"
        perms           = "0600"
      }
      resources {
        cpu        = 200
        memory     = 64
        memory_max = 128
      }
      config {
        command = "/bin/true"
      }
    }
  }
}
"""
RENAMED_TWIN = {
    "ID": "renamed",
    "Type": "batch",
    "TaskGroups": [
        {
            "Name": "g",
            "EphemeralDisk": {"SizeMB": 200},
            "RestartPolicy": {"Attempts": 2, "Delay": 15_000_000_000, "Interval": 600_000_000_000, "Mode": "fail"},
            "Tasks": [
                {
                    "Name": "init",
                    "Driver": "raw_exec",
                    "KillTimeout": 250_000_000,
                    "KillSignal": "SIGINT",
                    "Lifecycle": {"Hook": "prestart"},
                    "LogConfig": {"MaxFiles": 3, "MaxFileSizeMB": 4},
                    "Templates": [
                        {
                            "EmbeddedTmpl": "[[ env `HOME` ]]",
                            "DestPath": "local/out.txt",
                            "LeftDelim": "[[",
                            "RightDelim": "]]",
                            "Perms": "0600",
                        }
                    ],
                    "Resources": {"CPU": 200, "MemoryMB": 64, "MemoryMaxMB": 128},
                    "Config": {"command": "/bin/true"},
                }
            ],
        }
    ],
}


def model(path: Path) -> tuple[Job, list[str]]:
    job, problems = parse_job(path)
    problems += static_problems(job)
    return dataclasses.replace(job, file=""), [p.message for p in problems]


@pytest.mark.parametrize(
    ("fixture", "twin"),
    [
        ("32-exec-basic.hcl", EXEC_TWIN),
        ("01-docs-job-basic.hcl", DOCKER_TWIN),
        ("24-host-volume-runtime-destination.hcl", VOLUME_TWIN),
        (RENAMED_HCL, RENAMED_TWIN),
    ],
)
def test_an_api_json_twin_reads_as_the_same_job(tmp_path: Path, fixture: str, twin: dict[str, object]) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(twin, indent=2))
    hcl = FIXTURES / fixture
    if "\n" in fixture:  # written here
        hcl = tmp_path / "job.hcl"
        hcl.write_text(fixture)
    from_hcl, hcl_problems = model(hcl)
    from_json, json_problems = model(path)
    assert json_problems == hcl_problems  # none, but 24's destination that only interpolation makes absolute
    assert from_json == from_hcl


def test_durations_are_nanoseconds_and_a_config_is_passed_as_is(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    task = {"Name": "t", "Driver": "raw_exec", "KillTimeout": 1_500_000_000,
            "Config": {"command": "/bin/true", "args": ["a"], "mount": [{"type": "bind"}]}}  # fmt: skip
    path.write_text(json.dumps({"ID": "j", "TaskGroups": [{"Name": "g", "Tasks": [task]}]}))
    job, problems = model(path)
    assert not problems
    (t,) = job.groups[0].tasks
    assert t.kill_timeout == "1500ms"
    assert t.config == {"command": "/bin/true", "args": ["a"], "mount": [{"type": "bind"}]}


def test_an_unknown_field_is_the_problem_hcl_gets(tmp_path: Path) -> None:
    hcl = tmp_path / "job.hcl"
    hcl.write_text('job "j" {\n  group "g" {\n    task "t" {\n      driver = "raw_exec"\n      kill_timout = "1s"\n'
                   '      config {\n        command = "/bin/true"\n      }\n    }\n  }\n}\n')  # fmt: skip
    api = tmp_path / "job.json"
    task = {"Name": "t", "Driver": "raw_exec", "KillTimout": 1_000_000_000, "Config": {"command": "/bin/true"}}
    api.write_text(json.dumps({"Job": {"ID": "j", "TaskGroups": [{"Name": "g", "Tasks": [task]}]}}))
    _, from_hcl = model(hcl)
    _, from_json = model(api)
    assert from_hcl and from_json == from_hcl
    assert "unsupported argument or block 'kill_timout'" in from_json[0] and "kill_timeout" in from_json[0]


def test_a_json_syntax_error_is_one_sentence_with_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text('{"Job": {\n  "ID": "j",\n  "TaskGroups": [}\n}\n')
    done = subprocess.run(cli("validate", str(path)), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    sentence = "this job file is not valid JSON (expecting value); fix it, or write the job in HCL"
    assert done.stderr == f"error: {path}:3:18: {sentence}\n"


def test_a_json_file_that_is_no_object_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text("[1]")
    done = subprocess.run(cli("validate", "-json", str(path)), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1
    assert (
        done.stderr
        == f'error: {path}: a JSON job file is one object, {{"Job": {{…}}}} or the job itself, not an array\n'
    )


def test_dash_json_forces_json(tmp_path: Path) -> None:
    path = tmp_path / "job.hcl"
    path.write_text((FIXTURES / "32-exec-basic.hcl").read_text())
    as_hcl = subprocess.run(cli("validate", "--json", str(path)), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert json.loads(as_hcl.stdout)["job"] == "exec-example", as_hcl.stderr
    forced = subprocess.run(cli("validate", "-json", str(path)), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert forced.returncode == 1
    assert forced.stderr.startswith(f"error: {path}:1:1: this job file is not valid JSON"), forced.stderr
    assert forced.stderr.count("\n") == 1 and "Traceback" not in forced.stderr


@pytest.mark.usefixtures("no_leaks")
def test_run_a_json_job_end_to_end(track: Tracker) -> None:
    path = track.base / "job.json"
    task = {"Name": "app", "Driver": "raw_exec", "Env": {"WORD": "from-json"}, "KillTimeout": 1_000_000_000,
            "Config": {"command": "/bin/sh", "args": ["-c", "echo $WORD"]}}  # fmt: skip
    path.write_text(json.dumps({"Job": {"ID": "api", "Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [task]}]}}))
    client = raw_exec_client(track)
    done = subprocess.run(
        cli("run", str(path), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (alloc,) = (track.base / "data" / "allocs").iterdir()
    assert (alloc / "alloc" / "logs" / "app.stdout.0").read_text() == "from-json\n"


@pytest.mark.usefixtures("no_leaks")
def test_a_port_taken_when_the_allocation_starts_is_a_refusal_exit_2(track: Tracker) -> None:
    """Validation does not hold ports: a static port a host socket holds is found by the
    allocation's network hook, and that refuses the job (2), with its sentence, leaving nothing."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    path = track.base / "job.hcl"
    path.write_text(
        f'job "held" {{\n  type = "batch"\n  group "g" {{\n    network {{\n      port "p" {{\n'
        f"        static = {port}\n      }}\n    }}\n"
        '    task "app" {\n      driver = "raw_exec"\n      config {\n        command = "/bin/true"\n      }\n'
        "    }\n  }\n}\n"
    )
    client = raw_exec_client(track)
    try:
        done = subprocess.run(
            cli("run", str(path), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=120
        )
    finally:
        holder.close()
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{port}" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
