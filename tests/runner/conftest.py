"""Fixtures shared by the runner tests: the Docker engine hack/docker-up.sh started."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

IMAGE = "driversdk-test/busybox:local"


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=10)
        client.images.get(IMAGE)
        return client
    except Exception:
        pytest.skip("no Docker engine with the test images answers; run hack/docker-up.sh")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A work dir with a short path: a csi_plugin's socket under <data_dir> must fit 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dsx-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
