"""Who owns a task's on-disk state, and in which phase of its life the task is.

Several exec plugins may share one state dir and one cgroup parent (one per ``driversdk run``,
plus tests), and any of them may be SIGKILLed in the middle of StartTask. Each task therefore
carries a small record next to its bundle, ``<state_dir>/tasks/<container id>.json``, naming the
plugin process that owns it (pid plus the process start time from /proc/<pid>/stat, so a reused
pid is not mistaken for the owner) and its phase:

- ``starting``: StartTask is still building it; the host has no handle yet.
- ``started``: StartTask returned the handle. The host owns the task now: it will call
  RecoverTask or DestroyTask, so nothing else ever removes it.
- ``destroying``: DestroyTask (or a failed RecoverTask) is releasing it.

The record is written before anything else of the task exists and removed after everything
else is gone, so whatever a killed plugin leaves behind is reachable from a record.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Literal

Phase = Literal["starting", "started", "destroying"]
PHASES: tuple[Phase, ...] = ("starting", "started", "destroying")
RECORD_SUFFIX = ".json"


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


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    return text[text.rfind(")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    # Fields after the name start at field 3 (state); starttime is field 22.
    if fields is None or len(fields) < 20 or not fields[19].isdigit():
        return None
    return int(fields[19])


def _is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[:1] == ["Z"]


@dataclass(frozen=True)
class TaskRecord:
    container_id: str
    task_dir: str
    phase: Phase
    owner_pid: int
    owner_start_time: int
    since: float
    """When the record entered its phase (wall clock); the reconciler's grace counts from it."""
    cgroup_v2: bool
    cgroup_parent: str
    runc_path: str
    runc_root: str = ""

    @property
    def owner(self) -> ProcessIdentity:
        return ProcessIdentity(self.owner_pid, self.owner_start_time)

    @property
    def path(self) -> str:
        return record_path(self.task_dir)

    def moved_to(self, phase: Phase, owner: ProcessIdentity) -> TaskRecord:
        return replace(self, phase=phase, owner_pid=owner.pid, owner_start_time=owner.start_time, since=time.time())

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> TaskRecord:
        raw = json.loads(data)
        if raw.get("phase") not in PHASES:
            raise ValueError(f"unknown phase {raw.get('phase')!r}")
        return cls(
            container_id=str(raw["container_id"]),
            task_dir=str(raw["task_dir"]),
            phase=raw["phase"],
            owner_pid=int(raw["owner_pid"]),
            owner_start_time=int(raw["owner_start_time"]),
            since=float(raw["since"]),
            cgroup_v2=bool(raw["cgroup_v2"]),
            cgroup_parent=str(raw["cgroup_parent"]),
            runc_path=str(raw["runc_path"]),
            runc_root=str(raw.get("runc_root", "")),
        )


def record_path(task_dir: str) -> str:
    return task_dir.rstrip("/") + RECORD_SUFFIX


def _temp_path(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.{os.getpid()}.tmp")


def _write_temp(path: str, data: bytes) -> str:
    tmp = _temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def create(record: TaskRecord) -> bool:
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


def save(record: TaskRecord) -> None:
    """Replace the record atomically (a phase or owner change)."""
    os.replace(_write_temp(record.path, record.encode()), record.path)


def load(path: str) -> TaskRecord | None:
    try:
        with open(path, "rb") as fh:
            return TaskRecord.decode(fh.read())
    except FileNotFoundError:
        return None


def remove(task_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(record_path(task_dir))


def list_records(tasks_dir: str) -> list[str]:
    """Paths of every task record in ``tasks_dir`` (temp files excluded)."""
    try:
        names = os.listdir(tasks_dir)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(tasks_dir, n) for n in names if n.endswith(RECORD_SUFFIX) and not n.startswith("."))
