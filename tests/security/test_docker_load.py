"""A hostile `load`: the docker driver reads image archives only from the task's local/ dir."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from drivers.docker.images import MAX_IMAGE_ARCHIVE_BYTES
from driversdk.errors import PluginCallError
from driversdk.testing import AllocDir, DriverHarness
from tests.docker.conftest import IMAGE, PLUGIN, PLUGIN_CONFIG, busybox, our_containers

TAG = "driversdk-test/loaded-sec:1"


@pytest.fixture
def harness(engine: docker.DockerClient, tmp_path: Path) -> Iterator[DriverHarness]:
    with DriverHarness(PLUGIN, plugin_config=PLUGIN_CONFIG) as h:
        yield h
    left = our_containers(engine, tmp_path)
    for name in left:
        engine.containers.get(name).remove(force=True)
    assert not left, f"containers left behind: {left}"


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[AllocDir]:
    a = AllocDir.create(tmp_path, tasks=["web"])
    yield a
    a.remove()


@pytest.fixture
def absent_tag(engine: docker.DockerClient) -> Iterator[str]:
    """A tag the engine does not have, so the driver must try `load` (never pull)."""
    try:
        engine.images.remove(TAG, force=True)
    except docker.errors.ImageNotFound:
        pass
    yield TAG
    try:
        engine.images.remove(TAG, force=True)
    except docker.errors.ImageNotFound:
        pass


def _refused(harness: DriverHarness, alloc: AllocDir, load: str) -> str:
    task = alloc.task_config("web", driver_config=busybox("true", image=TAG, load=load))
    with pytest.raises(PluginCallError) as info:
        harness.start(task)
    msg = str(info.value)
    assert msg.startswith("task 'web': `load` = "), msg
    assert "Traceback" not in msg
    # The plugin lives on and answers the next call.
    assert harness.client.capabilities().exec
    return msg


def _local(alloc: AllocDir) -> Path:
    return alloc.path / "web" / "local"


def test_load_absolute_host_path_is_local_relative(harness: DriverHarness, alloc: AllocDir, absent_tag: str) -> None:
    msg = _refused(harness, alloc, "/etc/hostname")
    assert "no such file in the task's local/ dir" in msg


def test_load_dotdot_is_refused(harness: DriverHarness, alloc: AllocDir, absent_tag: str) -> None:
    msg = _refused(harness, alloc, "../../../etc/passwd")
    assert "leads out of the task's local/ dir" in msg
    msg = _refused(harness, alloc, "sub/../../secrets/x")
    assert "leads out of the task's local/ dir" in msg


def test_load_symlink_to_host_file_is_refused(harness: DriverHarness, alloc: AllocDir, absent_tag: str) -> None:
    (_local(alloc) / "image.tar").symlink_to("/etc/shadow")
    assert "is a symbolic link" in _refused(harness, alloc, "image.tar")
    (_local(alloc) / "dir").symlink_to("/etc")
    assert "is a symbolic link" in _refused(harness, alloc, "dir/shadow")


def test_load_device_fifo_socket_dir_are_refused(harness: DriverHarness, alloc: AllocDir, absent_tag: str) -> None:
    local = _local(alloc)
    os.mknod(local / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    assert "is a character device" in _refused(harness, alloc, "zero")
    assert "no such file" in _refused(harness, alloc, "/dev/zero")
    os.mkfifo(local / "fifo")
    assert "is a fifo" in _refused(harness, alloc, "fifo")
    sock = socket.socket(socket.AF_UNIX)
    short = tempfile.mkdtemp(dir=local.parent.parent.parent)  # a socket path must be short
    try:
        sock.bind(os.path.join(short, "s"))
        os.rename(os.path.join(short, "s"), local / "sock")
        assert "is a socket" in _refused(harness, alloc, "sock")
    finally:
        sock.close()
        os.rmdir(short)
    (local / "adir").mkdir()
    assert "is a directory" in _refused(harness, alloc, "adir")


def test_load_too_large_archive_is_refused(harness: DriverHarness, alloc: AllocDir, absent_tag: str) -> None:
    big = _local(alloc) / "big.tar"
    with open(big, "wb") as fh:
        fh.truncate(MAX_IMAGE_ARCHIVE_BYTES + 1)  # sparse: no disk used
    msg = _refused(harness, alloc, "big.tar")
    assert f"over the {MAX_IMAGE_ARCHIVE_BYTES} byte limit" in msg


def test_load_archive_from_local_dir_runs(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient, absent_tag: str
) -> None:
    engine.images.get(IMAGE).tag(absent_tag)
    subprocess.run(["docker", "save", "-o", str(_local(alloc) / "busybox.tar"), absent_tag], check=True)
    engine.images.remove(absent_tag)
    task = alloc.task_config("web", driver_config=busybox("echo", "loaded", image=absent_tag, load="busybox.tar"))
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=60).exit_code == 0
    assert engine.images.get(absent_tag)
    assert alloc.wait_for_output("web", b"loaded\n", 10)
