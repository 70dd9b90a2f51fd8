"""Volume mounts with propagation, checked in the task (runc exec) and in the host's mountinfo."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driversdk.mountinfo import read_mountinfo
from driversdk.mounts import Mount, Propagation
from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import PLUGIN, ROOT_ALLOWED, sh

pytestmark = pytest.mark.root

TIMEOUT = 60
READY = sh("echo ready; sleep 120")


def _run(harness: DriverHarness, alloc: AllocDir, mount: Mount, user: str = "", **driver: Any) -> str:
    task = alloc.task_config("web", driver_config={**READY, **driver}, mounts=[mount], user=user)
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    return task.id


def _host_mount_after_start(harness: DriverHarness, task_id: str, shared_dir: Path) -> bytes:
    """Mount a tmpfs on the host below the volume after the task started; what the task sees there."""
    sub = shared_dir / "sub"
    sub.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(sub)], check=True)
    (sub / "from-host").write_text("hi")
    res = harness.client.exec_task(task_id, ["/bin/busybox", "ls", "/data/sub"], timeout=30)
    assert res.result.exit_code == 0, res.stderr
    return res.stdout


def test_exec_mount_host_to_task_sees_later_host_mounts(
    harness: DriverHarness, alloc: AllocDir, shared_dir: Path
) -> None:
    mount = Mount("/data", str(shared_dir), propagation=Propagation.HOST_TO_TASK, request_name="vol")
    task_id = _run(harness, alloc, mount)
    assert _host_mount_after_start(harness, task_id, shared_dir) == b"from-host\n"


def test_exec_mount_private_does_not_see_later_host_mounts(
    harness: DriverHarness, alloc: AllocDir, shared_dir: Path
) -> None:
    mount = Mount("/data", str(shared_dir), propagation=Propagation.PRIVATE, request_name="vol")
    task_id = _run(harness, alloc, mount)
    assert _host_mount_after_start(harness, task_id, shared_dir) == b""


def test_exec_mount_read_only_is_read_only(harness: DriverHarness, alloc: AllocDir, tmp_path: Path) -> None:
    source = tmp_path / "ro-src"
    source.mkdir()
    (source / "f").write_text("content")
    task = alloc.task_config(
        "web",
        driver_config=sh("cat /data/f; echo; touch /data/g 2>/dev/null && echo writable || echo read-only"),
        mounts=[Mount("/data", str(source), readonly=True, request_name="vol")],
    )
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    assert alloc.wait_for_output("web", b"read-only\n", timeout=10).startswith(b"content\n")
    assert not (source / "g").exists()


@pytest.fixture
def admin_harness(plugin_config: dict[str, Any], no_leaks: None) -> Iterator[DriverHarness]:
    # Tasks that mount inside their volume: they run as root, which the operator allows.
    config = {
        **plugin_config,
        "allow_caps": ["sys_admin", "chown", "kill", "setuid", "setgid", "dac_override"],
        **ROOT_ALLOWED,
    }
    with DriverHarness(PLUGIN, plugin_config=config) as h:
        yield h


def test_exec_mount_bidirectional_task_mount_reaches_host(
    admin_harness: DriverHarness, alloc: AllocDir, shared_dir: Path
) -> None:
    mount = Mount("/data", str(shared_dir), propagation=Propagation.BIDIRECTIONAL, request_name="vol")
    task_id = _run(admin_harness, alloc, mount, user="root", cap_add=["sys_admin"])
    script = "mkdir -p /data/inner && mount -t tmpfs tmpfs /data/inner && echo from-task > /data/inner/f"
    res = admin_harness.client.exec_task(task_id, ["/bin/busybox", "sh", "-c", script], timeout=30)
    assert res.result.exit_code == 0, res.stderr
    inner = shared_dir / "inner"
    assert any(e.mount_point == str(inner) and e.fs_type == "tmpfs" for e in read_mountinfo())
    assert (inner / "f").read_text() == "from-task\n"
    # And the other way round: a host mount made later shows up in the task.
    assert _host_mount_after_start(admin_harness, task_id, shared_dir) == b"from-host\n"


def test_exec_mount_bidirectional_when_state_dir_shares_the_source_mount(
    plugin_config: dict[str, Any], alloc: AllocDir, shared_dir: Path, no_leaks: None
) -> None:
    # As on a systemd host where "/" is shared and holds both the plugin's state dir and the
    # volume: runc privatises the mount holding the bundle's root, which must not cut the volume off.
    config = {**plugin_config, "state_dir": str(shared_dir / "state"), "allow_caps": ["sys_admin"], **ROOT_ALLOWED}
    volume = shared_dir / "vol"
    volume.mkdir()
    with DriverHarness(PLUGIN, plugin_config=config) as h:
        mount = Mount("/data", str(volume), propagation=Propagation.BIDIRECTIONAL, request_name="vol")
        task_id = _run(h, alloc, mount, user="root", cap_add=["sys_admin"])
        script = "mkdir -p /data/inner && mount -t tmpfs tmpfs /data/inner && echo from-task > /data/inner/f"
        res = h.client.exec_task(task_id, ["/bin/busybox", "sh", "-c", script], timeout=30)
        assert res.result.exit_code == 0, res.stderr
        assert (volume / "inner" / "f").read_text() == "from-task\n"
        h.client.destroy_task(task_id)
        h.forget(task_id)
    assert not [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(shared_dir / "state"))]
