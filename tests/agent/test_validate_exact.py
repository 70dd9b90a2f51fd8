"""`driversdk validate`'s output is exact: JSON ``line`` is a number (or null), driver config typos
get a "did you mean", and a missing extra is named as the extra, never blamed on the user's file.
The real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.agent.runs import ROOT

CLIENT = """data_dir = "{tmp}/data"
client {{
  host_volume "certs" {{
    path = "{tmp}/certs"
    read_only = true
  }}
  host_volume "shared" {{
    path = "{tmp}/missing"
  }}
}}
"""

JOB = """job "web" {
  group "g" {
    volume "certs" {
      type   = "host"
      source = "certs"
    }
    volume "shared" {
      type   = "host"
      source = "shared"
    }
    task "app" {
      driver = "docker"
      config {
        imgae = "busybox:1"
      }
      volume_mount {
        volume           = "certs"
        destination      = "/certs"
        propagation_mode = "bidirectional"
      }
      volume_mount {
        volume      = "shared"
        destination = "/shared"
      }
    }
  }
}
"""


def validate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "validate", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env=env,
    )  # fmt: skip


def files(tmp: Path, job: str = JOB, client: str = CLIENT) -> tuple[str, str]:
    (tmp / "certs").mkdir(exist_ok=True)
    (tmp / "job.hcl").write_text(job)
    (tmp / "client.hcl").write_text(client.format(tmp=tmp))
    return str(tmp / "job.hcl"), str(tmp / "client.hcl")


PROBLEM_KEYS = {"file": str, "job": str, "group": str, "task": str, "field": str, "message": str, "text": str}


def check_schema(report: dict[str, Any]) -> None:
    """The shape every problem of `validate --json` has: text fields are strings and ``line`` is an
    int (>= 1) or null, never a string."""
    assert set(report) == {"job", "valid", "problems", "checked", "notes"}
    for problem in report["problems"]:
        assert set(problem) == {*PROBLEM_KEYS, "line"}, problem
        for key, kind in PROBLEM_KEYS.items():
            assert isinstance(problem[key], kind), (key, problem)
        line = problem["line"]
        assert line is None or (type(line) is int and line >= 1), problem


def job_line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_json_lines_are_numbers_for_mount_and_driver_config_problems(tmp_path: Path) -> None:
    job, client = files(tmp_path)
    done = validate(job, "--client", client, "--json")
    report = json.loads(done.stdout)
    check_schema(report)
    lines = {(p["field"], p["message"].split(";")[0]): p["line"] for p in report["problems"]}
    # The driver config: each field its own problem, on its own line.
    assert lines[("config", "config: imgae is not a known field")] == job_line(JOB, "imgae")
    assert lines[("config", "config: image is required (string)")] == job_line(JOB, "config {")
    # The mounts: on their volume_mount blocks.
    mount_lines = [n for n, text in enumerate(JOB.splitlines(), 1) if "volume_mount {" in text]
    certs = next(v for (f, _), v in lines.items() if f == 'volume "certs"')
    shared = next(v for (f, _), v in lines.items() if f == 'volume "shared"')
    assert [certs, shared] == mount_lines


@pytest.mark.parametrize(
    "job, client",
    [
        # A group volume the client lacks, a static-rule mount error, a schema typo.
        (JOB.replace('source = "shared"', 'source = "nowhere"').replace("/shared", "shared"), CLIENT),
        (JOB.replace('driver = "docker"', 'driver = "docker"\n      kill_timeout = "5 minutes"'), CLIENT),
        (JOB.replace('    task "app" {', '    count = "two"\n    task "app" {'), CLIENT),
        # Problems of the client file: placed on their lines although pyhcl gives none.
        (JOB, CLIENT.replace('path = "{tmp}/missing"', 'path = "relative/dir"')),
        (JOB, CLIENT + 'unknown_agent_option = 1\nplugin "nope" {{\n  command = 5\n}}\n'),
    ],
    ids=["missing-volume", "bad-duration", "bad-count", "client-relative-path", "client-unknown-keys"],
)
def test_json_schema_over_bad_jobs(tmp_path: Path, job: str, client: str) -> None:
    job_file, client_file = files(tmp_path, job, client)
    done = validate(job_file, "--client", client_file, "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    check_schema(report)
    assert report["problems"]
    for problem in report["problems"]:
        if problem["file"] in (job_file, client_file):
            # Every problem of a file this test wrote is about something with a place in it.
            assert problem["line"] is not None, problem
            text = Path(problem["file"]).read_text()
            assert problem["line"] <= len(text.splitlines()), problem


def test_client_problems_point_at_their_block(tmp_path: Path) -> None:
    client = CLIENT.replace('path = "{tmp}/missing"', 'path = "relative/dir"')
    job_file, client_file = files(tmp_path, client=client)
    report = json.loads(validate(job_file, "--client", client_file, "--json").stdout)
    (problem,) = [p for p in report["problems"] if p["file"] == client_file]
    text = Path(client_file).read_text()
    assert problem["line"] == job_line(text, 'host_volume "shared"'), problem


def test_driver_config_typo_gets_did_you_mean(tmp_path: Path) -> None:
    job, client = files(tmp_path)
    out = validate(job, "--client", client).stdout
    assert 'config: imgae is not a known field; did you mean "image"?' in out
    # The same suggestion as the job schema gives for a typo of its own.
    typo = JOB.replace('driver = "docker"', 'drivr = "docker"')
    job2, _ = files(tmp_path, typo)
    assert 'did you mean "driver"?' in validate(job2, "--client", client).stdout


def fake_missing(tmp: Path, module: str, raise_line: str) -> dict[str, str]:
    """An environment where ``import <module>`` fails: a directory first on PYTHONPATH holding a
    module of that name that raises (tests only), and a parser cache of its own (a kept parse
    would import no parser at all)."""
    fake = tmp / "fake"
    fake.mkdir(exist_ok=True)
    (fake / f"{module}.py").write_text(raise_line + "\n")
    return {**os.environ, "PYTHONPATH": str(fake), "DRIVERSDK_CACHE_DIR": str(tmp / "cache")}


HCL_MISSING = "raise ModuleNotFoundError(\"No module named 'hcl'\", name='hcl')"
HCL2_MISSING = "raise ModuleNotFoundError(\"No module named 'hcl2'\", name='hcl2')"
LARK_MISSING = "raise ModuleNotFoundError(\"No module named 'lark'\", name='lark')"


@pytest.mark.parametrize(
    "module, raise_line, with_client",
    [
        # pyhcl reads client configs only: the case.
        ("hcl", HCL_MISSING, True),
        ("hcl", "raise ImportError('this pyhcl is broken')", True),
        ("hcl2", HCL2_MISSING, True),
        ("hcl2", HCL2_MISSING, False),
        ("lark", LARK_MISSING, True),
        ("lark", LARK_MISSING, False),
    ],
    ids=["hcl", "hcl-broken", "hcl2", "hcl2-no-client", "lark", "lark-no-client"],
)
def test_a_missing_extra_is_named_never_blamed_on_the_file(
    tmp_path: Path, module: str, raise_line: str, with_client: bool
) -> None:
    job, client = files(tmp_path)
    args = [job, "--client", client] if with_client else [job]
    done = validate(*args, env=fake_missing(tmp_path, module, raise_line))
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "pip install 'driversdk[runner]'" in out, out
    assert "needs the 'runner' extra" in out
    assert "not valid HCL" not in out and "fix the syntax" not in out and "Traceback" not in out
    assert "client.hcl" not in out and "job.hcl" not in out  # not a fault of either file
