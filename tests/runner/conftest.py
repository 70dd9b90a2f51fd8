"""Fixtures shared by the runner tests: the Docker engine hack/docker-up.sh started."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from driversdk.runner.parsecache import ENV_CACHE_DIR

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


@pytest.fixture(scope="session", autouse=True)
def parser_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The HCL parser caches of the runs tests start go to a dir of the session, not ~/.cache."""
    before = os.environ.get(ENV_CACHE_DIR)
    os.environ[ENV_CACHE_DIR] = str(tmp_path_factory.mktemp("parser-cache"))
    yield
    if before is None:
        os.environ.pop(ENV_CACHE_DIR, None)
    else:
        os.environ[ENV_CACHE_DIR] = before
