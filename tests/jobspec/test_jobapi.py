"""A job's HCL as Nomad's API JSON (what ``POST /v1/jobs/parse`` answers): every job file that
validates comes back from its JSON (read by jobjson) as the same job; the field names and
shapes are the ones Nomad's ``api`` package declares; a syntax error and a schema problem are
refused at their line; the API's text reads no file of the host."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from driversdk.agent.validate import dry_interpolated
from driversdk.jobspec.hcl import FilePolicy, Inputs
from driversdk.jobspec.hcllimits import MAX_JOB_FILE_BYTES
from driversdk.jobspec.hclload import HCLFileError, labelled
from driversdk.jobspec.job import Job, evaluate_job, parse_job, static_problems
from driversdk.jobspec.jobapi import api_job, parse_to_api
from driversdk.jobspec.problems import ValidationFailed

ROOT = Path(__file__).resolve().parents[2]
# Every job corpus of the repository: the examples and the fixtures (the other .hcl files are a
# client config and a volume spec, which do not validate as jobs and so are left out below).
CORPUS = sorted((ROOT / "examples" / "jobs").glob("*.hcl")) + sorted(Path(__file__).parent.glob("fixtures/*.hcl"))


def _inputs(path: Path) -> Inputs:
    lines = path.read_text().splitlines()
    vars_ = next((line.removeprefix("# vars: ").split() for line in lines[1:3] if line.startswith("# vars: ")), [])
    return Inputs(vars=vars_)


def _valid(path: Path) -> Job | None:
    """The job of a file that validates today (as test_fixtures checks it), else None."""
    try:
        job, problems = parse_job(path, _inputs(path))
    except HCLFileError:
        return None
    if problems or static_problems(dry_interpolated(job)):
        return None
    return job


VALID = [path for path in CORPUS if _valid(path) is not None]


def _api(path: Path) -> dict[str, Any]:
    data, problems, _ = evaluate_job(path, _inputs(path))
    assert problems == []
    ((name, body),) = labelled(data["job"])
    return api_job(body, name)


def _as_json_file(tmp_path: Path, api: dict[str, Any]) -> Path:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(api))
    return path


def test_the_corpus_is_the_whole_of_it() -> None:
    # 40 of the fixtures validate, and both example jobs: a corpus that shrinks is noticed.
    assert len(VALID) >= 42, [p.name for p in VALID]


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_round_trip_through_the_api_json_gives_the_same_job(path: Path, tmp_path: Path) -> None:
    original = _valid(path)
    assert original is not None
    back, problems = parse_job(_as_json_file(tmp_path, _api(path)), _inputs(path))
    assert [str(p) for p in problems] == []
    # Nomad moves a job's and group's vault onto their tasks, and an empty block (consul {}) is
    # Go's zero in JSON: the notes of the way back may be fewer, never others.
    assert set(back.notes) <= set(original.notes), (back.notes, original.notes)
    assert dataclasses.replace(back, file=original.file, notes=original.notes) == original


def _without_empty_objects(value: Any) -> Any:
    """jobjson reads ``{}`` as Go's zero value of an unset field (``nomad job inspect`` writes them)."""
    if isinstance(value, dict):
        return {k: _without_empty_objects(v) for k, v in value.items() if v != {}}
    if isinstance(value, list):
        return [_without_empty_objects(v) for v in value]
    return value


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_the_api_json_read_back_is_the_same_api_json(path: Path, tmp_path: Path) -> None:
    # Beyond the model: services, checks, connect, vault … all come back as they went.
    api = _api(path)
    data, problems, _ = evaluate_job(_as_json_file(tmp_path, api), _inputs(path))
    assert [str(p) for p in problems] == []
    ((name, body),) = labelled(data["job"])
    assert api_job(body, name) == _without_empty_objects(api)


REPRESENTATIVE = """
job "shop" {
  datacenters = ["dc1", "dc2"]
  meta = { "team.name" = "web" }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }
  constraint {
    distinct_hosts = true
  }

  group "web" {
    count = 2
    network {
      mode = "bridge"
      port "http" { to = 8080 }
      port "admin" { static = 9000 }
    }
    volume "data" {
      type      = "host"
      source    = "shared"
      read_only = true
    }
    restart {
      attempts = 3
      delay    = "25s"
      interval = "5m"
      mode     = "delay"
    }
    service {
      name = "shop"
      port = "http"
      check {
        type     = "http"
        path     = "/health"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "server" {
      driver       = "docker"
      kill_timeout = "1m30s"
      config {
        image = "busybox:1"
        args  = ["httpd", "-f"]
        mount {
          type   = "tmpfs"
          target = "/scratch"
        }
      }
      env {
        MODE = "prod"
      }
      resources {
        cpu        = 200
        memory     = 256
        memory_max = 512
      }
      volume_mount {
        volume           = "data"
        destination      = "/srv/data"
        read_only        = true
        propagation_mode = "host-to-task"
      }
      logs {
        max_files     = 3
        max_file_size = 5
      }
      lifecycle {
        hook    = "prestart"
        sidecar = true
      }
      template {
        data        = "port={{ env \\"NOMAD_PORT_http\\" }}"
        destination = "local/app.env"
        env         = true
      }
      artifact {
        source      = "https://example.com/app.tar.gz"
        destination = "local/app"
        options {
          checksum = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
        }
      }
    }
  }
}
"""

SECOND = 10**9

# What Nomad's api package declares for each of these (api/jobs.go Job; api/tasks.go TaskGroup,
# Task, RestartPolicy, VolumeRequest, VolumeMount, LogConfig, TaskLifecycle, Template,
# TaskArtifact; api/resources.go Resources, NetworkResource, Port; api/services.go Service,
# ServiceCheck; api/constraint.go Constraint), with jobspec2's fill-ins (ID and Name from the
# label, static ports reserved, a template's ChangeMode/Perms/Splay/ErrMissingKey, Operand "=").
EXPECTED = {
    "ID": "shop",
    "Name": "shop",
    "Datacenters": ["dc1", "dc2"],
    "Meta": {"team.name": "web"},
    "Constraints": [
        {"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="},
        {"LTarget": "", "RTarget": "", "Operand": "distinct_hosts"},
    ],
    "TaskGroups": [
        {
            "Name": "web",
            "Count": 2,
            "Networks": [
                {
                    "Mode": "bridge",
                    "DynamicPorts": [{"Label": "http", "To": 8080}],
                    "ReservedPorts": [{"Label": "admin", "Value": 9000}],
                }
            ],
            "Volumes": {"data": {"Name": "data", "Type": "host", "Source": "shared", "ReadOnly": True}},
            "RestartPolicy": {"Attempts": 3, "Delay": 25 * SECOND, "Interval": 300 * SECOND, "Mode": "delay"},
            "Services": [
                {
                    "Name": "shop",
                    "PortLabel": "http",
                    "Checks": [{"Type": "http", "Path": "/health", "Interval": 10 * SECOND, "Timeout": 2 * SECOND}],
                }
            ],
            "Tasks": [
                {
                    "Name": "server",
                    "Driver": "docker",
                    "KillTimeout": 90 * SECOND,
                    "Config": {
                        "image": "busybox:1",
                        "args": ["httpd", "-f"],
                        "mount": [{"type": "tmpfs", "target": "/scratch"}],
                    },
                    "Env": {"MODE": "prod"},
                    "Resources": {"CPU": 200, "MemoryMB": 256, "MemoryMaxMB": 512},
                    "VolumeMounts": [
                        {
                            "Volume": "data",
                            "Destination": "/srv/data",
                            "ReadOnly": True,
                            "PropagationMode": "host-to-task",
                        }
                    ],
                    "LogConfig": {"MaxFiles": 3, "MaxFileSizeMB": 5},
                    "Lifecycle": {"Hook": "prestart", "Sidecar": True},
                    "Templates": [
                        {
                            "EmbeddedTmpl": 'port={{ env "NOMAD_PORT_http" }}',
                            "DestPath": "local/app.env",
                            "Envvars": True,
                            "ChangeMode": "restart",
                            "Perms": "0644",
                            "Splay": 5 * SECOND,
                            "ErrMissingKey": False,
                        }
                    ],
                    "Artifacts": [
                        {
                            "GetterSource": "https://example.com/app.tar.gz",
                            "RelativeDest": "local/app",
                            "GetterOptions": {
                                "checksum": "sha256:0000000000000000000000000000000000000000000000000000000000000000"
                            },
                        }
                    ],
                }
            ],
        }
    ],
}


def test_a_representative_job_has_nomads_field_names_and_shapes() -> None:
    api = parse_to_api(REPRESENTATIVE)
    task = api["TaskGroups"][0]["Tasks"][0]
    # The places a client reads first, then the whole answer.
    assert task["Resources"]["MemoryMB"] == 256
    assert api["TaskGroups"][0]["RestartPolicy"]["Delay"] == 25_000_000_000
    assert api["TaskGroups"][0]["Networks"][0]["DynamicPorts"][0]["Label"] == "http"
    assert api["TaskGroups"][0]["Volumes"]["data"]["Source"] == "shared"
    assert task["VolumeMounts"][0]["Destination"] == "/srv/data"
    assert api == EXPECTED


def test_periodic_multiregion_scaling_and_identity_are_spelled_as_nomad_spells_them() -> None:
    periodic = parse_to_api((ROOT / "tests/jobspec/fixtures/02-batch-periodic.hcl").read_text())
    assert periodic["Type"] == "batch"
    assert periodic["Periodic"] == {
        "Specs": ["0 2 * * *"],
        "ProhibitOverlap": True,
        "TimeZone": "America/New_York",
    }
    multiregion = parse_to_api((ROOT / "tests/jobspec/fixtures/25-multiregion.hcl").read_text())["Multiregion"]
    assert [r["Name"] for r in multiregion["Regions"]] == ["west", "east"]
    scaling = parse_to_api((ROOT / "tests/jobspec/fixtures/19-scaling.hcl").read_text())["TaskGroups"][0]
    assert scaling["Scaling"]["Type"] == "horizontal"
    assert [p["Type"] for p in scaling["Tasks"][0]["ScalingPolicies"]] == ["vertical_cpu", "vertical_mem"]
    resources = parse_to_api((ROOT / "tests/jobspec/fixtures/20-resources-device-numa.hcl").read_text())
    device = resources["TaskGroups"][0]["Tasks"][0]["Resources"]["Devices"][0]
    assert device["Name"] == "nvidia/gpu"
    assert device["Constraints"] == [{"LTarget": "${device.attr.memory}", "RTarget": "2 GiB", "Operand": ">="}]
    assert device["Affinities"][0]["Weight"] == 50
    identity = parse_to_api((ROOT / "tests/jobspec/fixtures/14-consul-identity.hcl").read_text())
    assert identity["TaskGroups"][0]["Tasks"][0]["Identities"][1] == {
        "Name": "vault_default",
        "Audience": ["vault.io"],
        "TTL": 3600 * SECOND,
        "ChangeMode": "restart",
    }


def test_the_job_and_group_vault_are_on_each_task_without_one_as_jobspec2_puts_them() -> None:
    text = """
job "secrets" {
  vault { policies = ["job-default"] }
  group "a" {
    vault { role = "workloads" }
    task "plain" { driver = "exec" }
    task "own" {
      driver = "exec"
      vault {
        policies = ["mine"]
        env      = false
      }
    }
  }
  group "b" {
    task "plain" { driver = "exec" }
  }
}
"""
    api = parse_to_api(text)
    assert "Vault" not in api and all("Vault" not in g for g in api["TaskGroups"])
    vaults = [[t["Vault"] for t in g["Tasks"]] for g in api["TaskGroups"]]
    assert vaults == [
        [
            {"Role": "workloads", "Env": True, "ChangeMode": "restart"},
            {"Policies": ["mine"], "Env": False, "ChangeMode": "restart"},
        ],
        [{"Policies": ["job-default"], "Env": True, "ChangeMode": "restart"}],
    ]


def test_a_syntax_error_names_its_line() -> None:
    text = 'job "broken" {\n  group "g" {\n    count = = 2\n  }\n}\n'
    with pytest.raises(HCLFileError) as caught:
        parse_to_api(text)
    assert caught.value.line == 3
    assert str(caught.value).startswith("input.hcl:3:")


def test_a_schema_problem_names_its_line_and_the_fix() -> None:
    text = 'job "typo" {\n  group "g" {\n    task "t" {\n      driver = "exec"\n      kill_timout = "5s"\n'
    text += "    }\n  }\n}\n"
    with pytest.raises(ValidationFailed) as caught:
        parse_to_api(text)
    (problem,) = caught.value.problems
    assert problem.line == 5
    assert str(problem).startswith("input.hcl:5")
    assert "'kill_timout'" in str(problem) and 'did you mean "kill_timeout"' in str(problem)


def test_a_duration_the_schema_leaves_to_the_parser_is_refused_at_its_line() -> None:
    # kill_timeout is checked by the job parser, not the schema: the API answer needs it in ns.
    text = 'job "slow" {\n  group "g" {\n    task "t" {\n      driver = "exec"\n      kill_timeout = "5x"\n'
    text += "    }\n  }\n}\n"
    with pytest.raises(ValidationFailed) as caught:
        parse_to_api(text)
    (problem,) = caught.value.problems
    assert problem.line == 5
    assert str(problem).startswith(
        'input.hcl:5, job "slow", group "g", task "t": kill_timeout \'5x\' is not a duration'
    )


def test_a_job_sent_as_text_reads_no_file_of_the_host(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("hunter2")
    text = f'job "peek" {{\n  meta = {{ s = file("{secret}") }}\n'
    text += '  group "g" {\n    task "t" { driver = "exec" }\n  }\n}\n'
    assert Inputs().files == FilePolicy.none()
    with pytest.raises(ValidationFailed) as caught:
        parse_to_api(text)
    assert "hunter2" not in str(caught.value)
    assert "file functions are turned off" in str(caught.value)
    assert caught.value.problems[0].line == 2


def test_a_job_over_the_size_limit_is_refused_before_it_is_parsed() -> None:
    text = 'job "big" {}\n' + "#" * MAX_JOB_FILE_BYTES
    with pytest.raises(HCLFileError, match=f"over {MAX_JOB_FILE_BYTES} bytes"):
        parse_to_api(text)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('job "j" {\n  group "g" { network = 5 }\n}', "network must be a block"),
        ('job "j" {\n  group "g" {\n    network { port = 5 }\n  }\n}', "network.port must be a block"),
        ('job "j" {\n  group "g" { volume = { a = 1 } }\n}', "volume must be a block"),
        ('job "j" {\n  group "g" {\n    task "t" { env = ["a"] }\n  }\n}', "env must be a block"),
        ('job "j" {\n  group "g" {\n    task "t" { kill_timeout = true }\n  }\n}', "kill_timeout must be a duration"),
        ('job "j" {\n  group "g" {\n    restart { delay = "-5s" }\n  }\n}', "is negative"),
        ('job "j" {\n  constraint { distinct_hosts = "yes" }\n}', "must be true or false"),
    ],
)
def test_a_block_of_the_wrong_shape_is_a_problem_not_a_crash(text: str, said: str) -> None:
    # Shapes the walk into the API's names would trip over are refused by the schema first.
    with pytest.raises(ValidationFailed) as caught:
        parse_to_api(text)
    assert said in str(caught.value)
    assert all(p.line > 0 for p in caught.value.problems)
