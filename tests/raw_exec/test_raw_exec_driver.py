"""raw_exec through the harness: a real plugin subprocess running real host processes."""

from __future__ import annotations

import os
import pwd
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from drivers.raw_exec.driver import task_key_for
from drivers.raw_exec.store import RawState
from driversdk.errors import PluginCallError
from driversdk.model import FSIsolation, HealthState, MountConfigSupport, NetworkIsolationMode, Resources, TaskState
from driversdk.taskkit.cgroups import cgroup_mounts
from driversdk.testing import AllocDir, DriverHarness
from tests.raw_exec.conftest import PLUGIN, Tracker, sh

pytestmark = pytest.mark.root

TIMEOUT = 60


def _state(handle: Any) -> RawState:
    return RawState.decode(handle.driver_state, handle.version)


def _wait_for_file(path: Path, timeout: float = TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def test_raw_exec_capabilities_are_honest(harness: DriverHarness) -> None:
    caps = harness.client.capabilities()
    assert caps.send_signals and caps.exec
    assert caps.fs_isolation == FSIsolation.NONE
    assert caps.mount_configs == MountConfigSupport.NONE
    assert set(caps.network_isolation_modes) == {NetworkIsolationMode.HOST, NetworkIsolationMode.GROUP}
    assert not caps.must_create_network


def test_raw_exec_fingerprint_enabled_and_disabled(harness: DriverHarness, track: Tracker) -> None:
    fp = next(iter(harness.client.fingerprint()))
    assert (fp.health, fp.health_description) == (HealthState.HEALTHY, "Healthy")
    attrs = {k: getattr(v, "value", v) for k, v in fp.attributes.items()}
    assert attrs == {"driver.raw_exec": True}
    with DriverHarness(PLUGIN, plugin_config={"state_dir": str(track.state_dir)}) as h:
        off = next(iter(h.client.fingerprint()))
        assert (off.health, off.health_description, dict(off.attributes)) == (HealthState.UNDETECTED, "disabled", {})


def test_raw_exec_disabled_by_default_refuses_tasks(alloc: AllocDir, track: Tracker, no_leaks: None) -> None:
    config = {"state_dir": str(track.state_dir), "cgroup_parent": track.cgroup_parent}
    with DriverHarness(PLUGIN, plugin_config=config) as h:
        task = alloc.task_config("web", driver_config=sh("touch /tmp/never"))
        with pytest.raises(PluginCallError) as err:
            h.start(task)
        h.forget(task.id)
    assert err.value.message == (
        "task 'web': the raw_exec driver is disabled on this client; an operator enables it in the client "
        'config with plugin "raw_exec" { config { enabled = true } }'
    )
    assert not track.leftovers()


def test_raw_exec_runs_on_the_host_with_exit_code_logs_and_env(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config(
        "web", driver_config=sh('echo "hello $NOMAD_TASK_NAME in $PWD"; echo oops >&2; exit 3'), env={"X": "1"}
    )
    handle = harness.start(task)
    assert handle.state == TaskState.RUNNING
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert (result.exit_code, result.signal, result.oom_killed) == (3, 0, False)
    # No isolation: the default working dir is the task dir on the host.
    alloc.wait_for_output("web", f"hello web in {alloc.path / 'web'}\n".encode(), timeout=10)
    alloc.wait_for_output("web", b"oops\n", timeout=10, stderr=True)
    status = harness.client.inspect_task(task.id)
    assert status.state == TaskState.EXITED and status.result is not None and status.result.exit_code == 3
    assert status.completed_at is not None and status.started_at is not None
    harness.client.destroy_task(task.id)
    harness.forget(task.id)
    with pytest.raises(PluginCallError) as err:
        harness.client.inspect_task(task.id)
    assert err.value.code == "NOT_FOUND"


def test_raw_exec_work_dir_and_bare_command_from_path(harness: DriverHarness, alloc: AllocDir, tmp_path: Path) -> None:
    task = alloc.task_config("web", driver_config={"command": "pwd", "work_dir": str(tmp_path)})
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    alloc.wait_for_output("web", f"{tmp_path}\n".encode(), timeout=10)


def test_raw_exec_task_has_its_own_process_group_and_cgroup(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    task = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["120"]})
    state = _state(harness.start(task))
    pid = state.task_pid
    assert os.getpgid(pid) == pid
    assert os.getsid(pid) == os.getsid(state.supervisor_pid) == state.supervisor_pid != os.getsid(0)
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    expected = f"/{track.cgroup_parent}/{task_key_for(task.id)}/task"
    memory = [line for line in lines if ":memory:" in line]
    assert memory == [f"{memory[0].split(':')[0]}:memory:{expected}"]
    # The supervisor stays outside the task's cgroup: an OOM kill at the limit can only hit the task.
    assert expected not in Path(f"/proc/{state.supervisor_pid}/cgroup").read_text()
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    assert int(status["SigBlk"], 16) == 0 and int(status["SigIgn"], 16) & 0x7FFFFFFF == 0
    assert os.readlink(f"/proc/{pid}/fd/1") == task.stdout_path
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    harness.client.stop_task(task.id, timeout=5, signal="SIGTERM")
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).signal == signal.SIGTERM


def test_raw_exec_signal_task(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config(
        "web", driver_config=sh("trap 'echo got-usr1' USR1; echo ready; while :; do sleep 0.1; done")
    )
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=30)
    harness.client.signal_task(task.id, "SIGUSR1")
    alloc.wait_for_output("web", b"got-usr1\n", timeout=30)
    with pytest.raises(PluginCallError) as err:
        harness.client.signal_task(task.id, "SIGBOGUS")
    assert "unknown signal 'SIGBOGUS'" in err.value.message


def test_raw_exec_stop_with_a_signal_the_task_handles(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("trap 'echo got-term; exit 7' TERM; echo ready; sleep 60 & wait"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=30)
    started = time.monotonic()
    harness.client.stop_task(task.id, timeout=30, signal="SIGTERM")
    assert time.monotonic() - started < 20
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert (result.exit_code, result.signal) == (7, 0)


def test_raw_exec_default_stop_signal_is_sigint(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("trap 'exit 5' INT; echo ready; sleep 60 & wait"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=30)
    harness.client.stop_task(task.id, timeout=30, signal="")
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 5


def test_raw_exec_stop_escalates_to_sigkill_after_the_timeout(harness: DriverHarness, alloc: AllocDir) -> None:
    # The task ignores SIGTERM, and a child it forked keeps running in its cgroup.
    task = alloc.task_config(
        "web", driver_config=sh("trap '' TERM; sleep 300 & echo ready; while :; do sleep 0.1; done")
    )
    state = _state(harness.start(task))
    alloc.wait_for_output("web", b"ready\n", timeout=30)
    started = time.monotonic()
    harness.client.stop_task(task.id, timeout=1, signal="SIGTERM")
    took = time.monotonic() - started
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert (result.exit_code, result.signal) == (128 + signal.SIGKILL, signal.SIGKILL)
    assert 1 <= took < 15
    assert (
        not os.path.exists(f"/proc/{state.task_pid}/cmdline")
        or b"sh" not in Path(f"/proc/{state.task_pid}/cmdline").read_bytes()
    )


def test_raw_exec_destroy_kills_what_the_task_left_running(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    # The task forks a daemon in a new session (out of its process group) and exits: the cgroup still holds it.
    task = alloc.task_config("web", driver_config=sh("setsid sleep 300 </dev/null >/dev/null 2>&1 & echo ready"))
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    cgroup = os.path.join(cgroup_mounts()["memory"], track.cgroup_parent, task_key_for(task.id), "task")
    procs = Path(cgroup, "cgroup.procs").read_text().split()
    assert procs, "the daemon should still be in the task's cgroup"
    harness.client.destroy_task(task.id)
    harness.forget(task.id)
    assert not track.leftovers()


def test_raw_exec_destroy_running_task_needs_force(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 120"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    with pytest.raises(PluginCallError) as err:
        harness.client.destroy_task(task.id, force=False)
    assert "is still running" in err.value.message
    harness.client.destroy_task(task.id, force=True)
    harness.forget(task.id)


def test_raw_exec_exec_runs_in_the_tasks_cgroup_with_its_env(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 120"), env={"GREETING": "hi"})
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    res = harness.client.exec_task(
        task.id, ["sh", "-c", 'echo "$GREETING from $PWD"; grep :memory: /proc/self/cgroup; exit 4'], timeout=30
    )
    assert res.result.exit_code == 4
    lines = res.stdout.decode().splitlines()
    assert lines[0] == f"hi from {alloc.path / 'web'}"
    assert lines[1].endswith(f"/{track.cgroup_parent}/{task_key_for(task.id)}/task")
    missing = harness.client.exec_task(task.id, ["/no/such/program"], timeout=30)
    assert missing.result.exit_code == 127 and b"/no/such/program" in missing.stderr


def test_raw_exec_exec_timeout_kills_the_command(harness: DriverHarness, alloc: AllocDir, track: Tracker) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 120"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    started = time.monotonic()
    res = harness.client.exec_task(task.id, ["sh", "-c", "echo begun; sleep 300 & wait"], timeout=1)
    assert time.monotonic() - started < 20
    assert res.stdout == b"begun\n" and res.result.signal == signal.SIGKILL
    cgroup = os.path.join(cgroup_mounts()["memory"], track.cgroup_parent, task_key_for(task.id), "task")
    cmdlines = [Path(f"/proc/{p}/cmdline").read_bytes() for p in Path(cgroup, "cgroup.procs").read_text().split()]
    assert not [c for c in cmdlines if b"300" in c], cmdlines


def test_raw_exec_streaming_exec_with_stdin(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 120"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    stream = harness.client.exec_task_streaming(
        task.id, ["sh", "-c", "read line; echo got:$line; echo err >&2; exit 3"], stdin=[b"hi\n"]
    )
    stdout, stderr, result = stream.collect()
    assert (stdout, stderr, result.exit_code) == (b"got:hi\n", b"err\n", 3)


def test_raw_exec_stats_from_the_cgroup(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; while :; do :; done"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=30)
    stream = harness.client.task_stats(task.id, interval=0.2)
    samples = [next(stream) for _ in range(3)]
    assert samples[-1].usage.memory.usage > 0
    assert samples[-1].usage.cpu.percent > 0
    harness.client.stop_task(task.id, timeout=1, signal="SIGKILL")
    harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert list(harness.client.task_stats(task.id, interval=0.1)) == []


def test_raw_exec_memory_limit_oom_kills_the_task(harness: DriverHarness, alloc: AllocDir) -> None:
    script = 'x=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa; while :; do x="$x$x"; done'
    task = alloc.task_config("web", driver_config=sh(script), resources=Resources(cpu_shares=100, memory_mb=16))
    harness.start(task)
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert result.oom_killed is True
    assert result.signal == signal.SIGKILL


def test_raw_exec_oom_score_adj_applies_and_negative_is_refused(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    task = alloc.task_config("web", driver_config=sh("cat /proc/self/oom_score_adj", oom_score_adj=500))
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    alloc.wait_for_output("web", b"500\n", timeout=10)
    bad = alloc.task_config("web", driver_config=sh("true", oom_score_adj=-5))
    with pytest.raises(PluginCallError) as err:
        harness.start(bad)
    harness.forget(bad.id)
    assert "oom_score_adj -5 must not be negative" in err.value.message


def test_raw_exec_denied_envvars_from_plugin_and_task(
    plugin_config: dict[str, Any], alloc: AllocDir, no_leaks: None
) -> None:
    config = {**plugin_config, "denied_envvars": ["SECRET_*"]}
    env = {"SECRET_TOKEN": "x", "SECRETS": "kept", "OTHER": "y", "PLAIN": "z"}
    with DriverHarness(PLUGIN, plugin_config=config) as h:
        task = alloc.task_config("web", driver_config=sh("env | sort; echo end", denied_envvars=["OTH*"]), env=env)
        h.start(task)
        assert h.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
        out = alloc.wait_for_output("web", b"end\n", timeout=10).decode().splitlines()
    assert "PLAIN=z" in out and "SECRETS=kept" in out
    assert not [line for line in out if line.startswith(("SECRET_TOKEN=", "OTHER="))]


def test_raw_exec_runs_as_the_task_user_who_can_write_its_dirs(harness: DriverHarness, alloc: AllocDir) -> None:
    script = (
        "id -u; id -g; echo a > local/a && echo b > secrets/b && echo c > tmp/c && echo d > ../alloc/data/d; echo end"
    )
    task = alloc.task_config("web", driver_config=sh(script), user="nobody")
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    nobody = pwd.getpwnam("nobody")
    out = alloc.wait_for_output("web", b"end\n", timeout=10)
    assert out == f"{nobody.pw_uid}\n{nobody.pw_gid}\nend\n".encode()
    assert (alloc.path / "web/local/a").stat().st_uid == nobody.pw_uid
    assert (alloc.path / "alloc/data/d").read_text() == "d\n"


def _refused(harness: DriverHarness, alloc: AllocDir, track: Tracker, **kwargs: Any) -> PluginCallError:
    task = alloc.task_config("web", **kwargs)
    with pytest.raises(PluginCallError) as err:
        harness.start(task)
    harness.forget(task.id)
    assert not track.leftovers()
    return err.value


@pytest.mark.parametrize(
    ("config", "user", "sentence"),
    [
        ({"denied_host_uids": "100-65534"}, "nobody", "(uid 65534) is not allowed on this client"),
        ({"denied_host_gids": "65534"}, "nobody", "(gid 65534) is in the plugin's denied_host_gids ('65534')"),
        # No user: the task would run as the plugin's own user, root, which "0" denies (as in Nomad).
        ({"denied_host_uids": "0,10-20"}, "", "running as user 'root' (uid 0) is not allowed on this client"),
    ],
)
def test_raw_exec_refuses_a_denied_user(
    plugin_config: dict[str, Any], alloc: AllocDir, track: Tracker, no_leaks: None,
    config: dict[str, str], user: str, sentence: str,
) -> None:  # fmt: skip
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, **config}) as h:
        err = _refused(h, alloc, track, driver_config=sh("touch /tmp/never"), user=user)
    assert sentence in err.message and err.code == "INVALID_ARGUMENT"


def test_raw_exec_bad_id_range_refuses_the_plugin_config(plugin_config: dict[str, Any], no_leaks: None) -> None:
    with pytest.raises(PluginCallError) as err:
        DriverHarness(PLUGIN, plugin_config={**plugin_config, "denied_host_uids": "20-10"})
    assert "denied_host_uids '20-10': in '20-10' the lower bound is greater than the upper" in err.value.message


def test_raw_exec_refuses_unknown_user_and_missing_command(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    err = _refused(harness, alloc, track, driver_config=sh("true"), user="no-such-user-here")
    assert "user 'no-such-user-here' does not exist on this host" in err.message
    err = _refused(harness, alloc, track, driver_config={"command": "/no/such/program"})
    assert "command '/no/such/program' was not found as an executable file" in err.message
    err = _refused(harness, alloc, track, driver_config=sh("true", work_dir="relative"))
    assert "work_dir 'relative' must be an absolute path" in err.message


def test_raw_exec_exec_failure_in_the_supervisor_fails_start_and_cleans_up(
    harness: DriverHarness, alloc: AllocDir, track: Tracker, tmp_path: Path
) -> None:
    # Executable by mode, but not a program the kernel can run.
    bogus = tmp_path / "not-a-program"
    bogus.write_bytes(b"\x00\x01\x02\x03")
    bogus.chmod(0o755)
    err = _refused(harness, alloc, track, driver_config={"command": str(bogus)})
    assert f"task 'web' could not be started: failed to run {bogus}: Exec format error" == err.message


def test_raw_exec_cgroup_v1_override_puts_the_task_in_that_cgroup(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    mounts = cgroup_mounts()
    if "pids" not in mounts or os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        pytest.skip("needs a cgroup v1 pids hierarchy")
    custom = f"{track.cgroup_parent}-custom"
    path = Path(mounts["pids"], custom)
    path.mkdir()
    try:
        task = alloc.task_config("web", driver_config=sh("cat /proc/self/cgroup", cgroup_v1_override={"pids": custom}))
        harness.start(task)
        assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
        out = alloc.wait_for_output("web", b":memory:", timeout=10).decode()
        pids = [line for line in out.splitlines() if ":pids:" in line]
        assert pids and pids[0].endswith(f":pids:/{custom}"), out
        harness.client.destroy_task(task.id)
        harness.forget(task.id)
        assert path.is_dir(), "the driver must never remove an override cgroup"
        missing = alloc.task_config("web", driver_config=sh("true", cgroup_v1_override={"pids": "no/such/group"}))
        err = _refused(harness, alloc, track, **{"driver_config": missing.driver_config})
        assert "is not an existing cgroup; create it first" in err.message
        v2 = _refused(harness, alloc, track, driver_config=sh("true", cgroup_v2_override="custom"))
        assert "cgroup_v2_override is set but this client runs cgroup v1" in v2.message
    finally:
        path.rmdir()


def test_raw_exec_group_network_namespace_is_entered(harness: DriverHarness, alloc: AllocDir, tmp_path: Path) -> None:
    import subprocess

    from driversdk.model import NetworkIsolationSpec

    name = f"dsrt-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        ns = f"/var/run/netns/{name}"
        spec = NetworkIsolationSpec(mode=NetworkIsolationMode.GROUP, path=ns)
        task = alloc.task_config("web", driver_config=sh("readlink /proc/self/ns/net"), network=spec)
        harness.start(task)
        assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
        out = alloc.wait_for_output("web", b"]\n", timeout=10).decode().strip()
        assert out == f"net:[{os.stat(ns).st_ino}]"
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def test_raw_exec_conformance_kit_finds_every_claim_true(harness: DriverHarness, tmp_path: Path) -> None:
    from driversdk.testing.conformance import run_conformance

    def raw_task(argv: Sequence[str]) -> Mapping[str, Any]:
        return {"command": argv[0], "args": list(argv[1:])}

    results = run_conformance(harness, raw_task, str(tmp_path / "conformance"), timeout=TIMEOUT)
    failed = [str(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)
