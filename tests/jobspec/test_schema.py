"""The job specification as Nomad knows it: did-you-mean, conversions, notes once, job-level
tasks, gateway groups; and validate's messages: a field for every problem, each once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from driversdk.agent.validate import check_files
from driversdk.jobspec.job import parse_job

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "job.hcl") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_several_unknown_keys_are_separate_problems_with_did_you_mean(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'job "j" {\n  datacenter = ["dc1"]\n  group "g" {\n    cont = 2\n    task "t" {\n      driver = "exec"\n'
        "      resource {\n        cpu = 1\n      }\n      xyzzy = 1\n    }\n  }\n}\n",
    )
    _, problems = parse_job(path)
    texts = [(p.line, p.field, p.message) for p in problems]
    assert (2, "datacenter", "unsupported argument or block 'datacenter'; did you mean \"datacenters\"?") in texts
    assert (4, "cont", "unsupported argument or block 'cont'; did you mean \"count\"?") in texts
    assert (7, "resource", "unsupported argument or block 'resource'; did you mean \"resources\"?") in texts
    assert (10, "xyzzy", "unsupported argument or block 'xyzzy'; remove it or check its spelling") in texts


def test_known_keys_run_does_not_act_on_are_noted_once(tmp_path: Path) -> None:
    task = 'task "%s" {\n driver = "exec"\n service {\n name = "s"\n check {\n type = "tcp"\n }\n }\n}\n'
    path = write(tmp_path, 'job "j" {\n group "g" {\n' + task % "a" + task % "b" + " }\n}\n")
    job, problems = parse_job(path)
    assert problems == []
    assert job.notes == ['service (first in task "a"): not acted on by driversdk run']


def test_strings_are_converted_as_nomad_converts_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'job "j" {\n group "g" {\n count = "3"\n task "t" {\n driver = "exec"\n kill_timeout = 2000000000\n'
        ' resources {\n cpu = "300"\n }\n env {\n N = 5\n B = true\n }\n }\n }\n}\n',
    )
    job, problems = parse_job(path)
    assert problems == []
    group = job.groups[0]
    task = group.tasks[0]
    assert (group.count, task.cpu, task.env, task.kill_timeout) == (3, 300, {"N": "5", "B": "true"}, "2000000000ns")


def test_a_task_under_the_job_is_wrapped_in_a_group_of_its_name(tmp_path: Path) -> None:
    path = write(tmp_path, 'job "j" {\n task "solo" {\n driver = "exec"\n }\n}\n')
    job, problems = parse_job(path)
    assert problems == []
    assert [(g.name, [t.name for t in g.tasks]) for g in job.groups] == [("solo", ["solo"])]


def test_a_gateway_group_needs_no_task(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'job "j" {\n group "gw" {\n service {\n name = "gw"\n connect {\n gateway {\n ingress {\n listener {\n'
        ' port = 80\n service {\n name = "api"\n }\n }\n }\n }\n }\n }\n }\n}\n',
    )
    job, problems = parse_job(path)
    assert problems == []
    assert job.groups[0].gateway
    path = write(tmp_path, 'job "j" {\n group "empty" {\n }\n}\n')
    assert [p.message for p in parse_job(path)[1]] == ["the group has no task"]


def test_json_output_fills_field_for_every_problem(tmp_path: Path) -> None:
    job = write(
        tmp_path,
        'job "j" {\n  group "g" {\n    count = -1\n    volume "v" {\n      type = "csi"\n      source = "x"\n'
        '    }\n    task "t" {\n      driver = "nosuch"\n      kill_timeout = "soon"\n      bogus = 1\n'
        '      volume_mount {\n        volume = "v"\n        destination = "rel"\n      }\n    }\n  }\n}\n',
    )
    client = write(tmp_path, f'data_dir = "{tmp_path / "data"}"\n', "client.hcl")
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "validate", str(job), "--client", str(client), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    report = json.loads(done.stdout)
    assert len(report["problems"]) >= 6, report
    assert all(p["field"] for p in report["problems"]), report["problems"]
    assert len({p["text"] for p in report["problems"]}) == len(report["problems"])


def test_a_bad_destination_is_reported_once(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    job = write(
        tmp_path,
        'job "j" {\n group "g" {\n volume "v" {\n type = "host"\n source = "s"\n }\n task "t" {\n'
        ' driver = "docker"\n config {\n image = "busybox:1"\n }\n volume_mount {\n volume = "v"\n'
        ' destination = "data"\n }\n }\n }\n}\n',
    )
    client = write(tmp_path, f'host_volume "s" {{\n  path = "{shared}"\n}}\n', "client.hcl")
    report = check_files(str(job), str(client))
    about = [p for p in report.problems if "destination" in p.message]
    assert len(about) == 1, [str(p) for p in report.problems]


def test_a_runtime_destination_is_checked_after_interpolation(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    job = write(
        tmp_path,
        'job "j" {\n group "g" {\n volume "v" {\n type = "host"\n source = "s"\n }\n task "t" {\n'
        ' driver = "docker"\n config {\n image = "busybox:1"\n }\n volume_mount {\n volume = "v"\n'
        ' destination = "${NOMAD_ALLOC_DIR}/data"\n }\n }\n }\n}\n',
    )
    client = write(tmp_path, f'host_volume "s" {{\n  path = "{shared}"\n}}\n', "client.hcl")
    report = check_files(str(job), str(client))
    assert report.problems == [], [str(p) for p in report.problems]
    assert report.parsed is not None
    # run gets the job as written: it interpolates with the real allocation.
    assert report.parsed.groups[0].tasks[0].volume_mounts[0].destination == "${NOMAD_ALLOC_DIR}/data"


def test_restart_policy_merges_job_type_default_group_and_task(tmp_path: Path) -> None:
    from driversdk.jobspec.restarts import RestartPolicy, default_policy, policy_for

    path = write(
        tmp_path,
        'job "j" {\n type = "batch"\n group "g" {\n restart {\n attempts = "5"\n mode = "delay"\n }\n'
        ' task "a" {\n driver = "exec"\n restart {\n delay = "1s"\n render_templates = true\n }\n }\n'
        ' task "b" {\n driver = "exec"\n }\n }\n}\n',
    )
    job, problems = parse_job(path)
    assert problems == []
    group = job.groups[0]
    a, b = group.tasks
    day = 24 * 3600.0
    assert policy_for(job.type, group.restart, b.restart) == RestartPolicy(5, day, 15.0, "delay")
    assert policy_for(job.type, group.restart, a.restart) == RestartPolicy(5, day, 1.0, "delay", render_templates=True)
    assert default_policy("service") == RestartPolicy(2, 30 * 60.0, 15.0, "fail")


def _hostname_job(tmp_path: Path, hostname: str) -> Path:
    return write(
        tmp_path,
        f'job "j" {{\n group "g" {{\n network {{\n mode = "bridge"\n hostname = "{hostname}"\n }}\n'
        ' task "t" {\n driver = "exec"\n }\n }\n}\n',
    )


def test_network_hostname_is_acted_on_and_checked_as_nomad_checks_it(tmp_path: Path) -> None:
    for good in ("web", "web-1.example.internal", "${NOMAD_JOB_NAME}-${NOMAD_ALLOC_INDEX}", "a" * 63):
        job, problems = parse_job(_hostname_job(tmp_path, good))
        assert problems == [], good
        assert job.groups[0].network_hostname == good
        assert not any("hostname" in n for n in job.notes)
    for bad, why in (
        ("a" * 64, "labels of 1 to 63 characters"),
        ("web..internal", "labels of 1 to 63 characters"),
        ("web host", "may not hold spaces"),
        ("web\\nhost", "may not hold spaces"),  # a newline, as HCL reads the escape
        ("web\\\\host", "may not hold spaces, slashes"),  # a backslash
        ("web\\u0001host", "control characters"),
        ("web\\u007fhost", "control characters"),
        ("web/etc", "may not hold spaces, slashes"),
    ):
        _, problems = parse_job(_hostname_job(tmp_path, bad))
        assert [(p.field, why in p.message) for p in problems] == [("network.hostname", True)], (bad, problems)
