"""The exec driver's task record: ``<state_dir>/tasks/<container id>.json``.

What a record is for, its phases and the file rules are :mod:`driversdk.taskkit.owner`'s; this
module adds what an exec task's record names so a later plugin can remove what a killed one left:
the runc container, its bundle dir and its cgroup.
"""

from __future__ import annotations

from dataclasses import dataclass

from driversdk.taskkit import owner as kit
from driversdk.taskkit.owner import Phase, ProcessIdentity, create, list_records, record_path, remove, save


@dataclass(frozen=True)
class TaskRecord(kit.TaskRecord):
    container_id: str
    task_dir: str
    runc_path: str
    runc_root: str = ""

    @property
    def key(self) -> str:
        return self.container_id

    @property
    def directory(self) -> str:
        return self.task_dir


def load(path: str) -> TaskRecord | None:
    return kit.load(path, TaskRecord.decode)


__all__ = [
    "Phase",
    "ProcessIdentity",
    "TaskRecord",
    "create",
    "list_records",
    "load",
    "record_path",
    "remove",
    "save",
]
