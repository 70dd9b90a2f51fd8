#!/usr/bin/env python3
"""A driver of make-believe tasks, cheap enough to run hundreds on one plugin: for stream tests.

A task is a record, not a process: it "runs" until StopTask or DestroyTask, or for
``seconds`` when its config says so, and exits with ``exit_code``. One clock thread ends
timed tasks, so the plugin's thread count is the SDK's, not one per task.

``--no-watch`` serves WaitTask through ``wait_task`` only (DriverPlugin.watch_exit's default),
so the SDK must fall back to a waiting thread; without it the driver implements ``watch_exit``.

SignalTask drives the streams from a test: ``EVENT`` emits a task event whose message is the
task id; ``FINGERPRINT`` bumps the fingerprint's ``driver.streams.generation`` attribute and
calls notify_fingerprint_changed (the interval is an hour, so a prompt fingerprint proves the
notification). InspectTask's driver attributes count what the SDK holds: event and fingerprint
listeners, and the stats samples taken so far. A TaskStats sample carries its task's id and, as
its memory rss, the number of that task's samples taken so far (this one included), so a test
can tell that each stream gets a fresh sample of its own task.
"""

from __future__ import annotations

import heapq
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from driversdk import DriverPlugin, serve
from driversdk import hclspec as hs
from driversdk.errors import DriverError, TaskNotFoundError
from driversdk.model import (
    Capabilities,
    ExitResult,
    Fingerprint,
    HealthState,
    MemoryField,
    MemoryUsage,
    MountConfigSupport,
    ResourceUsage,
    TaskConfig,
    TaskEvent,
    TaskHandle,
    TaskState,
    TaskStats,
    TaskStatus,
)


@dataclass
class _Task:
    config: TaskConfig
    exit_code: int
    started_at: datetime
    done: threading.Event = field(default_factory=threading.Event)
    result: ExitResult | None = None
    watchers: list[Callable[[ExitResult], None]] = field(default_factory=list)
    samples: int = 0


class StreamsDriver(DriverPlugin):
    name = "streams"
    version = "0.1.0"
    fingerprint_interval = 3600.0

    def __init__(self, *, watch: bool) -> None:
        super().__init__()
        self._watch = watch
        self._tasks: dict[str, _Task] = {}
        self._lock = threading.Lock()
        self._generation = 0
        self._counts = {"event_listeners": 0, "fingerprint_listeners": 0, "stats_samples": 0}
        self._deadlines: list[tuple[float, str]] = []
        self._clock = threading.Condition(self._lock)
        threading.Thread(target=self._run_clock, daemon=True, name="clock").start()

    # --- what the SDK holds, counted for InspectTask -----------------------------------------

    def add_event_listener(self, listener: Callable[[TaskEvent], None]) -> None:
        with self._lock:
            self._counts["event_listeners"] += 1
        super().add_event_listener(listener)

    def remove_event_listener(self, listener: Callable[[TaskEvent], None]) -> None:
        with self._lock:
            self._counts["event_listeners"] -= 1
        super().remove_event_listener(listener)

    def add_fingerprint_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._counts["fingerprint_listeners"] += 1
        super().add_fingerprint_listener(listener)

    def remove_fingerprint_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._counts["fingerprint_listeners"] -= 1
        super().remove_fingerprint_listener(listener)

    # --- the driver --------------------------------------------------------------------------

    def task_config_schema(self) -> hs.Spec:
        return hs.obj({"seconds": hs.attr("number"), "exit_code": hs.attr("number")})

    def capabilities(self) -> Capabilities:
        return Capabilities(send_signals=True, exec=False, mount_configs=MountConfigSupport.NONE)

    def fingerprint(self) -> Fingerprint:
        with self._lock:
            generation = self._generation
        return Fingerprint(HealthState.HEALTHY, "Healthy", {"driver.streams.generation": str(generation)})

    def start_task(self, task: TaskConfig) -> TaskHandle:
        cfg = task.driver_config
        record = _Task(task, int(cfg.get("exit_code") or 0), datetime.now(UTC))
        with self._lock:
            self._tasks[task.id] = record
            if cfg.get("seconds") is not None:
                heapq.heappush(self._deadlines, (time.monotonic() + float(cfg["seconds"]), task.id))
                self._clock.notify()
        return TaskHandle(config=task, state=TaskState.RUNNING)

    def recover_task(self, handle: TaskHandle) -> None:
        with self._lock:
            if handle.config.id in self._tasks:
                return
        raise DriverError("make-believe tasks do not survive their plugin")

    def _get(self, task_id: str) -> _Task:
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            raise TaskNotFoundError(task_id)
        return task

    def _exit(self, task: _Task, result: ExitResult) -> None:
        with self._lock:
            if task.done.is_set():
                return
            task.result = result
            task.done.set()
            watchers, task.watchers = task.watchers, []
        for callback in watchers:
            callback(result)

    def _run_clock(self) -> None:
        while True:
            with self._clock:
                while not self._deadlines or self._deadlines[0][0] > time.monotonic():
                    self._clock.wait(self._deadlines[0][0] - time.monotonic() if self._deadlines else None)
                _, task_id = heapq.heappop(self._deadlines)
                task = self._tasks.get(task_id)
            if task is not None:
                self._exit(task, ExitResult(exit_code=task.exit_code))

    def wait_task(self, task_id: str) -> ExitResult:
        task = self._get(task_id)
        task.done.wait()
        assert task.result is not None
        return task.result

    def watch_exit(self, task_id: str, callback: Callable[[ExitResult], None]) -> bool:
        if not self._watch:
            return super().watch_exit(task_id, callback)
        task = self._get(task_id)
        with self._lock:
            if not task.done.is_set():
                task.watchers.append(callback)
                return True
        assert task.result is not None
        callback(task.result)
        return True

    def stop_task(self, task_id: str, timeout: float, signal: str) -> None:
        task = self._get(task_id)
        if signal == "IGNORED":
            # A task that ignores its stop signal: the stop waits out its kill timeout (or until
            # the task is destroyed meanwhile), as a real driver's does.
            task.done.wait(timeout)
        self._exit(task, ExitResult(exit_code=0, signal=15))

    def destroy_task(self, task_id: str, force: bool) -> None:
        task = self._get(task_id)
        self._exit(task, ExitResult(exit_code=0, signal=9))
        with self._lock:
            self._tasks.pop(task_id, None)

    def inspect_task(self, task_id: str) -> TaskStatus:
        task = self._get(task_id)
        with self._lock:
            counts = {name: str(count) for name, count in self._counts.items()}
        return TaskStatus(
            id=task_id,
            name=task.config.name,
            state=TaskState.EXITED if task.done.is_set() else TaskState.RUNNING,
            started_at=task.started_at,
            result=task.result,
            driver_attributes=counts,
        )

    def task_stats(self, task_id: str) -> TaskStats | None:
        task = self._get(task_id)
        if task.done.is_set():
            return None
        with self._lock:
            self._counts["stats_samples"] += 1
            task.samples += 1
            taken = task.samples
        usage = ResourceUsage(memory=MemoryUsage(rss=taken, measured_fields=(MemoryField.RSS,)))
        return TaskStats(timestamp=datetime.now(UTC), usage=usage, id=task_id)

    def signal_task(self, task_id: str, signal: str) -> None:
        task = self._get(task_id)
        if signal == "EVENT":
            self.emit_event(TaskEvent(task_id, task.config.alloc_id, task.config.name, task_id, datetime.now(UTC)))
        elif signal == "FINGERPRINT":
            with self._lock:
                self._generation += 1
            self.notify_fingerprint_changed()
        else:
            raise DriverError(f"unknown signal {signal!r}: EVENT or FINGERPRINT")


if __name__ == "__main__":
    serve(StreamsDriver(watch="--no-watch" not in sys.argv[1:]))
