"""Removing what a killed plugin left half-made: the exec driver's dangling-task reconciler.

A plugin SIGKILLed in the middle of StartTask never hands the host a handle, so nobody will
ever call RecoverTask or DestroyTask for that task: its runc container, bundle, cgroups and the
supervisor would stay forever. A plugin killed in the middle of CreateNetwork likewise leaves a
namespace and a veth nobody will destroy. Each plugin therefore runs a background pass every
``period`` (as Nomad's docker driver reconciles dangling containers) that removes a task only when
all of these hold, which keeps it safe while several plugins share a state dir and cgroup parent:

- its record (owner.py) is not in phase "started": a started task belongs to the host, which
  recovers it on a relaunched plugin (RecoverTask) or destroys it; it is never reaped here;
- it has been in its phase for longer than ``creation_grace``;
- the plugin process named as its owner (pid and start time) is gone;
- this plugin does not track it (RecoverTask also makes the recovering plugin the owner).

Networks follow the same rule with their "creating" phase (network.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from drivers.exec import owner
from drivers.exec import rootfs as task_root
from drivers.exec.bundle import Bundle
from drivers.exec.network import NetworkManager
from drivers.exec.owner import TaskRecord
from drivers.exec.runc import Runc
from driversdk.errors import DriverError
from driversdk.taskkit import owner as kit
from driversdk.taskkit.cgroups import TaskCgroup
from driversdk.taskkit.supervisor import SPEC_FILE, processes_naming

log = logging.getLogger("driversdk.exec.reconcile")

DELETE_WAIT = 5.0


@dataclass(frozen=True)
class ReconcileSettings:
    state_dir: str
    runtime_path: str
    period: float
    creation_grace: float
    bridge_name: str
    bridge_subnet: str


def release_orphan(record: TaskRecord) -> list[str]:
    """Remove everything of a task whose StartTask (or DestroyTask) died with its plugin; returns
    what was removed, each logged. Safe to repeat: each step skips what is already gone."""
    cid = record.container_id
    fields = {"container_id": cid, "task_dir": record.task_dir, "phase": record.phase, "owner_pid": record.owner_pid}
    removed: list[str] = []
    # The supervisor first, so it cannot record an exit (or respawn anything) while we clean up.
    # Its supervisor names its launch spec; runc's processes (run, exec) name the container id.
    for pid in processes_naming(cid, os.path.join(record.task_dir, SPEC_FILE)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            log.info("reconciler: killed process %d of abandoned task container %s", pid, cid, extra=fields)
    cgroup = TaskCgroup(cid, record.cgroup_v2, record.cgroup_parent)
    cgroup.kill_all()
    runc = Runc(record.runc_path, record.runc_root)
    if runc.state(cid) is not None:
        deadline = time.monotonic() + DELETE_WAIT
        while True:
            try:
                runc.delete_force(cid)
                break
            except DriverError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        removed.append("runc container")
        log.info("reconciler: removed runc container %s of a task whose plugin died", cid, extra=fields)
    if cgroup.existing():
        cgroup.remove()
        removed.append("cgroup")
        log.info("reconciler: removed cgroup %s of a task whose plugin died", cgroup.relative, extra=fields)
    task_root.unmount(Bundle(record.task_dir).rootfs)
    if os.path.exists(record.task_dir):
        task_root.remove_task_dir(record.task_dir)
        removed.append("bundle")
        log.info("reconciler: removed bundle %s of a task whose plugin died", record.task_dir, extra=fields)
    owner.remove(record.task_dir)
    log.info("reconciler: removed state record of abandoned task container %s", cid, extra=fields)
    return removed


def claim(record: TaskRecord, state_dir: str) -> TaskRecord:
    """Make this plugin the owner of a task the host is recovering (phase "started")."""
    return kit.claim(record, state_dir, TaskRecord.decode)


def replace_abandoned(record: TaskRecord, state_dir: str) -> bool:
    """Create ``record``, first releasing what an earlier start of the same task id left when its
    plugin died (kit.replace_abandoned); False when a live plugin still owns the id."""
    return kit.replace_abandoned(record, state_dir, TaskRecord.decode, release_orphan)


def reconcile_once(settings: ReconcileSettings, tracked: set[str]) -> list[str]:
    """One pass; returns the container ids (and "netns:<name>") removed."""
    removed: list[str] = []
    with kit.exclusive(settings.state_dir) as mine:
        if not mine:
            return removed
        tasks_dir = os.path.join(settings.state_dir, "tasks")
        now = time.time()
        grace = settings.creation_grace
        removed += kit.release_orphans(
            tasks_dir, TaskRecord.decode, release_orphan, tracked=tracked, grace=grace, now=now
        )
        removed += _remove_bundleless_containers(settings, tasks_dir)
        nets = NetworkManager(settings.state_dir, settings.bridge_name, settings.bridge_subnet)
        for net in nets.reap_abandoned(settings.creation_grace, now=now):
            removed.append(f"netns:{net.netns}")
            log.info(
                "reconciler: removed network namespace %s and veth %s of allocation %s whose CreateNetwork never "
                "returned (plugin pid %d gone)",
                net.netns,
                net.veth,
                net.alloc_id,
                net.owner_pid,
                extra={"alloc_id": net.alloc_id},
            )
    return removed


def _remove_bundleless_containers(settings: ReconcileSettings, tasks_dir: str) -> list[str]:
    """runc containers whose bundle lies in our tasks dir but has neither record nor bundle left.

    Nothing can run or recover such a container (its config and status file are gone); it can
    only be left by a removal interrupted halfway, so it is deleted without a grace."""
    removed: list[str] = []
    prefix = tasks_dir.rstrip("/") + "/"
    try:
        bundles = Runc(settings.runtime_path).bundles()
    except DriverError as err:
        log.warning("reconciler: cannot list runc containers: %s", err.message)
        return removed
    for cid, bundle in bundles.items():
        if not bundle.startswith(prefix) or os.path.exists(bundle) or os.path.exists(owner.record_path(bundle)):
            continue
        with contextlib.suppress(DriverError):
            Runc(settings.runtime_path).delete_force(cid)
            removed.append(cid)
            log.info("reconciler: removed runc container %s whose bundle %s is gone", cid, bundle)
    return removed


class Reconciler(kit.PeriodicPass):
    """The background thread: a pass at start, then one every ``period``."""

    def __init__(self, settings: Callable[[], ReconcileSettings], tracked: Callable[[], set[str]]) -> None:
        super().__init__("exec-reconciler", lambda: reconcile_once(settings(), tracked()), lambda: settings().period)
