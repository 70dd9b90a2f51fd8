"""The exec driver's task record: ``<state_dir>/tasks/<container id>.json``.

What a record is for, its phases and the file rules are :mod:`driversdk.taskkit.owner`'s; this
module adds what an exec task's record names so a later plugin can remove what a killed one left:
the runc container, its bundle dir and its cgroup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from driversdk.taskkit.owner import (
    OwnedRecord,
    Phase,
    ProcessIdentity,
    create,
    list_records,
    owner_fields,
    record_path,
    remove,
    save,
)
from driversdk.taskkit.owner import load as _load


@dataclass(frozen=True)
class TaskRecord(OwnedRecord):
    container_id: str
    task_dir: str
    phase: Phase
    owner_pid: int
    owner_start_time: int
    since: float
    cgroup_v2: bool
    cgroup_parent: str
    runc_path: str
    runc_root: str = ""

    @property
    def key(self) -> str:
        return self.container_id

    @property
    def path(self) -> str:
        return record_path(self.task_dir)

    @classmethod
    def decode(cls, data: bytes) -> TaskRecord:
        raw = json.loads(data)
        return cls(
            container_id=str(raw["container_id"]),
            task_dir=str(raw["task_dir"]),
            cgroup_v2=bool(raw["cgroup_v2"]),
            cgroup_parent=str(raw["cgroup_parent"]),
            runc_path=str(raw["runc_path"]),
            runc_root=str(raw.get("runc_root", "")),
            **owner_fields(raw),
        )


def load(path: str) -> TaskRecord | None:
    return _load(path, TaskRecord.decode)


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
