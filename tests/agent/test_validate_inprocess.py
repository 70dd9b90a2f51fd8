"""`driversdk validate` asks a bundled driver (docker, exec, raw_exec at its bundled command) in
its own process (driversdk.agent.pluginmanager.inprocess): the answers are the ones the launched plugin gives
over gRPC, a bad plugin config reads the same, no plugin process is started and nothing is left
running; a driver the client config gives a command of its own is launched as before, and
`driversdk run` still runs its tasks through a plugin process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driversdk import cli
from driversdk.agent.pluginmanager.inprocess import InProcessDriver, answers_here
from driversdk.agent.validate import check_files
from driversdk.bundled import bundled_drivers
from driversdk.client import DriverClient, launch
from driversdk.errors import DriverSDKError
from driversdk.hclspec import Spec
from driversdk.jobspec.clientconfig import ClientConfig, load_client
from driversdk.plugin import host
from driversdk.plugin.host import StartingPlugin, pid_alive
from tests.agent.conftest import IMAGE
from tests.agent.runs import ROOT

CONFIGS: dict[str, dict[str, Any]] = {
    "docker": {"gc": {"image": False}},
    "exec": {},
    "raw_exec": {"enabled": True},
}
# A plugin config each driver refuses, once in the host's encoding (a value of the wrong type)
# and once in the driver's own checks.
BAD_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("docker", {"gc": {"image": "perhaps"}}),
    ("docker", {"pull_activity_timeout": "5s"}),
    ("exec", {"state_dir": "relative/dir"}),
    ("raw_exec", {"reconcile": {"period": "0s"}}),
]


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[StartingPlugin]:
    out: list[StartingPlugin] = []
    real = host.spawn_plugin

    def recording(*args: Any, **kwargs: Any) -> StartingPlugin:
        plugin = real(*args, **kwargs)
        out.append(plugin)
        return plugin

    monkeypatch.setattr(host, "spawn_plugin", recording)
    return out


@pytest.fixture(params=sorted(CONFIGS))
def both(request: pytest.FixtureRequest) -> Iterator[tuple[str, InProcessDriver, DriverClient]]:
    """A bundled driver built here, and the same driver launched as its plugin."""
    name: str = request.param
    here = InProcessDriver(name)
    plugin = launch(bundled_drivers()[name].command(), name=name)
    try:
        yield name, here, plugin
    finally:
        plugin.kill()
        here.kill()


def spec_shape(spec: Spec | None) -> object:
    return None if spec is None else spec.to_proto().SerializeToString(deterministic=True)


def test_a_bundled_driver_answers_here_as_its_plugin_does(
    both: tuple[str, InProcessDriver, DriverClient], engine: object
) -> None:
    name, here, plugin = both
    assert spec_shape(here.config_schema()) == spec_shape(plugin.config_schema())
    here.set_config(CONFIGS[name])
    plugin.set_config(CONFIGS[name])
    assert here.capabilities() == plugin.capabilities()
    assert spec_shape(here.task_config_schema()) == spec_shape(plugin.task_config_schema())
    (ours,) = list(here.fingerprint())
    theirs = next(iter(plugin.fingerprint()))
    assert (ours.health, ours.health_description, ours.attributes) == (
        theirs.health,
        theirs.health_description,
        theirs.attributes,
    )


@pytest.mark.parametrize(("name", "config"), BAD_CONFIGS, ids=[f"{n}-{sorted(c)[0]}" for n, c in BAD_CONFIGS])
def test_a_bad_plugin_config_reads_the_same_here_and_from_the_plugin(name: str, config: dict[str, Any]) -> None:
    here = InProcessDriver(name)
    plugin = launch(bundled_drivers()[name].command(), name=name)
    try:
        with pytest.raises(DriverSDKError) as ours:
            here.set_config(config)
        with pytest.raises(DriverSDKError) as theirs:
            plugin.set_config(config)
    finally:
        plugin.kill()
        here.kill()
    assert str(ours.value) == str(theirs.value)
    assert str(ours.value)  # a sentence, not an empty status


def docker_job(tmp_path: Path) -> Path:
    job = tmp_path / "job.hcl"
    job.write_text(
        'job "j" {\n  type = "batch"\n  group "g" {\n    task "t" {\n      driver = "docker"\n'
        f'      config {{\n        image = "{IMAGE}"\n        command = "/bin/true"\n      }}\n    }}\n  }}\n}}\n'
    )
    return job


def client_file(tmp_path: Path, extra: str = "") -> Path:
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{tmp_path / "data"}"\nplugin "docker" {{\n  config {{\n    gc {{\n'
                      f"      image = false\n    }}\n  }}\n{extra}}}\n")  # fmt: skip
    return client


def test_validate_starts_no_plugin_for_a_bundled_driver_and_leaves_nothing_running(
    tmp_path: Path, spawned: list[StartingPlugin], engine: object, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {t.ident for t in threading.enumerate()}
    assert cli.main(["validate", str(docker_job(tmp_path)), "--client", str(client_file(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert 'ok    task "t": driver "docker" loaded' in out
    assert spawned == []
    # The driver's watcher and reconciler threads ended with it.
    for thread in threading.enumerate():
        if thread.ident not in before:
            thread.join(timeout=10)
            assert not thread.is_alive(), f"{thread.name} is left running"


def test_validate_in_a_fresh_process_loads_neither_grpc_nor_the_docker_sdk(tmp_path: Path, engine: object) -> None:
    script = (
        "import sys\nfrom driversdk.cli import main\ncode = main(sys.argv[1:])\n"
        "print({'code': code, 'grpc': 'grpc' in sys.modules, 'sdk': 'docker' in sys.modules})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["validate", str(docker_job(tmp_path)), "--client", str(client_file(tmp_path))]
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "{'code': 0, 'grpc': False, 'sdk': False}"


def test_a_docker_plugin_of_the_operators_own_is_launched_for_checks(
    tmp_path: Path, spawned: list[StartingPlugin], engine: object
) -> None:
    own = [sys.executable, "-X", "utf8", "-m", "drivers.docker"]  # the same code, not the bundled command
    client = client_file(tmp_path, f"  command = {json.dumps(own)}\n")
    assert not answers_here(load_client(client), "docker")
    report = check_files(str(docker_job(tmp_path)), str(client))
    assert report.valid, report.problems
    assert [p.label for p in spawned] == ["docker"]
    assert not pid_alive(spawned[0].pid)


def test_only_bundled_drivers_at_their_bundled_command_answer_here(tmp_path: Path) -> None:
    assert sorted(bundled_drivers()) == ["docker", "exec", "raw_exec"]
    assert all(answers_here(ClientConfig(), name) for name in bundled_drivers())
    assert not answers_here(ClientConfig(), "hello")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    binary = plugins / "exec"
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    assert not answers_here(ClientConfig(plugin_dir=str(plugins)), "exec")  # plugin_dir's binary wins
    assert answers_here(ClientConfig(plugin_dir=str(plugins)), "docker")


def test_a_missing_extra_is_named_by_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawned: list[StartingPlugin]
) -> None:
    real = importlib.util.find_spec

    def without_docker(name: str, package: str | None = None) -> Any:
        return None if name == "docker" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_docker)
    report = check_files(str(docker_job(tmp_path)), str(client_file(tmp_path)))
    assert [p.message for p in report.problems] == [
        'driver "docker" could not be loaded: driversdk-docker needs the docker extra (docker is missing): '
        "pip install 'driversdk[docker]'"
    ]
    assert spawned == []


def test_run_still_runs_a_bundled_drivers_tasks_through_its_plugin(
    tmp_path: Path, spawned: list[StartingPlugin], engine: object, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", str(docker_job(tmp_path)), "--client", str(client_file(tmp_path))]
    assert cli.main(args) == 0, capsys.readouterr()
    assert [p.label for p in spawned] == ["docker"]
    assert not pid_alive(spawned[0].pid)
