"""Log collection hook: the task's stdout/stderr fifos, served by the data dir's one collector
process that rotates them into ``alloc/logs/<task>.stdout.N`` (the task's ``logs {}`` limits),
unless the task or its driver disables it. A recovered task is added again to the collector a
killed run left (or to a new one when it died). What the collector refused (a planted symlink,
say) becomes a task event, read by the one poller thread of this process for every task."""

from __future__ import annotations

import os

from driversdk.agent.allocrunner.hooks import TaskHook
from driversdk.agent.allocrunner.hooks.contract import (
    TaskInfo,
    TaskPostrunRequest,
    TaskPoststartRequest,
    TaskPoststartResponse,
    TaskPrerunRequest,
    TaskPrerunResponse,
)
from driversdk.agent.logmon import tasklogs as logcollect
from driversdk.agent.logmon.tasklogs import MIB
from driversdk.paths import UnsafePathError, check_name


class LogCollectionHook(TaskHook):
    name = "log collection"

    def prerun(self, req: TaskPrerunRequest) -> TaskPrerunResponse:
        task = req.task
        logs = os.path.join(task.alloc.alloc_dir, "alloc", "logs")
        record = req.restoring
        if record is not None:
            if not record.logmon_pid:
                return TaskPrerunResponse()
            logmon = logcollect.Logmon(record.logmon_pid, *logcollect.fifo_paths(logs, task.task.name))
            if record.state in ("running", "restarting"):
                # Added again: a no-op for the collector that still serves it, everything for
                # one that replaced it (or a per-task collector of an older release, stopped).
                logmon = self._spawn(task, logs, legacy_pid=record.logmon_pid)
                if logmon.pid != record.logmon_pid:
                    task.alloc.services.state.set_logmon(task.alloc.alloc_id, task.task.name, logmon.pid)
            return TaskPrerunResponse(logmon=logmon)
        if task.task.logs_disabled or task.caps.disable_log_collection:
            return TaskPrerunResponse()
        problem = check_name(task.task.name, "task name")
        if problem is not None:  # the collector's file names start with the task name
            raise UnsafePathError(f'task "{task.task.name}": {problem}')
        return TaskPrerunResponse(logmon=self._spawn(task, logs))

    @staticmethod
    def _spawn(task: TaskInfo, logs: str, legacy_pid: int = 0) -> logcollect.Logmon:
        t = task.task
        return logcollect.spawn(logs, t.name, t.logs_max_files, t.logs_max_file_size * MIB, legacy_pid=legacy_pid)

    def poststart(self, req: TaskPoststartRequest) -> TaskPoststartResponse:
        if req.logmon is not None:
            event = req.task.event
            logcollect.watch_events(req.logmon, lambda sentence: event(f"event: {sentence}"))
        return TaskPoststartResponse()

    def postrun(self, req: TaskPostrunRequest) -> None:
        if req.logmon is not None:
            logcollect.unwatch_events(req.logmon)
            logcollect.stop(req.logmon)
            for sentence in logcollect.new_events(req.logmon):  # what the collector reported while draining
                req.task.event(f"event: {sentence}")
