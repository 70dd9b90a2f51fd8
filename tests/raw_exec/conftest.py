"""Fixtures for raw_exec driver tests: real host processes, real cgroups (root only)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from driversdk.taskkit.cgroups import cgroup_mounts
from driversdk.testing import AllocDir, DriverHarness
from tests.hostcheck import processes

SERVE = "launch.py serve "
IDLE_BOUND = 10.0  # the shared supervisor leaves IDLE_EXIT (2 s) after its last task


def supervisors_gone(state_dir: Path, bound: float = IDLE_BOUND) -> list[str]:
    """Wait for the shared supervisor of ``state_dir`` to exit on its own; what still runs."""
    deadline = time.monotonic() + bound
    while (left := processes(f"{SERVE}{state_dir}")) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


PLUGIN = [sys.executable, "-m", "drivers.raw_exec"]


@pytest.fixture(autouse=True)
def _require_root(request: pytest.FixtureRequest) -> None:
    """Tests marked ``root`` skip cleanly elsewhere; the pure unit tests run anywhere."""
    if os.geteuid() != 0 and request.node.get_closest_marker("root") is not None:
        pytest.skip("raw_exec driver tests need root (cgroups, user switching)")


@dataclass
class Tracker:
    """What one test may create: its own state dir, cgroup parent and alloc dirs, so leak checks
    see only this test's objects while other test runs use the machine too."""

    base: Path
    cgroup_parent: str = field(default_factory=lambda: f"driversdk-raw-exec-test-{uuid.uuid4().hex[:10]}")

    @property
    def state_dir(self) -> Path:
        return self.base / "state"

    def cgroups(self) -> list[str]:
        found = []
        for root in set(cgroup_mounts().values()):
            parent = os.path.join(root, self.cgroup_parent)
            if os.path.isdir(parent):
                found += [os.path.join(parent, d) for d in os.listdir(parent) if d.startswith("dsr-")]
        return sorted(found)

    def leftovers(self) -> dict[str, list[str]]:
        tasks = self.state_dir / "tasks"
        found = {
            "cgroups": self.cgroups(),
            "task state": sorted(os.listdir(tasks)) if tasks.is_dir() else [],
            # Supervisors name their state dir; tasks run in (or below) the test's dirs.
            # The state dir's shared supervisor is not a leak while it lingers idle: no_leaks waits for it.
            "processes": [p for p in processes(str(self.base)) if SERVE not in p] + _cwd_under(str(self.base)),
        }
        return {k: v for k, v in found.items() if v}

    def remove_cgroup_parent(self) -> None:
        for root in set(cgroup_mounts().values()):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(os.path.join(root, self.cgroup_parent))


def _cwd_under(root: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if (cwd == root or cwd.startswith(root + "/")) and int(pid) != os.getpid():
            found.append(f"{pid} (cwd {cwd})")
    return found


@pytest.fixture
def track(tmp_path: Path) -> Tracker:
    return Tracker(tmp_path)


@pytest.fixture
def plugin_config(track: Tracker) -> dict[str, Any]:
    return {"enabled": True, "state_dir": str(track.state_dir), "cgroup_parent": track.cgroup_parent}


@pytest.fixture
def no_leaks(track: Tracker) -> Iterator[None]:
    yield
    left = track.leftovers()
    track.remove_cgroup_parent()
    assert not left, f"left behind: {left}"
    assert not supervisors_gone(track.state_dir), "the shared task supervisor stayed with no task left"


@pytest.fixture
def harness(plugin_config: dict[str, Any], no_leaks: None) -> Iterator[DriverHarness]:
    with DriverHarness(PLUGIN, plugin_config=plugin_config) as h:
        yield h


@pytest.fixture
def alloc(track: Tracker) -> Iterator[AllocDir]:
    a = AllocDir.create(track.base / "allocs", tasks=["web"])
    yield a
    a.close()


def sh(script: str, **extra: Any) -> dict[str, Any]:
    """Task config running a shell script on the host."""
    return {"command": "/bin/sh", "args": ["-c", script], **extra}
