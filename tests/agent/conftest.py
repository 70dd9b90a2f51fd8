"""Fixtures of the agent tests: a real agent process on a data dir of the test's own."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.agentproc import AgentProcess


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
