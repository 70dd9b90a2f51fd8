#!/usr/bin/env python3
"""The hello driver with two bugs that print a Python traceback on the plugin's stderr.

``command = "raise"``: StartTask raises an exception that is not a DriverError (the SDK logs
it with its traceback as one hclog line). ``command = "thread"``: a thread of the plugin dies
(Python prints the raw traceback block) and StartTask then refuses with a proper sentence.
Any other command runs as in the hello driver.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

from hello_driver import HelloDriver

from driversdk import serve
from driversdk.errors import DriverError
from driversdk.model import TaskConfig, TaskHandle


def _die() -> None:
    raise LookupError("crashing_driver: background thread died")


class CrashingDriver(HelloDriver):
    name = "crasher"

    def start_task(self, task: TaskConfig) -> TaskHandle:
        command = task.driver_config.get("command")
        if command == "raise":
            raise RuntimeError("crashing_driver: unexpected failure in start_task")
        if command == "thread":
            worker = threading.Thread(target=_die)
            worker.start()
            worker.join()
            raise DriverError("crashing_driver: the worker is gone")
        return super().start_task(task)


if __name__ == "__main__":
    serve(CrashingDriver())
