"""Log collection hook: the task's stdout/stderr fifos and the detached collector that rotates
them into ``alloc/logs/<task>.stdout.N`` (the task's ``logs {}`` limits), unless the task or its
driver disables it. A recovered task adopts the collector a killed run left (or a new one when
it died). What the collector refused (a planted symlink, say) becomes a task event."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from driversdk.paths import UnsafePathError, check_name
from driversdk.runner import logcollect
from driversdk.runner.hooks import TaskHook
from driversdk.runner.logcollect import MIB

if TYPE_CHECKING:
    from driversdk.runner.taskrunner import TaskRunner

EVENT_POLL = 0.5


class LogCollectionHook(TaskHook):
    name = "log collection"

    def prerun(self, task: TaskRunner) -> None:
        logs = os.path.join(task.alloc.alloc_dir, "alloc", "logs")
        record = task.restoring
        if record is not None:
            if record.logmon_pid:
                task.logmon = logcollect.Logmon(record.logmon_pid, *logcollect.fifo_paths(logs, task.task.name))
            if (
                task.logmon is not None
                and record.state in ("running", "restarting")
                and not logcollect.alive(task.logmon)
            ):
                task.logmon = self._spawn(task, logs)
                task.alloc.state.set_logmon(task.alloc.alloc_id, task.task.name, task.logmon.pid)
            return
        if task.task.logs_disabled or task.caps.disable_log_collection:
            return
        problem = check_name(task.task.name, "task name")
        if problem is not None:  # the collector's file names start with the task name
            raise UnsafePathError(f'task "{task.task.name}": {problem}')
        task.logmon = self._spawn(task, logs)

    @staticmethod
    def _spawn(task: TaskRunner, logs: str) -> logcollect.Logmon:
        t = task.task
        return logcollect.spawn(logs, t.name, t.logs_max_files, t.logs_max_file_size * MIB)

    def poststart(self, task: TaskRunner) -> None:
        threading.Thread(target=self._report, args=(task, task.done), daemon=True, name="logmon-events").start()

    def postrun(self, task: TaskRunner) -> None:
        if task.logmon is not None:
            logcollect.stop(task.logmon)
            self._report(task)  # what the collector reported while draining

    @staticmethod
    def _report(task: TaskRunner, until: threading.Event | None = None) -> None:
        """The collector outlives this process, so it reports through a file in the task's private
        dir; with ``until``, keep polling it until that is set."""
        while task.logmon is not None:
            for sentence in logcollect.new_events(task.logmon):
                task.event(f"event: {sentence}")
            if until is None or until.wait(EVENT_POLL):
                return
