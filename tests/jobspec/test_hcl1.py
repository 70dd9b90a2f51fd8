"""HCL1 job files (quoted keys, commas, heredocs, `key = { … }` blocks), read with `-hcl1` as
Nomad 1.0-1.5 read them: the same model and problems as their HCL2 twins, run end to end by the
real CLI; without the flag, the HCL2 error names `-hcl1` when the file reads as HCL1."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from driversdk.jobspec.hclload import HCLFileError
from driversdk.jobspec.job import Job, evaluate_job, parse_job, static_problems
from driversdk.jobspec.jobjson import JobInputs
from tests.agent.runs import ROOT, cli, raw_exec_client
from tests.raw_exec import conftest as raw_exec_fixtures
from tests.raw_exec.conftest import Tracker

track = raw_exec_fixtures.track
no_leaks = raw_exec_fixtures.no_leaks

# As the Nomad 0.x docs wrote a job: quoted meta and env keys, commas, a heredoc, repeated
# constraint and `port "x" {}` blocks, a driver config with a nested block.
DOCS_HCL1 = """\
job "docs" {
  region = "us"
  datacenters = ["us-west-1", "us-east-1"],
  type = "service",
  priority = 50

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  constraint {
    attribute = "${meta.rack}"
    operator  = "regexp"
    value     = "r[0-9]+"
  }

  update {
    stagger      = "30s",
    max_parallel = 2,
  }

  meta {
    "owner" = "platform"
    "release.version" = "2"
  }

  group "webs" {
    count = 5

    network {
      port "http" {}
      port "https" {
        static = 443
      }
    }

    task "frontend" {
      driver = "docker"

      config {
        image = "hashicorp/web-frontend"
        port_map {
          http = 80
        }
      }

      env {
        "DB_HOST" = "db01.example.com"
        "DB_USER" = "web"
      }

      template {
        data = <<EOT
addr = {{ env "NOMAD_ADDR_http" }}
EOT
        destination = "local/app.conf"
      }

      resources {
        cpu    = 500
        memory = 128
      }
    }
  }
}
"""

DOCS_HCL2 = """\
job "docs" {
  region = "us"
  datacenters = ["us-west-1", "us-east-1"]
  type = "service"
  priority = 50

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  constraint {
    attribute = "${meta.rack}"
    operator  = "regexp"
    value     = "r[0-9]+"
  }

  update {
    stagger      = "30s"
    max_parallel = 2
  }

  meta = {
    owner = "platform"
    "release.version" = "2"
  }

  group "webs" {
    count = 5

    network {
      port "http" {}
      port "https" {
        static = 443
      }
    }

    task "frontend" {
      driver = "docker"

      config {
        image = "hashicorp/web-frontend"
        port_map {
          http = 80
        }
      }

      env {
        DB_HOST = "db01.example.com"
        DB_USER = "web"
      }

      template {
        data = <<EOT
addr = {{ env "NOMAD_ADDR_http" }}
EOT
        destination = "local/app.conf"
      }

      resources {
        cpu    = 500
        memory = 128
      }
    }
  }
}
"""

# A task directly under the job (a group of its name, as jobspec v1 made it), blocks written as
# `key = { … }` with commas inside, a group volume and runtime interpolation in the config.
RAW_HCL1 = """\
job "legacy" {
  type = "batch"

  task "app" {
    driver = "raw_exec"
    kill_timeout = "1s"

    config = {
      command = "/bin/sh",
      args    = ["-c", "cat local/greeting.txt; echo \\"$WORD ${NOMAD_TASK_NAME}\\""]
    }

    env {
      "WORD" = "from-hcl1"
    }

    template {
      data = <<EOT
hello {{ env "NOMAD_TASK_NAME" }}
EOT
      destination = "local/greeting.txt"
    }

    resources = { cpu = 100, memory = 64 }
    logs = { max_files = 2, max_file_size = 5 }
  }
}
"""

RAW_HCL2 = """\
job "legacy" {
  type = "batch"

  task "app" {
    driver = "raw_exec"
    kill_timeout = "1s"

    config {
      command = "/bin/sh"
      args    = ["-c", "cat local/greeting.txt; echo \\"$WORD ${NOMAD_TASK_NAME}\\""]
    }

    env {
      WORD = "from-hcl1"
    }

    template {
      data = <<EOT
hello {{ env "NOMAD_TASK_NAME" }}
EOT
      destination = "local/greeting.txt"
    }

    resources {
      cpu = 100
      memory = 64
    }
    logs {
      max_files = 2
      max_file_size = 5
    }
  }
}
"""

HCL1 = JobInputs(hcl1=True)


def model(path: Path, inputs: JobInputs | None = None) -> tuple[Job, list[str]]:
    job, problems = parse_job(path, inputs)
    problems += static_problems(job)
    return dataclasses.replace(job, file=""), [p.message for p in problems]


@pytest.mark.parametrize(("old", "new"), [(DOCS_HCL1, DOCS_HCL2), (RAW_HCL1, RAW_HCL2)], ids=["docs", "raw_exec"])
def test_an_hcl1_job_reads_as_its_hcl2_twin(tmp_path: Path, old: str, new: str) -> None:
    (tmp_path / "old.hcl").write_text(old)
    (tmp_path / "new.hcl").write_text(new)
    from_hcl2, hcl2_problems = model(tmp_path / "new.hcl")
    from_hcl1, hcl1_problems = model(tmp_path / "old.hcl", HCL1)
    assert not hcl2_problems
    assert hcl1_problems == hcl2_problems
    assert from_hcl1 == from_hcl2
    # What the twins are about: each of these is read, not dropped.
    assert from_hcl1.groups and all(g.tasks for g in from_hcl1.groups)


def test_heredocs_and_quoted_keys_keep_what_hcl1_wrote(tmp_path: Path) -> None:
    path = tmp_path / "old.hcl"
    path.write_text(DOCS_HCL1)
    job, problems = model(path, HCL1)
    assert not problems
    assert job.meta == {"owner": "platform", "release.version": "2"}
    (task,) = job.groups[0].tasks
    assert task.env == {"DB_HOST": "db01.example.com", "DB_USER": "web"}
    # HCL1 ends a heredoc with its last newline, as HCL2 does (pyhcl alone drops it).
    assert task.templates[0].data == 'addr = {{ env "NOMAD_ADDR_http" }}\n'
    data, _, _ = evaluate_job(path, HCL1)
    constraints = data["job"][0]["docs"]["constraint"]
    assert [c["attribute"] for c in constraints] == ["${attr.kernel.name}", "${meta.rack}"]  # left for run time


def test_an_unknown_field_is_the_problem_hcl2_gets_with_no_line(tmp_path: Path) -> None:
    old = tmp_path / "old.hcl"
    old.write_text(RAW_HCL1.replace('kill_timeout = "1s"', 'kill_timout = "1s",'))
    new = tmp_path / "new.hcl"
    new.write_text(RAW_HCL2.replace('kill_timeout = "1s"', 'kill_timout = "1s"'))
    _, from_hcl2 = model(new)
    _, from_hcl1 = model(old, HCL1)
    assert from_hcl1 and from_hcl1 == from_hcl2
    assert "unsupported argument or block 'kill_timout'" in from_hcl1[0] and "kill_timeout" in from_hcl1[0]
    done = subprocess.run(
        cli("validate", "-hcl1", "--json", str(old)), capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr
    (problem,) = [p for p in json.loads(done.stdout)["problems"] if "kill_timout" in p["message"]]
    assert problem["line"] is None  # pyhcl keeps no positions: no line is made up


def test_without_the_flag_the_error_says_hcl1_and_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "old.hcl"
    # Only quoted keys (no commas): HCL2 refuses the quoted argument name.
    path.write_text('job "j" {\n  meta {\n    "version" = "2"\n  }\n}\n')
    done = subprocess.run(cli("validate", str(path)), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: {path}:3:5: Invalid argument name: argument names must not be quoted")
    assert 'in `"version" = "2"`; the file looks like HCL1, as older Nomad versions ran it' in done.stderr
    assert f"`driversdk run -hcl1 {path}` (or `driversdk validate -hcl1 {path}`)" in done.stderr
    with pytest.raises(HCLFileError) as caught:
        parse_job(tmp_path / "old.hcl")
    assert caught.value.line == 3
    ran = subprocess.run(cli("validate", "-hcl1", str(path)), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "HCL1" not in ran.stdout + ran.stderr and "Invalid argument name" not in ran.stdout + ran.stderr


def test_a_file_that_is_neither_gets_the_hcl2_error_and_with_the_flag_hcl1s(tmp_path: Path) -> None:
    path = tmp_path / "broken.hcl"
    path.write_text('job "j" {\n  group "g" {\n    count = 1\n')
    done = subprocess.run(cli("validate", str(path)), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1
    assert done.stderr == (
        f"error: {path}:2:13: Unclosed configuration block: there is no closing }} for the {{ opened here, "
        'in `group "g" {`\n'
    )
    flagged = subprocess.run(cli("validate", "-hcl1", str(path)), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert flagged.returncode == 1
    assert flagged.stderr.startswith(f"error: {path}:2:") and "(read as HCL1, with -hcl1)" in flagged.stderr
    assert flagged.stderr.count("\n") == 1 and "Traceback" not in flagged.stderr


def test_json_and_hcl1_together_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.hcl"
    path.write_text(RAW_HCL1)
    done = subprocess.run(
        cli("validate", "-json", "-hcl1", str(path)), capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


@pytest.mark.usefixtures("no_leaks")
def test_run_an_hcl1_job_end_to_end(track: Tracker) -> None:
    path = track.base / "legacy.hcl"
    path.write_text(RAW_HCL1)
    client = raw_exec_client(track)
    done = subprocess.run(
        cli("run", "-hcl1", str(path), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (alloc,) = (track.base / "data" / "allocs").iterdir()
    # The heredoc's last newline, env from a quoted key and ${NOMAD_TASK_NAME} interpolated at run time.
    assert (alloc / "alloc" / "logs" / "app.stdout.0").read_text() == "hello app\nfrom-hcl1 app\n"


def test_hcl1_nested_too_deep_is_one_sentence(tmp_path: Path) -> None:
    """What walks the body recurses: a file of 3000 nested maps is refused before, not a RecursionError."""
    path = tmp_path / "deep.hcl"
    path.write_text('job "x" {\n  meta ' + "{ a = " * 3000 + "1" + " }" * 3000 + "\n}\n")
    with pytest.raises(HCLFileError) as caught:
        parse_job(path, HCL1)
    assert str(caught.value) == f"{path}: the HCL1 nests 3003 blocks and maps deep, more than the 64 read; flatten it"


def test_indented_heredocs_unindent_as_hcl1_does(tmp_path: Path) -> None:
    """`<<-` drops the closing marker's indentation (spaces or tabs) from every line that has it
    all; a line without it leaves the text as written. Each ends with its last newline."""
    path = tmp_path / "old.hcl"
    heredocs = (
        "    a = <<-EOT\n      one\n        two\n      EOT\n"
        "    b = <<-EOT\n\tx\n\tEOT\n"
        "    c = <<EOT\nplain\nEOT\n"
        "    d = <<-EOT\n    lo\n      EOT\n"
    )
    path.write_text(f'job "x" {{\n  meta {{\n{heredocs}  }}\n}}\n')
    job, _ = model(path, HCL1)
    assert job.meta == {"a": "one\n  two\n", "b": "x\n", "c": "plain\n", "d": "    lo\n"}
