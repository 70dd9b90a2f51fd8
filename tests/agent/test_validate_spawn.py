"""Validation starts the plugin of every driver a job names at once, before it loads its own gRPC
side, then connects to each in its turn: a plugin that cannot start is reported in its turn as
before, and one never connected to (the checks ended early) is killed, never left running."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from driversdk.agent import validate
from driversdk.jobspec.clientconfig import load_client
from driversdk.plugin.host import StartingPlugin, pid_alive
from tests.agent.runs import ROOT

HELLO = [sys.executable, str(ROOT / "examples" / "hello_driver.py")]


def files(tmp_path: Path) -> tuple[Path, Path]:
    client = tmp_path / "client.hcl"
    commands = {"hello": HELLO, "missing": [str(tmp_path / "no-such-plugin")]}
    blocks = [f'plugin "{name}" {{\n  command = {json.dumps(cmd)}\n}}\n' for name, cmd in commands.items()]
    client.write_text(f'data_dir = "{tmp_path / "data"}"\n' + "".join(blocks))
    job = tmp_path / "job.hcl"
    job.write_text(
        'job "j" {\n  group "g" {\n'
        '    task "first" {\n      driver = "missing"\n    }\n'
        '    task "second" {\n      driver = "hello"\n      config {\n        command = "/bin/true"\n      }\n    }\n'
        '    task "third" {\n      driver = "hello"\n      config {\n        command = "/bin/true"\n      }\n    }\n'
        "  }\n}\n"
    )
    return client, job


def test_each_driver_is_started_once_and_a_failed_start_is_reported_in_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, job = files(tmp_path)
    spawned: list[dict[str, object]] = []
    real = validate._spawn_plugins

    def recorded(*args: object, **kwargs: object) -> dict[str, object]:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        spawned.append(dict(out))
        return out  # type: ignore[return-value]

    monkeypatch.setattr(validate, "_spawn_plugins", recorded)
    report = validate.validate_job(str(job), load_client(client))
    [started] = spawned
    assert sorted(started) == ["hello", "missing"]
    assert isinstance(started["hello"], StartingPlugin)
    [problem] = report.problems
    assert problem.field == 'plugin "missing"'
    assert 'driver "missing" could not be loaded: cannot start plugin' in problem.message
    assert 'task "second": driver "hello" loaded' in report.checked
    assert 'task "third": driver "hello" loaded' in report.checked
    assert not pid_alive(started["hello"].pid)  # shut down after the checks


def test_a_plugin_never_connected_to_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client, job = files(tmp_path)
    spawned: list[dict[str, object]] = []
    real = validate._spawn_plugins

    def recorded(*args: object, **kwargs: object) -> dict[str, object]:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        spawned.append(dict(out))
        return out  # type: ignore[return-value]

    def broken(*args: object) -> None:
        raise RuntimeError("the checks failed before any driver's turn")

    monkeypatch.setattr(validate, "_spawn_plugins", recorded)
    monkeypatch.setattr(validate, "_check_tasks", broken)
    with pytest.raises(RuntimeError):
        validate.validate_job(str(job), load_client(client))
    [started] = spawned
    hello = started["hello"]
    assert isinstance(hello, StartingPlugin)
    assert not pid_alive(hello.pid)
