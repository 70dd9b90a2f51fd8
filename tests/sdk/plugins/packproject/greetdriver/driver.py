"""Runs a host command; its fingerprint shows the idna version it was packaged with."""

from __future__ import annotations

import idna

from driversdk import hclspec as hs
from driversdk.model import Fingerprint, HealthState, TaskConfig
from driversdk.taskkit.processdriver import ProcessDriver


class GreetDriver(ProcessDriver):
    name = "greet"
    version = "0.2.0"

    def task_config_schema(self) -> hs.Spec:
        return hs.obj({"command": hs.attr("string", required=True), "args": hs.attr("list(string)")})

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(
            HealthState.HEALTHY, "Healthy", {"driver.greet.idna": idna.__version__, "driver.greet.file": __file__}
        )

    def command(self, task: TaskConfig) -> list[str]:
        cfg = task.driver_config
        return [str(cfg["command"]), *[str(a) for a in cfg.get("args") or []]]
