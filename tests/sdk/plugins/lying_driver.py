#!/usr/bin/env python3
"""The hello driver, but advertising exec while not implementing it: the kit must notice."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

from hello_driver import HelloDriver

from driversdk import serve
from driversdk.errors import NotSupportedError
from driversdk.model import ExecResult


class LyingDriver(HelloDriver):
    name = "liar"

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        raise NotSupportedError(self.name, "exec")


if __name__ == "__main__":
    serve(LyingDriver())
