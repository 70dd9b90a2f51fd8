"""Fixtures of the agent's tests: a real agent process on a data dir of the test's own, the Docker
engine hack/docker-up.sh started, short work dirs, and the HCL parser caches kept in the session."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from driversdk.jobspec.parsecache import ENV_CACHE_DIR
from tests.agent.agentproc import AgentProcess

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


@pytest.fixture
def agent_dir() -> Iterator[Path]:
    """A short path (CSI plugin sockets under the data dir must fit 107 bytes), removed after."""
    path = Path(tempfile.mkdtemp(prefix="dsa-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent(agent_dir: Path) -> Iterator[AgentProcess]:
    """A running agent with the bundled drivers; its jobs are stopped and it exits after the test."""
    process = AgentProcess(agent_dir / "data").start()
    try:
        yield process
    finally:
        process.close()
