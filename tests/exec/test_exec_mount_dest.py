"""Volume destinations: refused when they mean nothing or the whole root, and never resolved host-side."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drivers.exec.bundle import mount_destination
from driversdk.errors import ConfigError, PluginCallError
from driversdk.mountinfo import read_mountinfo
from driversdk.mounts import Mount
from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import Tracker, sh

TIMEOUT = 60


@pytest.mark.parametrize(
    ("destination", "expected"),
    [("/data", "/data"), ("/data/", "/data"), ("//data/./x/../y", "/data/y"), ("/local/../../etc", "/etc")],
)
def test_exec_mount_destination_normalised(destination: str, expected: str) -> None:
    assert mount_destination(Mount(destination, "/srv", request_name="vol"), task="web") == expected


@pytest.mark.parametrize("destination", ["", "relative/x", "./x", "/", "//", "/..", "/../", "/data/../..", "/./"])
def test_exec_mount_destination_refused_in_a_sentence(destination: str) -> None:
    with pytest.raises(ConfigError) as err:
        mount_destination(Mount(destination, "/srv/vol", request_name="vol"), task="web")
    message = err.value.message
    assert message.startswith("task 'web': volume 'vol' (host path '/srv/vol'): its destination ")
    assert message.endswith("such as /data")


@pytest.mark.root
@pytest.mark.parametrize("destination", ["", "/", "relative/x", "/../", "/data/../.."])
def test_exec_start_refuses_bad_mount_destination_and_leaves_nothing(
    harness: DriverHarness, alloc: AllocDir, track: Tracker, tmp_path: Path, destination: str
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    task = alloc.task_config(
        "web", driver_config=sh("echo ready"), mounts=[Mount(destination, str(source), request_name="vol")]
    )
    with pytest.raises(PluginCallError) as err:
        harness.start(task)
    harness.forget(task.id)
    assert err.value.message.startswith(f"task 'web': volume 'vol' (host path '{source}'): its destination ")
    assert not err.value.recoverable
    # Refused before anything was created: no bundle, record, cgroup or container.
    assert not track.leftovers()


@pytest.mark.root
def test_exec_mount_destination_symlink_in_task_dir_is_not_followed_on_host(
    harness: DriverHarness, alloc: AllocDir, tmp_path: Path
) -> None:
    # The task (in an earlier run, say) made /local/x a symlink to a host path. The volume
    # destination goes through it: the mount point must be made inside the task's root, and the
    # host dir the link names must neither gain a directory nor get anything mounted on it.
    victim = tmp_path / "victim"
    victim.mkdir()
    (alloc.path / "web" / "local").mkdir(parents=True, exist_ok=True)
    os.symlink(str(victim), alloc.path / "web" / "local" / "x")
    source = tmp_path / "src"
    source.mkdir()
    (source / "marker").write_text("from-volume\n")
    task = alloc.task_config(
        "web",
        driver_config=sh("cat /local/x/sub/marker; echo ready; sleep 120"),
        mounts=[Mount("/local/x/sub", str(source), request_name="vol")],
    )
    harness.start(task)
    out = alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    assert out.startswith(b"from-volume\n")
    assert list(victim.iterdir()) == []
    assert not [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(victim))]
    harness.client.destroy_task(task.id, force=True)
    harness.forget(task.id)
    assert list(victim.iterdir()) == []
    assert (source / "marker").read_text() == "from-volume\n"
