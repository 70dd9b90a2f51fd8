#!/usr/bin/env python3
"""A process driver that tells one lie, chosen by the LIE environment variable; the kit must catch it."""

from __future__ import annotations

import os
from datetime import UTC, datetime

from driversdk import hclspec as hs
from driversdk import serve
from driversdk.errors import DriverError, NotSupportedError
from driversdk.model import (
    Capabilities,
    ExecResult,
    MountConfigSupport,
    ResourceUsage,
    TaskConfig,
    TaskHandle,
    TaskState,
    TaskStats,
    TaskStatus,
)
from driversdk.taskkit.processdriver import ProcessDriver

LIE = os.environ.get("LIE", "")


class LiarDriver(ProcessDriver):
    name = "liar"

    def task_config_schema(self) -> hs.Spec:
        return hs.obj({"command": hs.attr("string", required=True), "args": hs.attr("list(string)")})

    def command(self, task: TaskConfig) -> list[str]:
        return [task.driver_config["command"], *(task.driver_config.get("args") or [])]

    def capabilities(self) -> Capabilities:
        caps = super().capabilities()
        if LIE == "mounts":
            return Capabilities(send_signals=caps.send_signals, exec=caps.exec, mount_configs=MountConfigSupport.ALL)
        return caps

    def signal_task(self, task_id: str, signal_name: str) -> None:
        if LIE == "signals":
            return  # claims success, delivers nothing
        super().signal_task(task_id, signal_name)

    def stop_task(self, task_id: str, timeout: float, signal_name: str) -> None:
        if LIE == "stop_no_kill":
            self._signal(self.tasks.get(task_id), signal_name or "SIGTERM")
            self.tasks.get(task_id).exit.wait(timeout)  # and never kills
            return
        if LIE == "stop_kill_at_once":
            self._kill(self.tasks.get(task_id))  # no signal, no timeout
            return
        super().stop_task(task_id, timeout, signal_name)

    def destroy_task(self, task_id: str, force: bool) -> None:
        if LIE == "destroy":
            self.tasks.remove(task_id)  # forgets the task, leaves it running
            return
        super().destroy_task(task_id, force)

    def inspect_task(self, task_id: str) -> TaskStatus:
        if LIE == "inspect":
            record = self.tasks.get(task_id)
            return TaskStatus(task_id, record.task.name, TaskState.RUNNING, started_at=record.started_at)
        return super().inspect_task(task_id)

    def recover_task(self, handle: TaskHandle) -> None:
        if LIE == "recover":
            raise DriverError(f"task {handle.config.name!r} cannot be recovered")
        super().recover_task(handle)

    def task_stats(self, task_id: str) -> TaskStats | None:
        if LIE == "stats":
            self.tasks.get(task_id)
            return TaskStats(timestamp=datetime.now(UTC), usage=ResourceUsage())
        return super().task_stats(task_id)

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        if LIE == "exec":
            raise NotSupportedError(self.name, "exec")
        return super().exec_task(task_id, command, timeout)


if __name__ == "__main__":
    serve(LiarDriver())
