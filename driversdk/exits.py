"""A task's exit, set once and awaited by blocking callers and callbacks alike.

A driver keeps one :class:`ExitSlot` per task: whatever learns of the exit (a process watcher,
an event stream) calls :meth:`ExitSlot.set`; :meth:`~driversdk.driver.DriverPlugin.wait_task`
blocks in :meth:`ExitSlot.wait`, and :meth:`~driversdk.driver.DriverPlugin.watch_exit` hands its
callback to :meth:`ExitSlot.add_callback`, so a waiting host costs no thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from driversdk.model import ExitResult, TaskConfig, TaskEvent

log = logging.getLogger("driversdk.exits")

ExitCallback = Callable[[ExitResult], None]


class ExitSlot:
    """Holds one :class:`ExitResult`, set once; callbacks run outside the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._result: ExitResult | None = None
        self._callbacks: list[ExitCallback] = []

    @property
    def done(self) -> bool:
        return self._event.is_set()

    @property
    def result(self) -> ExitResult | None:
        """The exit once set, else None."""
        return self._result

    def set(self, result: ExitResult) -> bool:
        """Record the exit and run the waiting callbacks on this thread.

        Only the first call counts (True); later ones change nothing and return False, so two
        sources reporting the same exit cannot contradict each other. A callback that raises is
        logged and the others still run: they belong to different waiters.
        """
        with self._lock:
            if self._result is not None:
                return False
            self._result = result
            callbacks, self._callbacks = self._callbacks, []
        self._event.set()
        for callback in callbacks:
            try:
                callback(result)
            except Exception:
                log.exception("exit callback failed")
        return True

    def wait(self, timeout: float | None = None) -> ExitResult | None:
        """Block until the exit is set (or ``timeout`` seconds pass: None)."""
        self._event.wait(timeout)
        return self._result

    def add_callback(self, callback: ExitCallback) -> None:
        """Call ``callback(result)`` once: now, on this thread, if the exit is already set (an
        exception then reaches the caller), else on the thread that sets it."""
        with self._lock:
            result = self._result
            if result is None:
                self._callbacks.append(callback)
                return
        callback(result)


class RecordedStatus(Protocol):
    """What a task supervisor wrote when its task ended (exec's and raw_exec's status files)."""

    @property
    def exit_code(self) -> int: ...

    @property
    def signal(self) -> int: ...

    @property
    def finished_at(self) -> float: ...


@dataclass(frozen=True)
class SupervisedExit:
    result: ExitResult
    completed_at: datetime
    event: TaskEvent | None
    """Nomad's "OOM Killed" task event when the kernel killed the task at its memory limit."""


def supervised_exit(task: TaskConfig, status: RecordedStatus | None, oom_killed: Callable[[], bool]) -> SupervisedExit:
    """The exit of a task whose supervisor is gone, from the status it wrote (None: it wrote
    none, so nobody knows the code: -1, as Nomad reports an unknown exit)."""
    if status is None:
        log.error("supervisor of task %s went away without recording an exit status", task.id)
        return SupervisedExit(ExitResult(exit_code=-1), datetime.now(UTC), None)
    oom = oom_killed()
    event = None
    if oom:
        event = TaskEvent(
            task_id=task.id,
            alloc_id=task.alloc_id,
            task_name=task.name,
            message="OOM Killed",
            timestamp=datetime.now(UTC),
            annotations={"oom_killed": "true"},
        )
    result = ExitResult(exit_code=status.exit_code, signal=status.signal, oom_killed=oom)
    return SupervisedExit(result, datetime.fromtimestamp(status.finished_at, UTC), event)
