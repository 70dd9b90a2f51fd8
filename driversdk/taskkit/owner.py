"""Who owns a task's on-disk state, and in which phase of its life the task is.

Several plugins of one driver may share a state dir (one per ``driversdk run``, plus tests), and
any of them may be SIGKILLed in the middle of StartTask. A driver therefore writes, before
anything else of a task exists, a small record naming the plugin process that owns the task
(pid plus the process start time from /proc/<pid>/stat, so a reused pid is not mistaken for
the owner) and its phase, and removes it after everything else of the task is gone:

- ``starting``: StartTask is still building it; the host has no handle yet.
- ``started``: StartTask returned the handle. The host owns the task now: it will call
  RecoverTask or DestroyTask, so nothing else ever removes it.
- ``destroying``: DestroyTask (or a failed RecoverTask) is releasing it.

Whatever a killed plugin leaves behind is then reachable from a record. This module holds what
every such driver shares: process identity, the record's owner fields, atomic record files, the
per-state-dir lock, the orphan rule, claiming and replacing, and the background pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Self, TypeVar

from driversdk.taskkit.cgroups import TaskCgroup
from driversdk.taskkit.fields import from_fields

log = logging.getLogger("driversdk.taskkit.owner")

Phase = Literal["starting", "started", "destroying"]
PHASES: tuple[Phase, ...] = ("starting", "started", "destroying")
RECORD_SUFFIX = ".json"
LOCK_NAME = "reconcile.lock"


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as the kernel tells it apart: pid plus start time (clock ticks since boot)."""

    pid: int
    start_time: int

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        start = process_start_time(pid)
        return None if start is None else cls(pid, start)

    @classmethod
    def current(cls) -> ProcessIdentity:
        me = cls.of(os.getpid())
        assert me is not None, "/proc/self/stat is unreadable"
        return me

    def alive(self) -> bool:
        # A zombie has exited: its owner record no longer protects anything.
        return process_start_time(self.pid) == self.start_time and not _is_zombie(self.pid)

    def send(self, signum: int) -> bool:
        """Signal this process and no other: False when it is gone, or its pid now names another.

        The pidfd pins the process before its start time is checked, so the signal cannot reach
        a process that took the pid between the check and the kill."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return False
        try:
            if not self.alive():
                return False
            signal.pidfd_send_signal(pidfd, signum)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(pidfd)


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields from field 3 (state) on; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    return text[text.rfind(")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    fields = stat_fields(pid)
    # Fields after the name start at field 3 (state); starttime is field 22.
    if fields is None or len(fields) < 20 or not fields[19].isdigit():
        return None
    return int(fields[19])


def _is_zombie(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[:1] == ["Z"]


class OwnedRecord:
    """Mixin for a driver's frozen dataclass record: the owner fields and what follows from them.

    The dataclass declares ``phase``, ``owner_pid``, ``owner_start_time`` and ``since`` (when the
    record entered its phase, wall clock: the reconciler's grace counts from it) among its own
    fields, plus ``key`` (what the driver tracks the task by) and ``path`` (where the record lives).
    """

    phase: Phase
    owner_pid: int
    owner_start_time: int
    since: float

    @property
    def key(self) -> str:
        raise NotImplementedError

    @property
    def path(self) -> str:
        raise NotImplementedError

    @property
    def owner(self) -> ProcessIdentity:
        return ProcessIdentity(self.owner_pid, self.owner_start_time)

    def moved_to(self, phase: Phase, owner: ProcessIdentity | None = None) -> Self:
        """The record in ``phase``, owned by ``owner`` (this process when None), since now."""
        who = owner or ProcessIdentity.current()
        changed: Any = dataclasses.replace(  # type: ignore[type-var]  # a dataclass by contract
            self, phase=phase, owner_pid=who.pid, owner_start_time=who.start_time, since=time.time()
        )
        return changed  # type: ignore[no-any-return]

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()  # type: ignore[call-overload]


def owner_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The owner fields of a decoded record, checked; raises ValueError/KeyError/TypeError."""
    if raw.get("phase") not in PHASES:
        raise ValueError(f"unknown phase {raw.get('phase')!r}")
    return {
        "phase": raw["phase"],
        "owner_pid": int(raw["owner_pid"]),
        "owner_start_time": int(raw["owner_start_time"]),
        "since": float(raw["since"]),
    }


@dataclass(frozen=True)
class TaskRecord(OwnedRecord):
    """What every kit driver's record holds: the owner fields and the task's own cgroup, named
    after :attr:`key`. A driver's record extends it with where its task lives (:attr:`directory`,
    under the JSON name that driver's saved records use) and what else it must remove."""

    phase: Phase
    owner_pid: int
    owner_start_time: int
    since: float
    cgroup_v2: bool
    cgroup_parent: str

    @property
    def directory(self) -> str:
        """The task's own state dir: its launch spec, status file and whatever the driver keeps."""
        raise NotImplementedError

    @property
    def path(self) -> str:
        return record_path(self.directory)

    @property
    def cgroup(self) -> TaskCgroup:
        return TaskCgroup(self.key, self.cgroup_v2, self.cgroup_parent)

    @classmethod
    def decode(cls, data: bytes) -> Self:
        raw = json.loads(data)
        return from_fields(cls, raw, **owner_fields(raw))


R = TypeVar("R", bound=OwnedRecord)


class _Record(Protocol):
    @property
    def path(self) -> str: ...

    def encode(self) -> bytes: ...


def record_path(task_state_dir: str) -> str:
    """A task's record lies beside its state dir: ``<dir>.json``."""
    return task_state_dir.rstrip("/") + RECORD_SUFFIX


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


def create(record: _Record) -> bool:
    """Write a new record; False when one already exists (never overwritten).

    link(2) publishes the complete file atomically and fails if the name is taken, so a reader
    never sees half a record and two starts of one task id cannot both own it.
    """
    tmp = _write_temp(record.path, record.encode())
    try:
        os.link(tmp, record.path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def save(record: _Record) -> None:
    """Replace the record atomically (a phase or owner change)."""
    os.replace(_write_temp(record.path, record.encode()), record.path)


def load(path: str, decode: Callable[[bytes], R]) -> R | None:
    try:
        with open(path, "rb") as fh:
            return decode(fh.read())
    except FileNotFoundError:
        return None


def remove(task_state_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(record_path(task_state_dir))


def list_records(tasks_dir: str) -> list[str]:
    """Paths of every task record in ``tasks_dir`` (temp files excluded)."""
    try:
        names = os.listdir(tasks_dir)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(tasks_dir, n) for n in names if n.endswith(RECORD_SUFFIX) and not n.startswith("."))


def remove_stale_temp_files(tasks_dir: str, grace: float, now: float) -> None:
    """Temp files of a record write whose writer did not live to rename them."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(tasks_dir):
            if entry.name.startswith(".") and entry.name.endswith(".tmp") and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    if now - entry.stat(follow_symlinks=False).st_mtime >= grace:
                        os.remove(entry.path)


@contextlib.contextmanager
def exclusive(state_dir: str, *, wait: bool = False) -> Iterator[bool]:
    """One reconciler pass at a time per state dir; a plugin that finds the lock taken skips.

    RecoverTask takes the same lock (waiting) to claim a task, so a pass never removes a task
    between deciding it is an orphan and a RecoverTask making it owned."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(state_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def is_orphan(record: OwnedRecord, *, tracked: set[str], grace: float, now: float) -> bool:
    """Whether a pass may remove the task: no handle was handed out, this plugin does not track
    it, its phase is older than the grace and its owner is dead."""
    if record.phase == "started" or record.key in tracked:
        return False
    return now - record.since >= grace and not record.owner.alive()


def claim(record: R, state_dir: str, decode: Callable[[bytes], R]) -> R:
    """Make this plugin the owner of a task the host is recovering (phase "started")."""
    with exclusive(state_dir, wait=True):
        current = load(record.path, decode) or record
        claimed = current.moved_to("started")
        save(claimed)
        return claimed


def replace_abandoned(record: R, state_dir: str, decode: Callable[[bytes], R], release: Callable[[R], object]) -> bool:
    """Take a task id whose earlier start died with its plugin: the host starts the same id again
    when its own run was killed inside StartTask and never got the handle. What the dead start
    left (in any phase: without the handle nobody can recover it) is released, then ``record`` is
    created. False when a live plugin still owns the id."""
    with exclusive(state_dir, wait=True):
        existing = load(record.path, decode)
        if existing is not None:
            if existing.owner.alive():
                return False
            log.info(
                "replacing task %s left by a start whose plugin died",
                existing.key,
                extra={"task_key": existing.key, "phase": existing.phase},
            )
            release(existing)
        return create(record)


def release_orphans(
    tasks_dir: str,
    decode: Callable[[bytes], R],
    release: Callable[[R], object],
    *,
    tracked: set[str],
    grace: float,
    now: float,
) -> list[str]:
    """Release every task of ``tasks_dir`` whose record :func:`is_orphan` says a pass may remove;
    returns their keys. Run it under :func:`exclusive`. One task that cannot be read or released
    is logged and skipped: it must not stop the pass."""
    removed: list[str] = []
    for path in list_records(tasks_dir):
        try:
            record = load(path, decode)
        except (ValueError, KeyError, TypeError, OSError) as err:
            log.warning("reconciler: skipping unreadable task record %s: %s", path, err)
            continue
        if record is None or not is_orphan(record, tracked=tracked, grace=grace, now=now):
            continue
        try:
            release(record)
            removed.append(record.key)
        except Exception as err:
            log.warning("reconciler: failed to remove abandoned task %s: %s", record.key, getattr(err, "message", err))
    remove_stale_temp_files(tasks_dir, grace, now)
    return removed


class PeriodicPass:
    """A background thread running ``run_pass`` at start, then every ``period()`` seconds."""

    def __init__(self, name: str, run_pass: Callable[[], object], period: Callable[[], float]) -> None:
        self._name = name
        self._run_pass = run_pass
        self._period = period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._run_pass()
            except Exception:  # the thread must outlive one bad pass
                log.exception("%s: a pass failed", self._name)
            self._stop.wait(self._period())
