"""A plugin killed mid-StartTask (or mid-CreateNetwork) leaves nothing for long: a later plugin's
reconciler removes it, while tasks a live plugin owns and started tasks the host will recover stay."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from drivers.exec import owner
from drivers.exec.config import PluginConfig
from drivers.exec.driver import container_id_for
from drivers.exec.network import netns_name, netns_path
from drivers.exec.owner import ProcessIdentity, TaskRecord
from drivers.exec.store import DriverState
from driversdk.errors import ConfigError, PluginCallError
from driversdk.model import TaskState
from driversdk.taskkit.cgroups import TaskCgroup
from driversdk.taskkit.owner import is_orphan
from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import PLUGIN, Tracker, sh

TIMEOUT = 60
PERIOD, GRACE = 0.5, 2.0
# A pass runs at plugin start and then every PERIOD; an orphan is removed once GRACE has passed.
BOUND = GRACE + 4 * PERIOD + 10


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: the pid names no process now (until the kernel reuses it)
    return proc.pid


def _wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout:.0f}s"
        time.sleep(0.05)


def _record(track: Tracker, task_id: str) -> TaskRecord:
    path = owner.record_path(str(track.base / "state" / "tasks" / container_id_for(task_id)))
    record = owner.load(path)
    assert record is not None, f"no record at {path}"
    return record


# --- units ------------------------------------------------------------------------------------


def test_exec_process_identity_tells_live_from_dead_and_reused() -> None:
    me = ProcessIdentity.current()
    assert me.alive()
    assert not ProcessIdentity(me.pid, me.start_time + 1).alive()  # the same pid, another process
    assert not ProcessIdentity(_dead_pid(), me.start_time).alive()


def _rec(phase: Any, owner_identity: ProcessIdentity, since: float) -> TaskRecord:
    return TaskRecord(phase, owner_identity.pid, owner_identity.start_time, since, False, "p",
                      "dsx-1", "/s/tasks/dsx-1", "runc")  # fmt: skip


def test_exec_orphan_needs_dead_owner_grace_and_no_handle() -> None:
    dead = ProcessIdentity(_dead_pid(), 1)
    live = ProcessIdentity.current()
    now = time.time()
    old, young = now - 600, now - 1

    def orphan(record: TaskRecord, tracked: frozenset[str] = frozenset()) -> bool:
        return is_orphan(record, tracked=set(tracked), grace=300, now=now)

    assert orphan(_rec("starting", dead, old))
    assert orphan(_rec("destroying", dead, old))
    assert not orphan(_rec("starting", dead, young))  # within the creation grace
    assert not orphan(_rec("starting", live, old))  # its plugin is still building it
    assert not orphan(_rec("starting", dead, old), frozenset({"dsx-1"}))  # this plugin tracks it
    # The host got a handle: RecoverTask or DestroyTask decides, however long ago its plugin died.
    assert not orphan(_rec("started", dead, old))


def test_exec_reconcile_config_defaults_and_durations() -> None:
    default = PluginConfig.from_decoded({})
    assert (default.reconcile_enabled, default.reconcile_period, default.reconcile_creation_grace) == (True, 300, 300)
    cfg = PluginConfig.from_decoded({"reconcile": {"enabled": True, "period": "1m30s", "creation_grace": "500ms"}})
    assert (cfg.reconcile_period, cfg.reconcile_creation_grace) == (90, 0.5)
    assert not PluginConfig.from_decoded({"reconcile": {"enabled": False}}).reconcile_enabled
    with pytest.raises(ConfigError, match=r"reconcile.period '5 minutes' is not a duration"):
        PluginConfig.from_decoded({"reconcile": {"period": "5 minutes"}})
    with pytest.raises(ConfigError, match="must be longer than 0s"):
        PluginConfig.from_decoded({"reconcile": {"period": "0s"}})


# --- with runc, through a plugin subprocess -----------------------------------------------------


@pytest.fixture
def quick_config(plugin_config: dict[str, Any]) -> dict[str, Any]:
    return {**plugin_config, "reconcile": {"period": f"{int(PERIOD * 1000)}ms", "creation_grace": f"{GRACE:g}s"}}


@pytest.fixture
def quick_harness(quick_config: dict[str, Any], no_leaks: None) -> Iterator[DriverHarness]:
    with DriverHarness(PLUGIN, plugin_config=quick_config) as h:
        yield h


def _reconciler_lines(caplog: pytest.LogCaptureFixture, *needles: str) -> list[str]:
    """The plugins' hclog messages from the reconciler, once each needle is in one of them.

    Read from the host's logger (stderr is relayed asynchronously); the plugin's stderr tail is
    too short for this, pyroute2 logs every netlink message at debug level."""

    def lines() -> list[str]:
        return [m for m in caplog.messages if m.startswith("reconciler: ")]

    _wait_until(lambda: all(any(n in line for line in lines()) for n in needles), 10, f"log lines {needles}")
    return lines()


@pytest.mark.root
def test_exec_plugin_killed_mid_start_task_leaves_nothing(
    quick_harness: DriverHarness, alloc: AllocDir, track: Tracker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="driversdk.plugin")
    # StartTask blocks, for real, waiting for a reader on the task's stdout fifo: by then the
    # record, the bundle and the cgroup exist. The plugin is killed right there.
    alloc.add_task("slow", log_collection=False)
    task = alloc.task_config("slow", driver_config=sh("echo never"))
    for fifo in (task.stdout_path, task.stderr_path):
        os.mkfifo(fifo, 0o600)
    failed: list[BaseException] = []

    def start() -> None:
        try:
            quick_harness.client.start_task(task)
        except BaseException as err:
            failed.append(err)

    starter = threading.Thread(target=start)
    starter.start()
    cid = container_id_for(task.id)
    cgroup = TaskCgroup.for_container(cid, track.cgroup_parent)
    _wait_until(lambda: os.path.exists(owner.record_path(str(track.base / "state/tasks" / cid))), 30, "record")
    _wait_until(lambda: len(cgroup.existing()) >= 3, 30, "task cgroups")
    os.kill(quick_harness.client.process.pid, signal.SIGKILL)
    starter.join(30)
    assert failed, "StartTask returned although its plugin was killed"
    record = _record(track, task.id)
    assert record.phase == "starting"
    left = track.leftovers()
    assert left.get("cgroups") and cid in left.get("task dirs", [])

    relaunched = quick_harness.restart_plugin()
    _wait_until(lambda: not track.leftovers(), BOUND, "removal of the abandoned task")
    assert not cgroup.existing()
    _reconciler_lines(caplog, f"removed bundle {record.task_dir} ", f"removed cgroup {cgroup.relative} ")
    assert relaunched.capabilities().exec  # the plugin that reconciled is still serving


@pytest.mark.root
def test_exec_half_started_container_and_half_created_network_are_removed(
    quick_harness: DriverHarness, alloc: AllocDir, track: Tracker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="driversdk.plugin")
    # A running runc container whose StartTask died between spawning the supervisor and handing
    # back the handle, and a namespace whose CreateNetwork died before returning: made by killing
    # a plugin after both finished and putting their records back to the phase such a kill leaves.
    client = quick_harness.client
    spec, created = client.create_network(alloc.alloc_id, "web")
    assert created
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 300"), network=spec)
    handle = quick_harness.start(task)
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    state = DriverState.decode(handle.driver_state, handle.version)
    os.kill(client.process.pid, signal.SIGKILL)
    client.process.kill()
    quick_harness.forget(task.id)  # the host never got this handle
    record = _record(track, task.id)
    owner.save(dataclasses.replace(record, phase="starting"))
    net_record = track.base / "state" / "networks" / f"{alloc.alloc_id}.json"
    raw = json.loads(net_record.read_text())
    assert raw["phase"] == "created" and raw["owner_pid"] == client.process.pid
    net_record.write_text(json.dumps({**raw, "phase": "creating"}))
    left = track.leftovers()
    assert left.get("containers") == [state.container_id] and left.get("netns") and left.get("veths")

    quick_harness.restart_plugin()
    _wait_until(lambda: not track.leftovers(), BOUND, "removal of the abandoned task and network")
    assert not os.path.exists(netns_path(netns_name(alloc.alloc_id)))
    assert not net_record.exists() and not os.path.exists(record.path)
    assert not _alive(state.task_pid)  # the container's init, not only runc's record of it
    # The state dir's shared supervisor has no task left: it goes on its own.
    _wait_until(lambda: not _alive(state.supervisor_pid), BOUND, "the idle shared supervisor's exit")
    _reconciler_lines(
        caplog,
        f"removed runc container {state.container_id} ",
        f"removed network namespace {netns_name(alloc.alloc_id)} ",
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


@pytest.mark.root
def test_exec_reconciler_spares_live_owners_and_started_tasks(
    quick_config: dict[str, Any], alloc: AllocDir, track: Tracker, tmp_path: Path, no_leaks: None
) -> None:
    alloc.add_task("live")
    alloc.add_task("crashed")
    with (
        DriverHarness(PLUGIN, plugin_config=quick_config) as other,
        DriverHarness(PLUGIN, plugin_config=quick_config) as h,
    ):
        # A task of another plugin that is alive, shown as still "starting" (a slow StartTask)
        # long past the grace: its owner lives, so it is not ours to remove.
        live_task = alloc.task_config("live", driver_config=sh("echo ready; sleep 300"))
        other.start(live_task)
        alloc.wait_for_output("live", b"ready\n", timeout=TIMEOUT)
        live_record = _record(track, live_task.id)
        owner.save(dataclasses.replace(live_record, phase="starting", since=time.time() - 3600))

        # A started task whose plugin is then killed: the host will recover it.
        task = alloc.task_config(
            "crashed", driver_config=sh("echo ready; while [ ! -e /local/go ]; do sleep 0.05; done")
        )
        handle = h.start(task)
        alloc.wait_for_output("crashed", b"ready\n", timeout=TIMEOUT)
        os.kill(h.client.process.pid, signal.SIGKILL)

        # A marker orphan, so the test knows passes ran after the grace: a record a dead plugin
        # wrote before it got to make the bundle dir.
        marker_dir = track.base / "state" / "tasks" / "dsx-marker"
        dead = ProcessIdentity(_dead_pid(), 1)
        marker = TaskRecord("starting", dead.pid, dead.start_time, time.time(), False, track.cgroup_parent,
                            str(marker_dir.name), str(marker_dir), "runc")  # fmt: skip
        assert owner.create(marker)

        client = h.restart_plugin()
        _wait_until(lambda: not os.path.exists(marker.path), BOUND, "removal of the marker orphan")
        time.sleep(3 * PERIOD)  # and a few more passes

        assert other.client.inspect_task(live_task.id).state == TaskState.RUNNING
        assert _record(track, live_task.id).owner == live_record.owner
        client.recover_task(handle)
        recovered = _record(track, task.id)
        assert recovered.phase == "started" and recovered.owner_pid == client.process.pid
        assert client.inspect_task(task.id).state == TaskState.RUNNING
        (alloc.path / "crashed/local/go").touch()
        assert client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
        client.destroy_task(task.id)
        h.forget(task.id)
        assert not os.path.exists(recovered.path)
        with pytest.raises(PluginCallError):
            client.inspect_task(task.id)
