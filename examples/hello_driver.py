#!/usr/bin/env python3
"""A minimal third-party-style driver: runs a host command with no isolation.

It shows a small honest driver: a plugin config (a greeting, shown in its fingerprint and in
an event per started task), a task config schema, the argv to run, and ``serve()``.
:class:`~driversdk.taskkit.processdriver.ProcessDriver` does the lifecycle, signals, exec,
stats and recovery; the default capabilities claim exactly that (no mounts, no isolation).

Install it into Nomad's plugin_dir as an executable named ``hello``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from driversdk import hclspec as hs
from driversdk import serve
from driversdk.model import Fingerprint, HealthState, TaskConfig, TaskEvent, TaskHandle
from driversdk.taskkit.processdriver import ProcessDriver

log = logging.getLogger("hello")


class HelloDriver(ProcessDriver):
    name = "hello"
    version = "0.1.0"

    def __init__(self) -> None:
        super().__init__()
        self._greeting = "hello"

    def config_schema(self) -> hs.Spec:
        return hs.obj({"greeting": hs.default(hs.attr("string"), hs.literal('"hello"'))})

    def set_config(self, config: dict[str, object], agent: object) -> None:
        self._greeting = str(config.get("greeting") or "hello")

    def task_config_schema(self) -> hs.Spec:
        return hs.obj({"command": hs.attr("string", required=True), "args": hs.attr("list(string)")})

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(HealthState.HEALTHY, "Healthy", {"driver.hello.greeting": self._greeting})

    def command(self, task: TaskConfig) -> list[str]:
        cfg = task.driver_config
        return [str(cfg["command"]), *[str(a) for a in cfg.get("args") or []]]

    def start_task(self, task: TaskConfig) -> TaskHandle:
        handle = super().start_task(task)
        pid = self.tasks.get(task.id).state.pid
        self.emit_event(
            TaskEvent(task.id, task.alloc_id, task.name, f"{self._greeting}: started pid {pid}", datetime.now(UTC))
        )
        return handle


def main() -> None:
    serve(HelloDriver())


if __name__ == "__main__":
    main()
