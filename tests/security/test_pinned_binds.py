"""A task's docker bind source inside the alloc dir is pinned: the engine never resolves a path a
task can still change.

The attack: a prestart sidecar of the same group loops on ``/alloc/data/x``; when x appears as a
directory it runs ``rmdir x && ln -s / x``. The main task binds ``../alloc/data/x`` with
``volumes`` disabled (a source inside the alloc dir is allowed) and, each time our check passes,
the sidecar swaps the directory before dockerd resolves the path: the task got the host's ``/``.
Here the sidecar always wins: the plugin under test swaps right before the container is created
(tests/security/racing_docker_plugin.py), with the real engine and runc doing the rest.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from driversdk.errors import PluginCallError
from driversdk.mountinfo import read_mountinfo
from driversdk.testing import AllocDir, DriverHarness
from tests.docker.conftest import IMAGE, PLUGIN, PLUGIN_CONFIG, busybox, our_containers

from .racing_docker_plugin import RACE_SUFFIX

RACING_PLUGIN = [sys.executable, "-m", "tests.security.racing_docker_plugin"]


@pytest.fixture
def engine() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=10)
        client.images.get(IMAGE)
    except Exception:
        pytest.skip("no Docker engine with the test images answers; run hack/docker-up.sh")
    return client


@pytest.fixture
def alloc(tmp_path: Path, engine: docker.DockerClient) -> Iterator[AllocDir]:
    a = AllocDir.create(tmp_path / "allocs", tasks=["web"])
    yield a
    left = our_containers(engine, tmp_path)
    for name in left:
        engine.containers.get(name).remove(force=True)
    assert not left, f"containers left behind: {left}"
    assert _mounts_under(tmp_path) == [], "a pin (or another mount) was left behind"
    a.remove()


def _mounts_under(path: Path) -> list[str]:
    return [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(path))]


def _pin_dirs(alloc: AllocDir) -> list[str]:
    return [n for n in os.listdir(alloc.path) if n.startswith(".driversdk-pins-")]


def _marker(tmp_path: Path) -> str:
    """A file on the host outside the alloc dir; its path as the container would see it under
    /host if /host were the host's root."""
    marker = tmp_path / "host-marker"
    marker.write_text("host secret\n")
    return "/host" + str(marker)


def test_a_bind_source_swapped_for_a_symlink_to_root_after_our_check_mounts_the_original_dir(
    tmp_path: Path, alloc: AllocDir
) -> None:
    marker = _marker(tmp_path)
    source = alloc.path / "alloc" / "data" / f"x{RACE_SUFFIX}"
    source.mkdir()
    (source / "original").write_text("mine\n")
    written = f"written-by-task-{alloc.alloc_id}"
    script = (
        f"if [ -e {marker} ]; then echo SAW-HOST-ROOT; fi; "
        "if [ -e /host/original ]; then echo SAW-ORIGINAL; fi; "
        f"touch /host/{written} 2>/dev/null; echo done"
    )
    task = alloc.task_config(
        "web", driver_config=busybox("/bin/sh", "-c", script, volumes=[f"../alloc/data/x{RACE_SUFFIX}:/host"])
    )
    with DriverHarness(RACING_PLUGIN, plugin_config=PLUGIN_CONFIG) as h:
        h.start(task)
        assert source.is_symlink(), "the racing sidecar swapped the source for a symlink to /"
        assert h.client.wait_task(task.id, timeout=60).exit_code == 0
        out = alloc.wait_for_output("web", b"done\n", 30)
        h.client.destroy_task(task.id, force=True)
        h.forget(task.id)
    if os.path.exists(f"/{written}"):
        os.unlink(f"/{written}")  # the attack worked: the task wrote to the host's root
        pytest.fail("the container wrote a file into the host's / through the swapped source")
    assert b"SAW-HOST-ROOT" not in out, "the container was given the host's / through the swapped source"
    assert b"SAW-ORIGINAL" in out, "the container gets the directory that was checked"
    assert (alloc.path / "alloc" / "data" / f"x{RACE_SUFFIX}.orig" / written).exists()
    assert _mounts_under(tmp_path) == [] and _pin_dirs(alloc) == []


def test_a_symlink_planted_before_the_start_is_refused_with_a_sentence_and_leaves_nothing(
    tmp_path: Path, alloc: AllocDir
) -> None:
    (alloc.path / "alloc" / "data" / "x").symlink_to("/")
    task = alloc.task_config("web", driver_config=busybox("true", volumes=["../alloc/data/x:/host"]))
    with DriverHarness(PLUGIN, plugin_config=PLUGIN_CONFIG) as h, pytest.raises(PluginCallError) as info:
        h.start(task)
    message = str(info.value)
    assert "task 'web': docker volume '../alloc/data/x:/host': the source" in message
    assert "passes through a symlink inside the alloc dir" in message and "Traceback" not in message
    assert _mounts_under(tmp_path) == [] and _pin_dirs(alloc) == []


def test_a_missing_volume_dir_is_made_beneath_the_alloc_dir_and_a_missing_mount_source_refused(
    tmp_path: Path, alloc: AllocDir
) -> None:
    # The engine makes a missing ``volumes`` source dir itself, following whatever symlink is on
    # the way: we make it, on the verified parent. A ``mount`` of type bind needs its source.
    task = alloc.task_config(
        "web", driver_config=busybox("/bin/sh", "-c", "echo hi > /new/f", volumes=["../alloc/data/a/b:/new"])
    )
    with DriverHarness(PLUGIN, plugin_config=PLUGIN_CONFIG) as h:
        h.start(task)
        assert h.client.wait_task(task.id, timeout=60).exit_code == 0
        h.client.destroy_task(task.id, force=True)
        h.forget(task.id)
        assert (alloc.path / "alloc" / "data" / "a" / "b" / "f").read_text() == "hi\n"
        (alloc.path / "alloc" / "data" / "link").symlink_to("/etc")
        bad = alloc.task_config(
            "web",
            driver_config=busybox("true", mount=[{"type": "bind", "source": "../alloc/data/missing", "target": "/m"}]),
        )
        with pytest.raises(PluginCallError, match=r"mount\[0\]: the source .* does not exist inside the alloc dir"):
            h.start(bad)
        deep = alloc.task_config("web", driver_config=busybox("true", volumes=["../alloc/data/link/new:/n"]))
        with pytest.raises(PluginCallError, match="passes through a symlink"):
            h.start(deep)
    assert not os.path.exists("/etc/new")
    assert _mounts_under(tmp_path) == [] and _pin_dirs(alloc) == []


def test_alloc_logs_swapped_by_a_sibling_task_is_refused(tmp_path: Path, alloc: AllocDir) -> None:
    # alloc/ is every task's to write: a sibling replaces alloc/logs with a symlink to / and the
    # next container's read-only /alloc/logs would be the host's root.
    logs = alloc.path / "alloc" / "logs"
    task = alloc.task_config("web", driver_config=busybox("true"))
    aside = alloc.path / "alloc" / "logs.orig"
    logs.rename(aside)
    logs.symlink_to("/")
    try:
        with DriverHarness(PLUGIN, plugin_config=PLUGIN_CONFIG) as h, pytest.raises(PluginCallError) as info:
            h.start(task)
        assert "the /alloc/logs bind: the source" in str(info.value)
        assert "passes through a symlink" in str(info.value)
    finally:
        logs.unlink()
        aside.rename(logs)
    assert _mounts_under(tmp_path) == [] and _pin_dirs(alloc) == []
