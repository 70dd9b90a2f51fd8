"""Nomad's safe defaults for exec tasks (issue 25, item 5), played by a hostile job: a task that
names no user runs as nobody, root (uid 0 or gid 0) is refused unless the operator allows it,
host pid mode cannot signal root's processes, chroot_env gives no root-only file, and nothing a
task finds in its own dirs (/local, /secrets, /alloc) raises its privileges. Real runc."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from driversdk.errors import PluginCallError
from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import PLUGIN, ROOT_ALLOWED, Tracker, sh

TIMEOUT = 60
NOBODY = pwd.getpwnam("nobody")


def _run(h: DriverHarness, alloc: AllocDir, script: str, **kwargs: Any) -> tuple[int, str]:
    task = alloc.task_config("web", driver_config=sh(script + "; echo end", **kwargs.pop("config", {})), **kwargs)
    h.start(task)
    code = h.client.wait_task(task.id, timeout=TIMEOUT).exit_code
    out = alloc.wait_for_output("web", b"end\n", timeout=10).decode()
    return code, out + alloc.stderr("web").decode()


def _refused(h: DriverHarness, alloc: AllocDir, track: Tracker, user: str) -> str:
    task = alloc.task_config("web", driver_config=sh("id -u"), user=user)
    with pytest.raises(PluginCallError) as err:
        h.start(task)
    h.forget(task.id)
    # Nothing of the task: no runc container, no mount, no bundle or record, no cgroup.
    assert not track.leftovers()
    assert err.value.code == "INVALID_ARGUMENT"
    return err.value.message


@pytest.mark.root
def test_exec_task_without_user_runs_as_nobody(harness: DriverHarness, alloc: AllocDir) -> None:
    code, out = _run(harness, alloc, "id -u; id -g")
    assert code == 0, out
    assert out.split()[:2] == [str(NOBODY.pw_uid), str(NOBODY.pw_gid)]


@pytest.mark.root
def test_exec_host_pid_mode_cannot_kill_a_root_process(harness: DriverHarness, alloc: AllocDir) -> None:
    victim = subprocess.Popen(["sleep", "300"])
    try:
        code, out = _run(harness, alloc, f"kill -9 {victim.pid}; echo rc=$?", config={"pid_mode": "host"})
        assert code == 0, out
        assert "rc=0" not in out and "rc=" in out, out
        # The task shared the host's pid namespace (it saw the pid) and still could not kill it.
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.root
def test_exec_task_cannot_read_etc_shadow_through_chroot_env(harness: DriverHarness, alloc: AllocDir) -> None:
    assert Path("/etc/shadow").stat().st_size > 0
    code, out = _run(harness, alloc, "cat /etc/shadow > /dev/null; echo rc=$?")
    assert code == 0 and "rc=1" in out and "Permission denied" in out, out


@pytest.mark.root
@pytest.mark.parametrize("user", ["root", "0"])
def test_exec_root_is_refused_by_default_and_leaves_nothing(
    harness: DriverHarness, alloc: AllocDir, track: Tracker, user: str
) -> None:
    message = _refused(harness, alloc, track, user)
    assert message.startswith("task 'web': running as user 'root' (uid 0) is not allowed on this client"), message
    assert "denied_host_uids ('0')" in message and 'denied_host_uids = ""' in message, message
    assert "\n" not in message


@pytest.mark.root
def test_exec_root_gid_is_refused_by_default(
    plugin_config: dict[str, Any], alloc: AllocDir, track: Tracker, no_leaks: None
) -> None:
    # Only uids opened: root's group 0 is still denied.
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, "denied_host_uids": ""}) as h:
        message = _refused(h, alloc, track, "root")
    assert "its group 'root' (gid 0) is in the plugin's denied_host_gids ('0')" in message, message
    assert 'denied_host_gids = ""' in message, message


@pytest.mark.root
def test_exec_empty_denied_ids_allow_root(plugin_config: dict[str, Any], alloc: AllocDir, no_leaks: None) -> None:
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, **ROOT_ALLOWED}) as h:
        code, out = _run(h, alloc, "id -u", user="root")
    assert code == 0 and out.split()[0] == "0", out


def _setuid_python(dest: Path) -> None:
    """A setuid-root copy of the host's python in a task dir: a template with uid = 0 and
    perms = "4755", or a file a root task of the allocation left, looks just like it."""
    shutil.copy2(os.path.realpath("/usr/bin/python3"), dest)
    os.chown(dest, 0, 0)
    os.chmod(dest, 0o4755)


@pytest.mark.root
def test_exec_setuid_files_in_task_dirs_do_not_elevate(harness: DriverHarness, alloc: AllocDir) -> None:
    for where in ("web/local", "web/secrets", "alloc/data"):
        _setuid_python(alloc.path / where / "py")
    script = (
        "for d in /local /secrets /alloc/data; do $d/py -c 'import os; print(\"euid\", os.geteuid())'; done; "
        "grep NoNewPrivs /proc/self/status; cat /proc/self/mountinfo"
    )
    code, out = _run(harness, alloc, script)
    assert code == 0, out
    lines = out.splitlines()
    # /secrets is noexec: the copy there does not run at all; the others run without privilege.
    assert [line for line in lines if line.startswith("euid")] == [f"euid {NOBODY.pw_uid}"] * 2, out
    assert "NoNewPrivs:\t1" in lines, out
    options = {}
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[4] in ("/local", "/secrets", "/alloc", "/tmp"):
            options[fields[4]] = set(fields[5].split(","))
    assert set(options) == {"/local", "/secrets", "/alloc", "/tmp"}, out
    for point, opts in options.items():
        assert {"nosuid", "nodev"} <= opts, (point, opts)
