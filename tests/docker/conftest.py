"""Fixtures for docker driver tests against a real engine (started by hack/docker-up.sh)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from drivers.docker.container import LABEL_TASK_ID
from driversdk.mountinfo import read_mountinfo
from driversdk.testing import AllocDir, DriverHarness
from tests.hostcheck import labelled_containers

IMAGE = "driversdk-test/busybox:local"
PAUSE = "driversdk-test/pause:local"
PLUGIN = [sys.executable, "-m", "drivers.docker"]
# gc.image is off: the test images are shared by every test and cannot be pulled back.
PLUGIN_CONFIG: dict[str, Any] = {"gc": {"image": False}, "infra_image": PAUSE}


def _engine() -> docker.DockerClient | None:
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get(IMAGE)
        return client
    except Exception:
        return None


@pytest.fixture(scope="session")
def engine() -> docker.DockerClient:
    client = _engine()
    if client is None:
        pytest.skip(
            "no Docker engine with the test images answers; run hack/docker-up.sh and hack/build-test-images.sh"
        )
    return client


def our_containers(engine: docker.DockerClient, under: Path | None = None) -> list[str]:
    """Containers our driver made; with ``under``, only those whose alloc dir is below it."""
    names = []
    for attrs in labelled_containers(engine, LABEL_TASK_ID):
        binds = attrs.get("HostConfig", {}).get("Binds") or []
        if under is None or any(b.startswith(str(under)) for b in binds):
            names.append(str(attrs["Name"]).lstrip("/"))
    return names


@pytest.fixture
def no_leaks(engine: docker.DockerClient, tmp_path: Path) -> Iterator[None]:
    """Fails the test if it leaves any container of its own behind, running or not.

    Only containers of allocations under this test's tmp_path count, so other test runs on
    the same engine do not interfere.
    """
    yield
    left = set(our_containers(engine, tmp_path))
    for name in left:
        engine.containers.get(name).remove(force=True)
    assert not left, f"containers left behind: {sorted(left)}"


@pytest.fixture
def harness(engine: docker.DockerClient, no_leaks: None) -> Iterator[DriverHarness]:
    with DriverHarness(PLUGIN, plugin_config=PLUGIN_CONFIG) as h:
        yield h


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[AllocDir]:
    a = AllocDir.create(tmp_path, tasks=["web"])
    yield a
    a.remove()


def busybox(*argv: str, **extra: Any) -> dict[str, Any]:
    return {"image": IMAGE, "command": argv[0], "args": list(argv[1:]), **extra}


@pytest.fixture
def host_mounts(tmp_path: Path) -> Iterator[list[str]]:
    """Mount points a test creates on the host; unmounted whatever happens."""
    made: list[str] = []
    yield made
    for point in reversed(made):
        subprocess.run(["umount", "-l", point], capture_output=True)
    left = [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(tmp_path))]
    assert not left, f"host mounts left behind: {left}"
