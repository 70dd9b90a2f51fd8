"""Plugins started before the job is parsed (driversdk.runner.prelaunch): started only for plain
driver names the job text gives, taken by validation when the parsed job uses them with the same
command, and killed unused otherwise (a line of a heredoc, a job refused before any plugin is
asked, a client config that names another command). Real plugin processes throughout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from driversdk import cli
from driversdk.client import DriverClient
from driversdk.plugin import host
from driversdk.plugin.host import StartingPlugin, pid_alive
from driversdk.runner import jobspec, prelaunch, validate
from driversdk.runner.clientconfig import load_client
from driversdk.runner.prelaunch import Prelaunched, named_drivers, start_early

ROOT = Path(__file__).resolve().parents[2]
HELLO = [sys.executable, str(ROOT / "examples" / "hello_driver.py")]


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[StartingPlugin]:
    """Every plugin process started in this test, in order."""
    out: list[StartingPlugin] = []
    real = host.spawn_plugin

    def recording(*args: object, **kwargs: object) -> StartingPlugin:
        plugin = real(*args, **kwargs)  # type: ignore[arg-type]
        out.append(plugin)
        return plugin

    monkeypatch.setattr(host, "spawn_plugin", recording)
    return out


def client_file(tmp_path: Path, command: list[str] = HELLO) -> Path:
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{tmp_path / "data"}"\nplugin "hello" {{\n  command = {json.dumps(command)}\n}}\n')
    return client


def job_file(tmp_path: Path, body: str) -> Path:
    job = tmp_path / "job.hcl"
    job.write_text(body)
    return job


HELLO_JOB = (
    'job "j" {\n  type = "batch"\n  group "g" {\n    task "t" {\n      driver = "hello"\n'
    '      config {\n        command = "/bin/true"\n      }\n    }\n  }\n}\n'
)


def test_the_names_are_read_from_hcl_and_json_and_only_plain_names_count() -> None:
    text = (
        'task "a" {\n  driver = "docker"\n}\ntask "b" {\n  driver="exec"\n}\n'
        '  # driver = "raw_exec"\n'  # a comment line is not read
        '  driver = "../../bin/sh"\n  driver = "a b"\n  driver = var.which\n'
        '{"Driver": "docker", "driver" : "custom-1"}\n'.replace(", ", "\n")
    )
    assert named_drivers(text) == ["docker", "exec", "custom-1"]


def test_validate_takes_the_plugin_started_before_the_parse(
    tmp_path: Path, spawned: list[StartingPlugin], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen_at_parse: list[int] = []
    real_parse = jobspec.parse_job

    def parse(*args: object, **kwargs: object) -> object:
        seen_at_parse.append(len(spawned))
        return real_parse(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(validate, "parse_job", parse)
    client, job = client_file(tmp_path), job_file(tmp_path, HELLO_JOB)
    report = validate.check_files(str(job), str(client))
    assert report.valid, report.problems
    assert seen_at_parse == [1], "the plugin was started before the job was parsed"
    assert len(spawned) == 1, "validation used it instead of starting a second one"
    assert not pid_alive(spawned[0].pid)


# A line of a heredoc reads like a driver attribute: the guess starts a plugin the job does not use.
NOT_A_DRIVER = 'variable "doc" {\n  default = <<EOT\ndriver = "hello"\nEOT\n}\n'


def test_a_driver_only_named_in_a_heredoc_is_killed_unused(tmp_path: Path, spawned: list[StartingPlugin]) -> None:
    body = 'job "j" {\n  group "g" {\n    task "t" {\n      driver = "nope"\n    }\n  }\n}\n'
    job = job_file(tmp_path, NOT_A_DRIVER + body)
    report = validate.check_files(str(job), str(client_file(tmp_path)))
    assert not report.valid  # no plugin for "nope"
    [guess] = spawned
    assert not pid_alive(guess.pid)


def test_a_job_refused_before_any_plugin_is_asked_leaves_none_running(
    tmp_path: Path, spawned: list[StartingPlugin]
) -> None:
    job = job_file(tmp_path, HELLO_JOB.replace('task "t"', 'task "../escape"'))
    report = validate.check_files(str(job), str(client_file(tmp_path)))
    assert not report.valid
    [guess] = spawned
    assert not pid_alive(guess.pid)


def test_a_job_that_does_not_parse_leaves_none_running(tmp_path: Path, spawned: list[StartingPlugin]) -> None:
    job = job_file(tmp_path, HELLO_JOB + "job {{{ broken\n")
    report = validate.check_files(str(job), str(client_file(tmp_path)))
    assert not report.valid
    [guess] = spawned
    assert not pid_alive(guess.pid)


def test_a_plugin_started_with_another_command_is_killed_and_not_used(
    tmp_path: Path, spawned: list[StartingPlugin]
) -> None:
    client = load_client(client_file(tmp_path))
    job = job_file(tmp_path, HELLO_JOB)
    started = Prelaunched.for_jobs([str(job)], client)
    [guess] = spawned
    assert started.take("hello", [*HELLO, "--other"]) is None
    assert not pid_alive(guess.pid)
    assert len(started) == 0


def test_nothing_is_started_for_a_driver_without_a_plugin_or_an_unreadable_file(
    tmp_path: Path, spawned: list[StartingPlugin]
) -> None:
    client = client_file(tmp_path)
    job = job_file(tmp_path, HELLO_JOB.replace('"hello"', '"unknown_driver"'))
    early = start_early([str(job), str(tmp_path / "missing.hcl")], str(client))
    assert early is not None and len(early[1]) == 0
    assert spawned == []
    assert start_early([str(job)], str(tmp_path / "no-client.hcl")) is None  # the real load reports it


def test_a_large_job_file_is_not_scanned(tmp_path: Path, spawned: list[StartingPlugin]) -> None:
    job = job_file(tmp_path, HELLO_JOB + "#" * prelaunch.SCAN_LIMIT + "\n")
    assert len(Prelaunched.for_jobs([str(job)], load_client(client_file(tmp_path)))) == 0


def test_driversdk_run_starts_the_plugin_once_and_leaves_nothing(
    tmp_path: Path, spawned: list[StartingPlugin], capsys: pytest.CaptureFixture[str]
) -> None:
    client, job = client_file(tmp_path), job_file(tmp_path, HELLO_JOB)
    assert cli.main(["run", str(job), "--client", str(client)]) == 0, capsys.readouterr()
    assert len(spawned) == 1
    assert not pid_alive(spawned[0].pid)


def test_driversdk_run_kills_a_guess_the_jobs_do_not_use_before_anything_starts(
    tmp_path: Path, spawned: list[StartingPlugin], capsys: pytest.CaptureFixture[str]
) -> None:
    client = client_file(tmp_path)
    client.write_text(client.read_text() + f'plugin "other" {{\n  command = {json.dumps(HELLO)}\n}}\n')
    job = job_file(tmp_path, NOT_A_DRIVER + HELLO_JOB.replace('"hello"', '"other"'))
    assert cli.main(["run", str(job), "--client", str(client)]) == 0, capsys.readouterr()
    assert sorted(p.label for p in spawned) == ["hello", "other"]
    assert all(not pid_alive(p.pid) for p in spawned)


DEFERRED = [sys.executable, str(ROOT / "tests" / "sdk" / "plugins" / "deferred_driver.py")]
# The driver's name reaches the job only through a local: the early scan cannot see it, so
# validation starts the plugin itself.
COMPUTED_DRIVER_JOB = HELLO_JOB.replace('job "j" {\n', 'locals {\n  d = "hello"\n}\njob "j" {\n').replace(
    'driver = "hello"', "driver = local.d"
)


@pytest.mark.parametrize("job_text", [HELLO_JOB, COMPUTED_DRIVER_JOB], ids=["started-early", "started-by-validation"])
def test_validate_launches_its_plugins_for_checks_only_and_run_does_not(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spawned: list[StartingPlugin],
    capsys: pytest.CaptureFixture[str],
    job_text: str,
) -> None:
    builds = tmp_path / "builds"
    monkeypatch.setenv("DEFERRED_BUILDS", str(builds))
    monkeypatch.setenv("DEFERRED_PRELOAD", "1")
    # A host that was itself launched for checks must not hand that on to the plugins of its run.
    monkeypatch.setenv(host.ENV_CHECKS_ONLY, "1")
    client, job = client_file(tmp_path, DEFERRED), job_file(tmp_path, job_text)
    assert cli.main(["validate", str(job), "--client", str(client)]) == 0, capsys.readouterr()
    assert builds.read_text() == "built for checks\n"
    builds.unlink()
    assert cli.main(["run", str(job), "--client", str(client)]) == 0, capsys.readouterr()
    assert builds.read_text() == "built\n"  # validation's plugin ran the task: warmed up for it
    assert all(not pid_alive(p.pid) for p in spawned)
    assert len(spawned) == 2


def test_a_plugin_started_early_for_checks_is_not_taken_by_a_run(tmp_path: Path, spawned: list[StartingPlugin]) -> None:
    client = load_client(client_file(tmp_path))
    job = job_file(tmp_path, HELLO_JOB)
    early = Prelaunched.for_jobs([str(job)], client, checks_only=True)
    assert len(early) == 1
    kept: dict[str, DriverClient] = {}
    try:
        report = validate.validate_job(str(job), client, keep_plugins=kept, prelaunched=early)
        assert report.valid, report.problems
        assert len(spawned) == 2  # the run's validation started its own, warmed-up plugin
        assert len(early) == 1  # the one for checks is left to the caller, who abandons it
    finally:
        early.abandon()
        for plugin in kept.values():
            plugin.kill()
    assert all(not pid_alive(p.pid) for p in spawned)
