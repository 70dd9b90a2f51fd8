#!/usr/bin/env python3
"""A process driver with one author mistake, chosen by the MISTAKE environment variable."""

from __future__ import annotations

import os
from typing import Any

from driversdk import hclspec as hs
from driversdk import serve
from driversdk.model import Capabilities, ExecResult, ExitResult, Fingerprint, TaskConfig, TaskHandle, TaskStatus
from driversdk.taskkit.processdriver import ProcessDriver

MISTAKE = os.environ.get("MISTAKE", "")


class MistakenDriver(ProcessDriver):
    name = "mistaken"

    def task_config_schema(self) -> hs.Spec:
        if MISTAKE == "schema":
            return hs.obj({"command": hs.attr("strnig", required=True)})
        if MISTAKE == "schema_type":
            bad: Any = {"command": "string"}
            return bad  # type: ignore[no-any-return]
        return hs.obj({"command": hs.attr("string", required=True), "args": hs.attr("list(string)")})

    def command(self, task: TaskConfig) -> list[str]:
        return [task.driver_config["command"], *(task.driver_config.get("args") or [])]

    def capabilities(self) -> Capabilities:
        if MISTAKE == "capabilities_none":
            none: Any = None
            return none  # type: ignore[no-any-return]
        return super().capabilities()

    def fingerprint(self) -> Fingerprint:
        if MISTAKE == "fingerprint_dict":
            bad: Any = {"health": "healthy"}
            return bad  # type: ignore[no-any-return]
        return super().fingerprint()

    def start_task(self, task: TaskConfig) -> TaskHandle:
        if MISTAKE == "start_dict":
            bad: Any = {"id": task.id}
            return bad  # type: ignore[no-any-return]
        if MISTAKE == "start_raises":
            raise KeyError("command")
        return super().start_task(task)

    def wait_task(self, task_id: str) -> ExitResult:
        if MISTAKE == "wait_int":
            self.tasks.get(task_id).exit.wait()
            bad: Any = 0
            return bad  # type: ignore[no-any-return]
        return super().wait_task(task_id)

    def watch_exit(self, task_id: str, callback: Any) -> bool:
        if MISTAKE == "wait_int":
            return False  # served by wait_task
        return super().watch_exit(task_id, callback)

    def inspect_task(self, task_id: str) -> TaskStatus:
        if MISTAKE == "inspect_dict":
            bad: Any = {"state": "running"}
            return bad  # type: ignore[no-any-return]
        return super().inspect_task(task_id)

    def signal_task(self, task_id: str, signal_name: str) -> None:
        if MISTAKE == "signal_raises":
            raise RuntimeError("boom")
        super().signal_task(task_id, signal_name)

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        if MISTAKE == "exec_tuple":
            bad: Any = (b"out", b"", 0)
            return bad  # type: ignore[no-any-return]
        return super().exec_task(task_id, command, timeout)


if __name__ == "__main__":
    serve(MistakenDriver())
