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
import fcntl
import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Literal

from drivers.exec.owner import ProcessIdentity
from drivers.raw_exec.cgroups import RawCgroup

log = logging.getLogger("driversdk.raw_exec.reconcile")

Phase = Literal["starting", "started", "destroying"]
PHASES: tuple[Phase, ...] = ("starting", "started", "destroying")


@dataclass(frozen=True)
class TaskRecord:
    task_key: str
    state_dir: str
    phase: Phase
    owner_pid: int
    owner_start_time: int
    since: float
    cgroup_v2: bool
    cgroup_parent: str

    @property
    def path(self) -> str:
        return record_path(self.state_dir)

    @property
    def owner(self) -> ProcessIdentity:
        return ProcessIdentity(self.owner_pid, self.owner_start_time)

    def moved_to(self, phase: Phase, owner: ProcessIdentity | None = None) -> TaskRecord:
        who = owner or ProcessIdentity.current()
        return replace(self, phase=phase, owner_pid=who.pid, owner_start_time=who.start_time, since=time.time())

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> TaskRecord:
        raw = json.loads(data)
        if raw.get("phase") not in PHASES:
            raise ValueError(f"unknown phase {raw.get('phase')!r}")
        return cls(
            task_key=str(raw["task_key"]),
            state_dir=str(raw["state_dir"]),
            phase=raw["phase"],
            owner_pid=int(raw["owner_pid"]),
            owner_start_time=int(raw["owner_start_time"]),
            since=float(raw["since"]),
            cgroup_v2=bool(raw["cgroup_v2"]),
            cgroup_parent=str(raw["cgroup_parent"]),
        )


def record_path(state_dir: str) -> str:
    return state_dir.rstrip("/") + ".json"


def _write_temp(path: str, data: bytes) -> str:
    head, tail = os.path.split(path)
    tmp = os.path.join(head, f".{tail}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def create(record: TaskRecord) -> bool:
    """Publish a new record atomically; False when one exists already (never overwritten)."""
    tmp = _write_temp(record.path, record.encode())
    try:
        os.link(tmp, record.path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def save(record: TaskRecord) -> None:
    os.replace(_write_temp(record.path, record.encode()), record.path)


def load(path: str) -> TaskRecord | None:
    try:
        with open(path, "rb") as fh:
            return TaskRecord.decode(fh.read())
    except FileNotFoundError:
        return None


def remove(state_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(record_path(state_dir))


def supervisor_processes(state_dir: str) -> list[int]:
    """Pids of the task's supervisor and launchers: their argv names the task's launch spec."""
    wanted = os.path.join(state_dir, "launch.json").encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if wanted in argv:
            found.append(int(name))
    return found


def release(record: TaskRecord) -> None:
    """Kill and remove everything of the task the record names; safe to repeat."""
    fields = {"task_key": record.task_key, "phase": record.phase, "owner_pid": record.owner_pid}
    # The supervisor first, so it cannot record an exit while the rest goes.
    for pid in supervisor_processes(record.state_dir):
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


@contextlib.contextmanager
def exclusive(state_dir: str, *, wait: bool = False) -> Iterator[bool]:
    """One pass (or claim) at a time per state dir; a pass that finds the lock taken skips."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(state_dir, "reconcile.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def claim(record: TaskRecord, plugin_state_dir: str) -> None:
    """Make this plugin the owner of a task the host is recovering (phase "started")."""
    with exclusive(plugin_state_dir, wait=True):
        current = load(record.path) or record
        save(current.moved_to("started"))


def replace_abandoned(record: TaskRecord, plugin_state_dir: str) -> bool:
    """Create ``record``, first removing what an earlier start of the same task id left when its
    plugin died (without the handle nobody can recover it). False when a live plugin owns it."""
    with exclusive(plugin_state_dir, wait=True):
        existing = load(record.path)
        if existing is not None:
            if existing.owner.alive():
                return False
            log.info("replacing task %s left by a start whose plugin died", existing.task_key)
            release(existing)
        return create(record)


def is_orphan(record: TaskRecord, *, tracked: set[str], grace: float, now: float) -> bool:
    if record.phase == "started" or record.task_key in tracked:
        return False
    return now - record.since >= grace and not record.owner.alive()


def reconcile_once(plugin_state_dir: str, grace: float, tracked: set[str]) -> list[str]:
    """One pass; returns the task keys removed."""
    removed: list[str] = []
    tasks_dir = os.path.join(plugin_state_dir, "tasks")
    with exclusive(plugin_state_dir) as mine:
        if not mine or not os.path.isdir(tasks_dir):
            return removed
        now = time.time()
        for name in sorted(os.listdir(tasks_dir)):
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                record = load(os.path.join(tasks_dir, name))
            except (ValueError, KeyError, TypeError, OSError) as err:
                log.warning("reconciler: skipping unreadable task record %s: %s", name, err)
                continue
            if record is None or not is_orphan(record, tracked=tracked, grace=grace, now=now):
                continue
            try:
                release(record)
                removed.append(record.task_key)
            except Exception as err:  # one task's failure must not stop the pass
                log.warning("reconciler: failed to remove abandoned task %s: %s", record.task_key, err)
    return removed


class Reconciler:
    """The background thread: a pass at start, then one every period."""

    def __init__(self, settings: Callable[[], tuple[str, float, float]], tracked: Callable[[], set[str]]) -> None:
        self._settings = settings
        self._tracked = tracked
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="raw-exec-reconciler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            state_dir, period, grace = self._settings()
            try:
                reconcile_once(state_dir, grace, self._tracked())
            except Exception:
                log.exception("reconciler: pass over %s failed", state_dir)
            self._stop.wait(period)
