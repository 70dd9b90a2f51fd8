"""A CSI plugin that hangs or fails must not hold ``driversdk run`` hostage, and a plugin task
that is gone must not be handed to the next claim.

Real runs through the CLI, a real reference plugin process with injected faults (the plugin's
``CSI_HOSTPATH_FAULTS``), real mounts checked in /proc/self/mountinfo. Each test bounds its waits
(a hang fails the test instead of blocking it); none asserts a duration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from driversdk.agent.csi.registry import PluginRegistration, PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.agent.csi.volumes import PAST_STATES, VolumeStore
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.mountinfo import read_mountinfo
from tests.agent.csienv import HELLO, Env, app_group, demo, wait_for_line, write_job
from tests.agent.csienv import plugin_group as _plugin_group
from tests.hostcheck import processes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="CSI runs mount and run runc: root only")

EXIT_WAIT = 60  # a run that has not ended by then hangs


@pytest.fixture
def env(engine: docker.DockerClient, short_dir: Path, kill_orphans_if_failed: None) -> Env:
    (short_dir / "backing" / "volumes").mkdir(parents=True)
    # The plugin mounts: its task runs as root, which the exec driver allows only when told.
    demo.client_config(
        short_dir,
        docker_extra='infra_image = "driversdk-test/pause:local"',
        exec_extra=f'state_dir = "{short_dir / "exec-state"}"\ndenied_host_uids = ""\ndenied_host_gids = ""',
        extra=f'plugin "hello" {{\n  command = ["{sys.executable}", "{HELLO}"]\n}}',
    )
    return Env(short_dir, engine)


def plugin_group(env: str = "") -> str:
    group = _plugin_group(env=env)
    if "user" not in group:
        group = group.replace('driver = "exec"', 'driver = "exec"\n      user   = "root"', 1)
    return group


def _mounts(env: Env) -> list[str]:
    return [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(env.work))]


def _calls(env: Env, rpc: str) -> int:
    """How often the running plugin was asked ``rpc`` (its GetPluginInfo manifest counts them)."""
    for reg in env.registrations():
        try:
            client = CSIClient(reg.socket_path, plugin="hostpath")
        except CSIError:
            continue
        try:
            return int(client.plugin_info().manifest.get(f"calls.{rpc}", "0"))
        finally:
            client.close()
    return 0


def _wait_for_call(env: Env, proc: subprocess.Popen[str], rpc: str) -> None:
    deadline = time.monotonic() + 120
    while _calls(env, rpc) == 0:
        assert proc.poll() is None, "the run ended before the plugin was asked " + rpc
        assert time.monotonic() < deadline, f"{rpc} never reached the plugin"
        time.sleep(0.2)


def _finish(proc: subprocess.Popen[str], timeout: float = EXIT_WAIT) -> tuple[str, str]:
    """The run's output once it has exited; a run still going after ``timeout`` is killed and fails."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"the run did not exit:\n{out}\n{err}") from None


def _unmount_left(env: Env) -> None:
    for point in sorted(_mounts(env), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _plugin_pids(env: Env) -> list[int]:
    """The reference plugin processes of this test: their task's mounts come from the work dir
    (their command line names nothing of it)."""
    pids = []
    for line in processes("driversdk.csi.hostpath"):
        pid = int(line.split(":")[0])
        try:
            if str(env.work) in Path(f"/proc/{pid}/mountinfo").read_text():
                pids.append(pid)
        except OSError:
            continue
    return pids


def _plugins_left(env: Env) -> list[int]:
    """This test's plugin processes still there once a bounded wait for them to be reaped is over
    (the run has stopped the task; under load the runtime reaps it a moment later)."""
    deadline = time.monotonic() + 15
    while (left := _plugin_pids(env)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _delete_left_containers(env: Env) -> None:
    """The runc containers of this test's exec tasks that no run is left to destroy (the killed
    run's plugin task: a later exec plugin's reconciler would remove it after its grace)."""
    listing = subprocess.run(["runc", "list", "--format", "json"], capture_output=True, text=True, check=False)
    for item in json.loads(listing.stdout or "null") or []:
        if str(item.get("bundle", "")).startswith(f"{env.work}/"):
            subprocess.run(["runc", "delete", "--force", str(item["id"])], capture_output=True, check=False)


def _node_instances(env: Env) -> list[PluginRegistration]:
    """Every registered node instance of the hostpath plugin, newest first."""
    store = StateStore(env.db)
    try:
        return PluginRegistry(store).instances("csi-node", "hostpath")
    finally:
        store.close()


def _in_alloc(pid: int, alloc_id: str) -> bool:
    """Whether the task process ``pid`` belongs to that allocation (NOMAD_ALLOC_ID in its environment)."""
    try:
        return f"NOMAD_ALLOC_ID={alloc_id}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (a run's driver plugin, runc, its task)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _claim_states(env: Env) -> list[str]:
    store = VolumeStore(env.db)
    try:
        return [c.state for c in store.claims("vol")]
    finally:
        store.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_interrupt_cancels_a_hung_node_publish_and_tears_down(env: Env, sig: signal.Signals) -> None:
    env.register()
    job = write_job(env, "hung", plugin_group(env='CSI_HOSTPATH_FAULTS = "NodePublishVolume=hang"'), app_group("true"))
    proc = env.start(job)
    try:
        _wait_for_call(env, proc, "NodePublishVolume")
        proc.send_signal(sig)
        out, err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    assert "interrupted" in out + err, out + err
    assert "Traceback" not in out + err
    # The interrupted call's own error (cancelled, deadline) is not what the operator reads.
    assert "CANCELLED" not in out + err and "DEADLINE_EXCEEDED" not in out + err, out + err
    assert _mounts(env) == [], "the stage made for the mount is undone"
    assert env.claims() == [], "the plugin answers teardown calls: the claim is released"
    assert _plugins_left(env) == [], "the plugin task is stopped"
    env.assert_clean()


@pytest.mark.timeout(180)
def test_second_interrupt_gives_up_a_hung_teardown_and_keeps_the_claim(env: Env) -> None:
    env.register()
    faults = "NodePublishVolume=hang,NodeUnstageVolume=hang"
    job = write_job(env, "twice", plugin_group(env=f'CSI_HOSTPATH_FAULTS = "{faults}"'), app_group("true"))
    proc = env.start(job)
    try:
        _wait_for_call(env, proc, "NodePublishVolume")
        proc.send_signal(signal.SIGINT)
        _wait_for_call(env, proc, "NodeUnstageVolume")  # the teardown is under way, and hangs
        proc.send_signal(signal.SIGINT)
        out, err = _finish(proc)
        assert proc.returncode == 1, out + err
        assert "Traceback" not in out + err
        assert "interrupted again: giving up the CSI volume teardown" in out, out
        assert "`driversdk volume detach vol` releases it once the plugin answers" in out, out
        states = _claim_states(env)
        assert len(states) == 1 and states[0] in PAST_STATES, states
        assert _plugins_left(env) == [], "the plugin task is stopped all the same"
    finally:
        if proc.poll() is None:
            proc.kill()
        _unmount_left(env)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "fault", ["INTERNAL:100000", "UNAVAILABLE:100000", "hang"], ids=["fatal", "retryable", "never-answers"]
)
def test_failing_node_unstage_ends_the_run_and_keeps_the_claim(env: Env, fault: str) -> None:
    env.register()
    job = write_job(
        env,
        "unstage",
        plugin_group(env=f'CSI_HOSTPATH_FAULTS = "NodeUnstageVolume={fault}"'),
        app_group("echo wrote > /data/out"),
    )
    proc = env.start(job)
    try:
        out, err = _finish(proc, timeout=150)
        assert "Traceback" not in out + err
        assert "NodeUnstageVolume" in out, out
        assert "the claim is kept as a past claim, released by the volume watcher" in out, out
        states = _claim_states(env)
        assert len(states) == 1 and states[0] in PAST_STATES, states
        assert processes(str(env.work)) == [], "the plugin task and the log monitors are gone"
    finally:
        if proc.poll() is None:
            proc.kill()
        _unmount_left(env)


@pytest.mark.timeout(240)
def test_plugin_instance_killed_with_its_run_is_not_handed_to_the_next_run(env: Env) -> None:
    env.register()
    older = env.start(write_job(env, "older", plugin_group()))
    newer: subprocess.Popen[str] | None = None
    leftovers: list[int] = []
    newer_left: set[int] = set()
    dead_alloc = ""
    try:
        wait_for_line(older, '==> task "plugin": Plugin became healthy')
        newer = env.start(write_job(env, "newer", plugin_group()))
        wait_for_line(newer, '==> task "plugin": Plugin became healthy')
        # As in Nomad, the healthy event comes before the instance is registered: wait for it.
        deadline = time.monotonic() + EXIT_WAIT
        while len(_node_instances(env)) < 2:
            assert time.monotonic() < deadline, "the newer instance was never registered"
            time.sleep(0.05)
        [dead] = [r for r in env.registrations() if r.type == "csi-node"]  # the newest is the one in use
        dead_alloc = dead.alloc_id
        newer_left = _descendants(newer.pid)  # its plugins: no later run of its job takes them over
        # The newer instance's process: its task runs under the exec state dir's shared supervisor
        # (not below the newer run), and carries its allocation's id in its environment.
        [pid] = [p for p in _plugin_pids(env) if _in_alloc(p, dead.alloc_id)]
        # The newer run is killed (as during its teardown), then its plugin task dies: nothing
        # deregisters the instance, whose socket no longer answers.
        newer.kill()
        newer.communicate(timeout=30)
        os.kill(pid, signal.SIGKILL)
        leftovers = [int(line.split(":")[0]) for line in processes(dead.alloc_id)]
        app = write_job(env, "app", app_group("echo used", propagation="private"))
        done = env.cli("run", str(app), "--client", str(env.client), timeout=EXIT_WAIT * 3)
        assert done.returncode == 0, done.stdout + done.stderr
        assert dead.socket_path not in done.stdout + done.stderr
        assert '==> volume "data": CSI volume "vol" unmounted and released' in done.stdout
        assert env.claims() == []
        older.send_signal(signal.SIGINT)
        _finish(older)
    finally:
        for proc in (older, newer):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.communicate(timeout=EXIT_WAIT)
                except subprocess.TimeoutExpired:
                    proc.kill()
        left = [int(line.split(":")[0]) for line in processes(dead_alloc)] if dead_alloc else []
        # The data dir's log collector serves the killed run's tasks on (no later run of its job
        # recovers them here), as the run's own collector did when each task had one.
        left += [int(line.split(":")[0]) for line in processes(str(env.data / "logmon.sock"))]
        for pid in leftovers + _plugin_pids(env) + left + sorted(newer_left):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _unmount_left(env)
        _delete_left_containers(env)
