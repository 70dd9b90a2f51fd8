"""raw_exec's task record: ``<state_dir>/tasks/<key>.json``, written before anything else of a
task exists and removed last, so a later plugin's reconciler (the kit's,
:class:`driversdk.taskkit.recorded.RecordedDriver`) can remove what a plugin killed inside
StartTask left: its supervisor, cgroup and state dir. Phases and the orphan rule are
:mod:`driversdk.taskkit.owner`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from driversdk.taskkit import owner as kit


@dataclass(frozen=True)
class TaskRecord(kit.TaskRecord):
    task_key: str
    state_dir: str

    @property
    def key(self) -> str:
        return self.task_key

    @property
    def directory(self) -> str:
        return self.state_dir


def load(path: str) -> TaskRecord | None:
    return kit.load(path, TaskRecord.decode)
