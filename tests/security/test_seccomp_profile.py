"""docker ``security_opt = ["seccomp=PATH"]``: the root plugin reads PATH, which the job names.

Before, it read any path without a cap: ``/dev/zero`` filled the plugin's memory, a fifo blocked
StartTask for good, and a directory reached the operator as ``StartTask failed: `` with nothing
after it. Each is refused now, at once, with a sentence naming the task, the option and the path;
a real profile still reaches the engine (tests/docker/test_docker_task_options.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from drivers.docker.container import SECCOMP_PROFILE_MAX
from driversdk.errors import PluginCallError
from driversdk.testing import AllocDir, DriverHarness
from tests.docker.conftest import IMAGE, PLUGIN, PLUGIN_CONFIG, busybox, our_containers


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[DriverHarness]:
    try:
        engine = docker.from_env(timeout=10)
        engine.images.get(IMAGE)
    except Exception:
        pytest.skip("no Docker engine with the test images answers; run hack/docker-up.sh")
    with DriverHarness(PLUGIN, plugin_config=PLUGIN_CONFIG) as h:
        yield h
    left = our_containers(engine, tmp_path)
    for name in left:
        engine.containers.get(name).remove(force=True)
    assert not left, f"containers left behind: {left}"


def _start_refused(h: DriverHarness, alloc: AllocDir, path: str) -> str:
    task = alloc.task_config("web", driver_config=busybox("true", security_opt=[f"seccomp={path}"]))
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            h.start(task)
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    # On a thread with a bound: the old code never came back from a fifo; the test must.
    runner = threading.Thread(target=start, daemon=True)
    runner.start()
    runner.join(30)
    assert outcome, f"StartTask with seccomp={path} did not come back"
    err = outcome[0]
    assert isinstance(err, PluginCallError), f"StartTask with seccomp={path} was not refused: {err!r}"
    return str(err)


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_seccomp_profile_that_is_no_regular_file_is_refused_at_once(
    harness: DriverHarness, tmp_path: Path, kind: str
) -> None:
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    if kind == "device":
        path = "/dev/zero"
        what = "a device"
    elif kind == "fifo":
        path = str(tmp_path / "profile.fifo")
        os.mkfifo(path)
        what = "a fifo"
    else:
        path = str(tmp_path)
        what = "a directory"
    message = _start_refused(harness, alloc, path)
    assert message == (
        f"task 'web': security_opt 'seccomp={path}': the seccomp profile {path!r} is {what}, not a regular file; "
        "point seccomp= at a JSON profile file"
    )


def test_a_seccomp_profile_over_the_cap_is_refused(harness: DriverHarness, tmp_path: Path) -> None:
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    big = tmp_path / "huge.json"
    with open(big, "wb") as fh:
        fh.truncate(SECCOMP_PROFILE_MAX + 1)  # sparse: the size is what counts
    message = _start_refused(harness, alloc, str(big))
    assert f"is {SECCOMP_PROFILE_MAX + 1} bytes, more than the {SECCOMP_PROFILE_MAX}" in message


def test_a_missing_seccomp_profile_names_the_path_and_why(harness: DriverHarness, tmp_path: Path) -> None:
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    path = str(tmp_path / "missing.json")
    assert _start_refused(harness, alloc, path) == (
        f"task 'web': security_opt 'seccomp={path}': cannot read the seccomp profile {path!r}: "
        "No such file or directory"
    )
