"""Removing what a plugin killed inside StartTask left: raw_exec's dangling-task reconciler.

A plugin SIGKILLed before StartTask returned never handed the host a handle, so nobody will call
RecoverTask or DestroyTask for that task: its state dir, cgroup, supervisor and even the running
task would stay forever. Each task therefore has a record, ``<state_dir>/tasks/<key>.json``,
written before anything else of it exists and removed last, naming its owner (the plugin's pid
and start time) and its phase: ``starting`` until the handle is returned, then ``started``
(the host owns it from then on: it is never reaped here), ``destroying`` during DestroyTask.

A background pass (at plugin start, then every ``reconcile.period``; one plugin at a time per
state dir, under ``state_dir/reconcile.lock``) removes a task whose record is not ``started``,
has been in its phase longer than ``creation_grace``, whose owner is dead and which this plugin
does not track. A start of a task id whose earlier start died with its plugin (the host retries
the same id) replaces what that start left at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from drivers.raw_exec.cgroups import RawCgroup
from driversdk.taskkit import owner as kit
from driversdk.taskkit.owner import OwnedRecord, Phase, owner_fields, record_path, remove
from driversdk.taskkit.supervisor import SPEC_FILE, processes_naming

log = logging.getLogger("driversdk.raw_exec.reconcile")


@dataclass(frozen=True)
class TaskRecord(OwnedRecord):
    task_key: str
    state_dir: str
    phase: Phase
    owner_pid: int
    owner_start_time: int
    since: float
    cgroup_v2: bool
    cgroup_parent: str

    @property
    def key(self) -> str:
        return self.task_key

    @property
    def path(self) -> str:
        return record_path(self.state_dir)

    @classmethod
    def decode(cls, data: bytes) -> TaskRecord:
        raw = json.loads(data)
        return cls(
            task_key=str(raw["task_key"]),
            state_dir=str(raw["state_dir"]),
            cgroup_v2=bool(raw["cgroup_v2"]),
            cgroup_parent=str(raw["cgroup_parent"]),
            **owner_fields(raw),
        )


def load(path: str) -> TaskRecord | None:
    return kit.load(path, TaskRecord.decode)


def release(record: TaskRecord) -> None:
    """Kill and remove everything of the task the record names; safe to repeat."""
    fields = {"task_key": record.task_key, "phase": record.phase, "owner_pid": record.owner_pid}
    # The supervisor first, so it cannot record an exit while the rest goes.
    for pid in processes_naming(os.path.join(record.state_dir, SPEC_FILE)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            log.info("reconciler: killed supervisor %d of abandoned task %s", pid, record.task_key, extra=fields)
    cgroup = RawCgroup(record.task_key, record.cgroup_v2, record.cgroup_parent).plain
    for pid in cgroup.kill_all():
        log.info("reconciler: killed process %d of abandoned task %s", pid, record.task_key, extra=fields)
    if cgroup.existing():
        cgroup.remove()
        log.info("reconciler: removed cgroup %s of a task whose plugin died", cgroup.relative, extra=fields)
    if os.path.isdir(record.state_dir):
        shutil.rmtree(record.state_dir)
        log.info("reconciler: removed state dir %s of a task whose plugin died", record.state_dir, extra=fields)
    remove(record.state_dir)


def claim(record: TaskRecord, plugin_state_dir: str) -> None:
    """Make this plugin the owner of a task the host is recovering (phase "started")."""
    kit.claim(record, plugin_state_dir, TaskRecord.decode)


def replace_abandoned(record: TaskRecord, plugin_state_dir: str) -> bool:
    """Create ``record``, first releasing what an earlier start of the same task id left when its
    plugin died (kit.replace_abandoned); False when a live plugin owns it."""
    return kit.replace_abandoned(record, plugin_state_dir, TaskRecord.decode, release)


def reconcile_once(plugin_state_dir: str, grace: float, tracked: set[str]) -> list[str]:
    """One pass; returns the task keys removed."""
    tasks_dir = os.path.join(plugin_state_dir, "tasks")
    with kit.exclusive(plugin_state_dir) as mine:
        if not mine or not os.path.isdir(tasks_dir):
            return []
        return kit.release_orphans(tasks_dir, TaskRecord.decode, release, tracked=tracked, grace=grace, now=time.time())


class Reconciler(kit.PeriodicPass):
    """The background thread: a pass at start, then one every period."""

    def __init__(self, settings: Callable[[], tuple[str, float, float]], tracked: Callable[[], set[str]]) -> None:
        def run_pass() -> None:
            state_dir, _period, grace = settings()
            reconcile_once(state_dir, grace, tracked())

        super().__init__("raw-exec-reconciler", run_pass, lambda: settings()[1])
