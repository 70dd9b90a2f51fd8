"""The driver's map of task id -> its record of the task, safe to use from the gRPC threads."""

from __future__ import annotations

import threading
from typing import Generic, Protocol, TypeVar

from driversdk.errors import TaskNotFoundError
from driversdk.model import TaskConfig


class HasTaskConfig(Protocol):
    @property
    def task(self) -> TaskConfig: ...


T = TypeVar("T", bound=HasTaskConfig)


class TaskMap(Generic[T]):
    """Records keyed by their task id; ``get`` of an unknown id raises TaskNotFoundError, which
    the SDK answers with the status and sentence Nomad expects for a task it no longer has."""

    def __init__(self) -> None:
        self._tasks: dict[str, T] = {}
        self._lock = threading.Lock()

    def get(self, task_id: str) -> T:
        with self._lock:
            record = self._tasks.get(task_id)
        if record is None:
            raise TaskNotFoundError(task_id)
        return record

    def has(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._tasks

    def put(self, record: T) -> None:
        with self._lock:
            self._tasks[record.task.id] = record

    def remove(self, task_id: str) -> None:
        with self._lock:
            self._tasks.pop(task_id, None)

    def records(self) -> list[T]:
        """A snapshot: the caller may iterate while others start and destroy tasks."""
        with self._lock:
            return list(self._tasks.values())
