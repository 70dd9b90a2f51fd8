"""Fixtures for exec driver tests: real runc, real cgroups, real mounts and namespaces (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drivers.exec.cgroups import CGROUP_PARENT, cgroup_mounts
from drivers.exec.runc import Runc
from driversdk.mountinfo import read_mountinfo
from driversdk.testing import AllocDir, DriverHarness

PLUGIN = [sys.executable, "-m", "drivers.exec"]
# Test-only network: a bridge and subnet of our own; tests send traffic only between our namespaces.
BRIDGE = "dsxtest0"
SUBNET = "10.231.77.0/24"


def _usable() -> str | None:
    if os.geteuid() != 0:
        return "exec driver tests need root"
    if shutil.which("runc") is None:
        return "runc is not installed"
    return None


@pytest.fixture(autouse=True)
def _require_root_and_runc(request: pytest.FixtureRequest) -> None:
    """Tests marked ``root`` skip cleanly elsewhere; the pure unit tests run anywhere."""
    reason = _usable()
    if reason and request.node.get_closest_marker("root") is not None:
        pytest.skip(reason)


def leftovers(base: Path) -> dict[str, list[str]]:
    """Everything of ours that should be gone after a test: containers, mounts, cgroups, links, netns."""
    containers = [c for c in Runc().containers() if c.startswith("dsx-")]
    ours = (str(base / "state") + "/", str(base / "allocs") + "/")
    mounts = [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(ours)]
    cgroups = []
    for root in set(cgroup_mounts().values()):
        parent = os.path.join(root, CGROUP_PARENT)
        if os.path.isdir(parent):
            cgroups += [os.path.join(parent, d) for d in os.listdir(parent) if d.startswith("dsx-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    veths = [
        line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ": dsv" in line or ": dsp" in line
    ]
    netns = [
        n for n in (os.listdir("/var/run/netns") if os.path.isdir("/var/run/netns") else []) if n.startswith("dsx-")
    ]
    tasks_dir = base / "state" / "tasks"
    task_dirs = sorted(os.listdir(tasks_dir)) if tasks_dir.is_dir() else []
    found = {
        "containers": containers,
        "mounts": mounts,
        "cgroups": cgroups,
        "veths": veths,
        "netns": netns,
        "task dirs": task_dirs,
    }
    return {k: v for k, v in found.items() if v}


@pytest.fixture
def plugin_config(tmp_path: Path) -> dict[str, Any]:
    return {"state_dir": str(tmp_path / "state"), "bridge_name": BRIDGE, "bridge_subnet": SUBNET}


@pytest.fixture
def no_leaks(tmp_path: Path) -> Iterator[None]:
    yield
    left = leftovers(tmp_path)
    assert not left, f"left behind: {left}"


@pytest.fixture
def harness(plugin_config: dict[str, Any], no_leaks: None) -> Iterator[DriverHarness]:
    with DriverHarness(PLUGIN, plugin_config=plugin_config) as h:
        yield h


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[AllocDir]:
    a = AllocDir.create(tmp_path / "allocs", tasks=["web"])
    yield a
    a.close()


def sh(script: str, **extra: Any) -> dict[str, Any]:
    """Task config running a busybox shell script inside the task's chroot."""
    return {"command": "/bin/busybox", "args": ["sh", "-c", script], **extra}


@pytest.fixture
def shared_dir(tmp_path: Path) -> Iterator[Path]:
    """A host dir bind-mounted on itself and made rshared, as host-to-task/bidirectional need."""
    path = tmp_path / "shared"
    path.mkdir()
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    subprocess.run(["mount", "--make-rshared", str(path)], check=True)
    yield path
    subprocess.run(["umount", "-R", "-l", str(path)], check=False)
