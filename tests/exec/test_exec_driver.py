"""Exec driver through the harness: a real plugin subprocess running tasks with real runc."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from drivers.exec.driver import container_id_for
from drivers.exec.runc import Runc
from drivers.exec.store import DriverState
from driversdk.errors import PluginCallError
from driversdk.model import (
    Device,
    DNSConfig,
    FSIsolation,
    HealthState,
    LinuxResources,
    MountConfigSupport,
    NetworkIsolationMode,
    Resources,
    TaskState,
)
from driversdk.mounts import Mount, Propagation
from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import PLUGIN, ROOT_ALLOWED, Tracker, sh

pytestmark = pytest.mark.root

TIMEOUT = 60


def test_exec_capabilities_follow_the_knob(harness: DriverHarness, plugin_config: dict[str, Any]) -> None:
    caps = harness.client.capabilities()
    assert caps.send_signals and caps.exec
    assert caps.fs_isolation == FSIsolation.CHROOT
    assert set(caps.network_isolation_modes) == {NetworkIsolationMode.HOST, NetworkIsolationMode.GROUP}
    assert caps.mount_configs == MountConfigSupport.ALL
    assert caps.disable_log_collection is False
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, "disable_log_collection": True}) as h:
        assert h.client.capabilities().disable_log_collection is True


def test_exec_fingerprint_healthy_with_runtime_version(harness: DriverHarness) -> None:
    fp = next(iter(harness.client.fingerprint()))
    assert fp.health == HealthState.HEALTHY, fp.health_description
    assert fp.health_description == "Healthy"
    attrs = {k: getattr(v, "value", v) for k, v in fp.attributes.items()}
    assert attrs["driver.exec.runtime"] == "runc"
    assert str(attrs["driver.exec.runtime.version"]).startswith("1.")
    assert "driver.exec" not in attrs


def test_exec_fingerprint_undetected_without_runc(plugin_config: dict[str, Any], no_leaks: None) -> None:
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, "runtime_path": "/nonexistent/runc"}) as h:
        fp = next(iter(h.client.fingerprint()))
        assert fp.health == HealthState.UNDETECTED
        assert "/nonexistent/runc" in fp.health_description


def test_exec_basic_exit_code_and_logs(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config(
        "web", driver_config=sh('echo "hello $NOMAD_TASK_NAME from $(pwd)"; echo oops >&2; exit 3', work_dir="/local")
    )
    handle = harness.start(task)
    assert handle.state == TaskState.RUNNING and handle.driver_state
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert (result.exit_code, result.signal, result.oom_killed) == (3, 0, False)
    assert alloc.wait_for_output("web", b"hello web from /local\n", timeout=10)
    assert alloc.wait_for_output("web", b"oops\n", timeout=10, stderr=True)
    status = harness.client.inspect_task(task.id)
    assert status.state == TaskState.EXITED and status.result is not None and status.result.exit_code == 3
    assert status.started_at is not None and status.completed_at is not None
    assert status.completed_at >= status.started_at
    harness.client.destroy_task(task.id)
    harness.forget(task.id)
    with pytest.raises(PluginCallError) as err:
        harness.client.inspect_task(task.id)
    assert err.value.code == "NOT_FOUND"


def test_exec_chroot_is_read_only_with_writable_task_dirs(harness: DriverHarness, alloc: AllocDir) -> None:
    script = (
        "touch /usr/probe 2>/dev/null && echo usr-writable; "
        "echo a > /alloc/data/a && echo b > /local/b && echo c > /secrets/c && echo ok; "
        "test -x /bin/busybox && echo busybox; cat /proc/1/cmdline | tr '\\0' ' '; echo"
    )
    task = alloc.task_config("web", driver_config=sh(script))
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    out = alloc.wait_for_output("web", b"busybox\n", timeout=10)
    lines = out.split(b"\n")
    assert lines[:2] == [b"ok", b"busybox"], out
    # pid namespace: the task's command is pid 1.
    assert b"/bin/busybox sh -c" in out
    assert (alloc.path / "alloc/data/a").read_text() == "a\n"
    assert (alloc.path / "web/local/b").read_text() == "b\n"


def test_exec_inspect_running_has_both_timestamps(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("sleep 60"))
    harness.start(task)
    status = harness.client.inspect_task(task.id)
    assert status.state == TaskState.RUNNING
    assert status.started_at is not None
    harness.client.stop_task(task.id, timeout=0.5, signal="SIGTERM")
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    # sh as pid 1 of its namespace ignores SIGTERM: stop had to kill it.
    assert result.signal == signal.SIGKILL


def test_exec_stop_with_signal_the_task_handles(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("trap 'echo got-term; exit 7' TERM; echo ready; sleep 60 & wait"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=30)
    started = time.monotonic()
    harness.client.stop_task(task.id, timeout=30, signal="SIGTERM")
    assert time.monotonic() - started < 25
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert result.exit_code == 7 and result.signal == 0
    assert b"got-term" in alloc.wait_for_output("web", b"got-term", timeout=10)


def test_exec_default_stop_signal_is_sigint_and_reaches_the_task(harness: DriverHarness, alloc: AllocDir) -> None:
    # A SIG_IGN inherited from the plugin would make this task immune to SIGINT.
    task = alloc.task_config("web", driver_config=sh("trap 'exit 5' INT; echo ready; sleep 60 & wait"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=30)
    harness.client.stop_task(task.id, timeout=30, signal="")
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 5


def test_exec_signal_task(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config(
        "web", driver_config=sh("trap 'echo got-usr1' USR1; echo ready; while true; do sleep 0.1; done")
    )
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=30)
    harness.client.signal_task(task.id, "SIGUSR1")
    alloc.wait_for_output("web", b"got-usr1\n", timeout=30)
    with pytest.raises(PluginCallError) as err:
        harness.client.signal_task(task.id, "SIGBOGUS")
    assert err.value.message == "failed to parse signal: unknown signal 'SIGBOGUS'; use a name such as SIGTERM"
    # The SDK's parser answers as this driver always did: INTERNAL, not recoverable.
    assert err.value.code == "INTERNAL" and not err.value.recoverable
    harness.client.signal_task(task.id, "usr1")
    alloc.wait_for_output("web", b"got-usr1\ngot-usr1\n", timeout=30)


def test_exec_exec_inside_task_namespaces(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("echo $$ > /local/pid; sleep 60"))
    harness.start(task)
    deadline = time.monotonic() + 30
    while not (alloc.path / "web/local/pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    res = harness.client.exec_task(
        task.id, ["/bin/busybox", "sh", "-c", "cat /local/pid; hostname; exit 4"], timeout=30
    )
    assert res.result.exit_code == 4
    pid, hostname = res.stdout.decode().split()
    # Same pid namespace (the task is pid 1 there) and the task's uts namespace.
    assert pid == "1" and hostname == "web"


def test_exec_stats_from_cgroup(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; while true; do :; done"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=30)
    stream = harness.client.task_stats(task.id, interval=0.2)
    samples = [next(stream) for _ in range(3)]
    last = samples[-1]
    assert last.usage.memory.usage > 0
    assert last.usage.cpu.percent > 0
    harness.client.stop_task(task.id, timeout=1, signal="SIGKILL")


def test_exec_memory_limit_kills_allocator_with_oom(harness: DriverHarness, alloc: AllocDir) -> None:
    # The shell builds an ever-growing string in memory until the 16 MiB limit kills it.
    script = 'x=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa; while true; do x="$x$x"; done'
    task = alloc.task_config("web", driver_config=sh(script), resources=Resources(cpu_shares=100, memory_mb=16))
    harness.start(task)
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert result.oom_killed is True
    assert result.signal == signal.SIGKILL


def test_exec_cpu_limits_reach_the_cgroup(harness: DriverHarness, alloc: AllocDir, track: Tracker) -> None:
    resources = Resources(cpu_shares=300, memory_mb=32, linux=LinuxResources(cpu_quota=50000, cpu_period=100000))
    task = alloc.task_config("web", driver_config=sh("sleep 60"), resources=resources)
    harness.start(task)
    rel = f"{track.cgroup_parent}/{container_id_for(task.id)}"
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        assert (base / rel / "cpu.max").read_text().split() == ["50000", "100000"]
        assert int((base / rel / "memory.max").read_text()) == 32 * 1024 * 1024
    else:
        assert int((base / "cpu" / rel / "cpu.shares").read_text()) == 300
        assert int((base / "cpu" / rel / "cpu.cfs_quota_us").read_text()) == 50000
        assert int((base / "memory" / rel / "memory.limit_in_bytes").read_text()) == 32 * 1024 * 1024
    harness.client.stop_task(task.id, timeout=1, signal="SIGKILL")


def test_exec_disable_log_collection_never_opens_fifos(
    plugin_config: dict[str, Any], tmp_path: Path, no_leaks: None
) -> None:
    alloc = AllocDir.create(tmp_path / "allocs", tasks=[])
    alloc.add_task("web", log_collection=False)
    task = alloc.task_config("web", driver_config=sh("echo quiet; exit 0"))
    assert not os.path.exists(task.stdout_path)
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, "disable_log_collection": True}) as h:
        h.start(task)
        assert h.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    assert not os.path.exists(task.stdout_path)


# --- failure paths: each refused before anything is created, nothing left behind -------------


def _refused(harness: DriverHarness, alloc: AllocDir, track: Tracker, **kwargs: Any) -> PluginCallError:
    task = alloc.task_config("web", **kwargs)
    with pytest.raises(PluginCallError) as err:
        harness.start(task)
    harness.forget(task.id)
    assert not track.leftovers()
    return err.value


def test_exec_refuses_cap_add_outside_allow_caps(harness: DriverHarness, alloc: AllocDir, track: Tracker) -> None:
    err = _refused(harness, alloc, track, driver_config=sh("true", cap_add=["sys_admin", "net_raw"]))
    assert "driver does not allow the following capabilities: net_raw, sys_admin" in err.message
    assert err.code == "INVALID_ARGUMENT"


def test_exec_refuses_bidirectional_read_only(
    harness: DriverHarness, alloc: AllocDir, tmp_path: Path, shared_dir: Path, track: Tracker
) -> None:
    mount = Mount("/data", str(shared_dir), readonly=True, propagation=Propagation.BIDIRECTIONAL, request_name="vol")
    err = _refused(harness, alloc, track, driver_config=sh("true"), mounts=[mount])
    assert 'task "web" volume "vol": propagation_mode "bidirectional" needs a read-write mount' in err.message


def test_exec_refuses_host_to_task_on_private_source(
    harness: DriverHarness, alloc: AllocDir, tmp_path: Path, track: Tracker
) -> None:
    source = tmp_path / "private-src"
    source.mkdir()
    mount = Mount("/data", str(source), propagation=Propagation.HOST_TO_TASK, request_name="vol")
    err = _refused(harness, alloc, track, driver_config=sh("true"), mounts=[mount])
    assert (
        "needs the host source" in err.message
        and f"mount --bind {source} {source} && mount --make-shared {source}" in err.message
    )


def test_exec_refuses_unknown_user(harness: DriverHarness, alloc: AllocDir, track: Tracker) -> None:
    err = _refused(harness, alloc, track, driver_config=sh("true"), user="no-such-user-here")
    assert "user 'no-such-user-here' does not exist on this host" in err.message


def test_exec_refuses_bad_pid_mode(harness: DriverHarness, alloc: AllocDir, track: Tracker) -> None:
    err = _refused(harness, alloc, track, driver_config=sh("true", pid_mode="container"))
    assert "pid_mode 'container' is not valid" in err.message


def test_exec_fifo_without_reader_fails_start_and_cleans_up(
    harness: DriverHarness, tmp_path: Path, plugin_config: dict[str, Any], track: Tracker
) -> None:
    alloc = AllocDir.create(tmp_path / "allocs", tasks=[])
    alloc.add_task("web", log_collection=False)
    task = alloc.task_config("web", driver_config=sh("true"))
    os.mkfifo(task.stdout_path)  # a fifo nobody reads
    os.mkfifo(task.stderr_path)
    with pytest.raises(PluginCallError) as err:
        harness.start(task)
    harness.forget(task.id)
    assert "has no reader" in err.value.message and err.value.recoverable
    assert not track.leftovers()


def test_exec_user_runs_with_that_uid(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("id -u; id -g"), user="nobody")
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    out = alloc.wait_for_output("web", b"\n65534\n", timeout=10)
    assert out.startswith(b"65534\n")


def _proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def test_exec_supervisor_and_task_have_clean_stdio_and_signals(harness: DriverHarness, alloc: AllocDir) -> None:
    # The program itself (not a shell, which ignores some signals on its own) is the task.
    task = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["120"]})
    handle = harness.start(task)
    state = DriverState.decode(handle.driver_state, handle.version)
    deadline = time.monotonic() + TIMEOUT
    while (runc_state := Runc().state(state.container_id)) is None or runc_state["status"] != "running":
        assert time.monotonic() < deadline, "the container never reached running"
        time.sleep(0.05)
    task_pid = int(runc_state["pid"])
    # The shared supervisor has its stdio on /dev/null; the task (runc handed it its own stdio
    # and exited) has stdin /dev/null and stdout/stderr on its fifos: never the plugin's
    # handshake pipe or stderr.
    sup = state.supervisor_pid
    assert state.task_pid == task_pid
    assert {os.readlink(f"/proc/{sup}/fd/{fd}") for fd in (0, 1, 2)} == {"/dev/null"}
    assert os.readlink(f"/proc/{task_pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{task_pid}/fd/1") == task.stdout_path
    assert os.readlink(f"/proc/{task_pid}/fd/2") == task.stderr_path
    plugin_pid = harness.client.process.pid
    plugin_stdio = {os.readlink(f"/proc/{plugin_pid}/fd/{fd}") for fd in (0, 1, 2)}
    task_stdio = {os.readlink(f"/proc/{task_pid}/fd/{fd}") for fd in (0, 1, 2)}
    assert not (plugin_stdio - {"/dev/null"}) & task_stdio
    parent = int(Path(f"/proc/{task_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert parent == sup  # no runc process stays: the container's init is the supervisor's child
    for pid in (sup, task_pid):
        status = _proc_status(pid)
        # Nothing ignored or blocked is inherited from the plugin (a SIG_IGN'd SIGINT would make
        # the task unstoppable by the default stop signal).
        assert int(status["SigBlk"], 16) == 0
        # Bits for signals 1-31 only: glibc's posix_spawn leaves its two reserved internal signals
        # (32, 33; never used by programs, SIGRTMIN is 34) ignored in the child. The supervisor
        # ignores, on purpose, only the signals meant for its task's group or a hung-up terminal,
        # and SIGXFSZ, as every Python program does; the task starts with none ignored.
        ignored = int(status["SigIgn"], 16) & 0x7FFFFFFF
        kept = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ)
        deliberate = sum(1 << (s - 1) for s in kept)
        assert ignored == (deliberate if pid == sup else 0), status["SigIgn"]
    # The supervisor leads its own session, so the host's terminal signals never reach it.
    assert os.getsid(state.supervisor_pid) == state.supervisor_pid


def test_exec_pid_mode_host_shares_the_host_pid_namespace(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("echo pid=$$", pid_mode="host", ipc_mode="host"))
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    out = alloc.wait_for_output("web", b"pid=", timeout=10)
    assert b"pid=1\n" not in out


def test_exec_missing_command_fails_the_task_and_destroy_cleans_up(
    harness: DriverHarness, alloc: AllocDir, tmp_path: Path, track: Tracker
) -> None:
    task = alloc.task_config("web", driver_config={"command": "/no/such/program"})
    harness.start(task)
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert result.exit_code != 0 and not result.oom_killed
    assert b"/no/such/program" in alloc.wait_for_output("web", b"/no/such/program", timeout=10, stderr=True)
    harness.client.destroy_task(task.id)
    harness.forget(task.id)
    assert not track.leftovers()


def test_exec_streaming_exec_with_stdin(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 120"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    stream = harness.client.exec_task_streaming(
        task.id, ["/bin/busybox", "sh", "-c", "read line; echo got:$line; echo err >&2; exit 3"], stdin=[b"hi\n"]
    )
    stdout, stderr, result = stream.collect()
    assert stdout == b"got:hi\n" and stderr == b"err\n" and result.exit_code == 3


def test_exec_destroy_running_task_needs_force(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 120"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    with pytest.raises(PluginCallError) as err:
        harness.client.destroy_task(task.id, force=False)
    assert "is still running" in err.value.message
    harness.client.destroy_task(task.id, force=True)
    harness.forget(task.id)
    with pytest.raises(PluginCallError) as gone:
        harness.client.inspect_task(task.id)
    assert gone.value.code == "NOT_FOUND"


def test_exec_bad_plugin_config_is_refused(plugin_config: dict[str, Any], no_leaks: None) -> None:
    with pytest.raises(PluginCallError) as err:
        DriverHarness(PLUGIN, plugin_config={**plugin_config, "bridge_subnet": "10.0.0.0/31"})
    assert "bridge_subnet '10.0.0.0/31' is too small" in err.value.message


def test_exec_stats_stream_ends_after_exit(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("exit 0"))
    harness.start(task)
    harness.client.wait_task(task.id, timeout=TIMEOUT)
    assert list(harness.client.task_stats(task.id, interval=0.1)) == []


def test_exec_exec_timeout_kills_the_command_inside_the_task(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 120"))
    harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    started = time.monotonic()
    res = harness.client.exec_task(task.id, ["/bin/busybox", "sh", "-c", "echo begun; exec sleep 300"], timeout=1)
    assert time.monotonic() - started < 30
    assert res.stdout == b"begun\n"
    assert res.result.signal == signal.SIGKILL
    # Nothing of the exec is left running in the task: only its own shell and sleep.
    ps = harness.client.exec_task(task.id, ["/bin/busybox", "ps", "-o", "args"], timeout=30)
    assert b"sleep 300" not in ps.stdout, ps.stdout


def test_exec_many_tasks_at_once(harness: DriverHarness, alloc: AllocDir) -> None:
    # Each task holds a WaitTask call in the plugin: a small gRPC pool would deadlock here.
    from concurrent.futures import ThreadPoolExecutor

    tasks = [alloc.task_config(f"t{i}", driver_config=sh(f"sleep 1; exit {i}")) for i in range(6)]
    for task in tasks:
        harness.start(task)
    with ThreadPoolExecutor(len(tasks)) as pool:
        codes = list(pool.map(lambda t: harness.client.wait_task(t.id, timeout=TIMEOUT).exit_code, tasks))
    assert codes == list(range(6))


def test_exec_devices_with_cgroup_permissions(plugin_config: dict[str, Any], alloc: AllocDir, no_leaks: None) -> None:
    # cpu_dma_latency: inert, and not among runc's always-allowed devices (null, zero, tty, ...),
    # so the "r" permission alone decides what the task may do with it. The node keeps the
    # host's owner and mode (root, 0600): only a root task (allowed by the operator) opens it.
    script = "head -c 4 /dev/lat | wc -c; echo x > /dev/lat 2>/dev/null && echo writable || echo denied; echo end"
    task = alloc.task_config("web", driver_config=sh(script), user="root")
    task.devices = [Device(task_path="/dev/lat", host_path="/dev/cpu_dma_latency", cgroup_permissions="r")]
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, **ROOT_ALLOWED}) as h:
        h.start(task)
        assert h.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
        out = alloc.wait_for_output("web", b"end\n", timeout=10)
    assert out.split() == [b"4", b"denied", b"end"]


def test_exec_refuses_device_that_is_not_a_device(harness: DriverHarness, alloc: AllocDir, track: Tracker) -> None:
    task = alloc.task_config("web", driver_config=sh("true"))
    task.devices = [Device(task_path="/dev/x", host_path="/etc/hostname")]
    with pytest.raises(PluginCallError) as err:
        harness.start(task)
    harness.forget(task.id)
    assert "'/etc/hostname' is not a character or block device" in err.value.message
    assert not track.leftovers()


def test_exec_dns_config_becomes_the_tasks_resolv_conf(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("cat /etc/resolv.conf"))
    task.dns = DNSConfig(servers=("10.231.77.53",), searches=("svc.example",), options=("ndots:2",))
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    out = alloc.wait_for_output("web", b"ndots:2\n", timeout=10)
    assert out == b"nameserver 10.231.77.53\nsearch svc.example\noptions ndots:2\n"


def test_exec_conformance_kit_finds_every_claim_true(harness: DriverHarness, tmp_path: Path) -> None:
    from driversdk.testing.conformance import run_conformance

    def exec_task(argv: Sequence[str]) -> Mapping[str, Any]:
        return {"command": argv[0], "args": list(argv[1:])}

    results = run_conformance(harness, exec_task, str(tmp_path / "conformance"), timeout=TIMEOUT)
    failed = [str(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)
