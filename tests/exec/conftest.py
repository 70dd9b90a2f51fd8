"""Fixtures for exec driver tests: real runc, real cgroups, real mounts and namespaces (root only)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from drivers.exec.network import netns_name, netns_path, veth_name
from driversdk import netegress
from driversdk.mountinfo import read_mountinfo
from driversdk.taskkit.cgroups import cgroup_mounts
from driversdk.testing import AllocDir, DriverHarness

PLUGIN = [sys.executable, "-m", "drivers.exec"]
# Test-only network: a bridge and subnet of our own; tests send traffic only between our namespaces.
# One bridge per test session: another run's DestroyNetwork must not take our bridge away.
BRIDGE = f"dsxt{uuid.uuid4().hex[:8]}"
SUBNET = "10.231.77.0/24"
# The plugin options an operator sets to run tasks as root (uid 0, gid 0): both deny nothing.
ROOT_ALLOWED = {"denied_host_uids": "", "denied_host_gids": ""}


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


@dataclass
class Tracker:
    """What one test may create, so leak checks see only its own objects.

    Other test runs (another engineer's full suite, say) may run exec tasks on this machine at
    the same time: containers are told apart by bundle path, cgroups by a per-test cgroup parent,
    namespaces and veths by the allocation ids this test used.
    """

    base: Path
    cgroup_parent: str = field(default_factory=lambda: f"driversdk-exec-test-{uuid.uuid4().hex[:10]}")
    alloc_ids: set[str] = field(default_factory=set)

    def leftovers(self) -> dict[str, list[str]]:
        state = str(self.base / "state") + "/"
        # `runc list` fails when a container's state dir goes while it reads them (a reconciler
        # deleting one right then): the next listing no longer sees it.
        for _ in range(5):
            runc = subprocess.run(["runc", "list", "--format", "json"], capture_output=True, text=True)
            if runc.returncode == 0:
                break
        runc.check_returncode()
        containers = [c["id"] for c in json.loads(runc.stdout or "null") or [] if c["bundle"].startswith(state)]
        ours = (state, str(self.base / "allocs") + "/")
        mounts = [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(ours)]
        cgroups = []
        for root in set(cgroup_mounts().values()):
            parent = os.path.join(root, self.cgroup_parent)
            if os.path.isdir(parent):
                cgroups += [os.path.join(parent, d) for d in os.listdir(parent) if d.startswith("dsx-")]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
        veths = sorted(v for a in self.alloc_ids for v in (veth_name(a), "dsp" + veth_name(a)[3:]) if v in names)
        netns = [netns_name(a) for a in sorted(self.alloc_ids) if os.path.exists(netns_path(netns_name(a)))]
        tasks_dir = self.base / "state" / "tasks"
        task_dirs = sorted(os.listdir(tasks_dir)) if tasks_dir.is_dir() else []
        found = {
            "egress rules": netegress.rules_of(BRIDGE),
            "containers": containers,
            "mounts": mounts,
            "cgroups": cgroups,
            "veths": veths,
            "netns": netns,
            "task dirs": task_dirs,
        }
        return {k: v for k, v in found.items() if v}

    def remove_cgroup_parent(self) -> None:
        for root in set(cgroup_mounts().values()):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(os.path.join(root, self.cgroup_parent))


@pytest.fixture
def track(tmp_path: Path) -> Tracker:
    return Tracker(tmp_path)


@pytest.fixture
def plugin_config(track: Tracker) -> dict[str, Any]:
    return {
        "state_dir": str(track.base / "state"),
        "bridge_name": BRIDGE,
        "bridge_subnet": SUBNET,
        "cgroup_parent": track.cgroup_parent,
    }


@pytest.fixture
def no_leaks(track: Tracker) -> Iterator[None]:
    yield
    left = track.leftovers()
    track.remove_cgroup_parent()
    assert not left, f"left behind: {left}"


@pytest.fixture
def harness(plugin_config: dict[str, Any], no_leaks: None) -> Iterator[DriverHarness]:
    with DriverHarness(PLUGIN, plugin_config=plugin_config) as h:
        yield h


@pytest.fixture
def alloc(track: Tracker) -> Iterator[AllocDir]:
    a = AllocDir.create(track.base / "allocs", tasks=["web"])
    track.alloc_ids.add(a.alloc_id)
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
