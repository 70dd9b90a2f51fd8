"""The hello driver's tests, written as a driver author writes them with driversdk's pytest plugin.

The plugin comes with driversdk (a ``pytest11`` entry point): no conftest, no imports of it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from driversdk.testing import AllocDir, DriverHarness
from driversdk.testing.pytest_plugin import Conformance, TaskConfigFactory


@pytest.fixture
def driver_command() -> list[str]:
    return [sys.executable, str(Path(__file__).resolve().parents[1] / "hello_driver.py")]


def hello_task(argv: Sequence[str]) -> Mapping[str, Any]:
    return {"command": argv[0], "args": list(argv[1:])}


def test_what_hello_advertises_is_true(conformance: Conformance) -> None:
    conformance(hello_task)


def test_hello_runs_a_command(
    driver_harness: DriverHarness, task_config_factory: TaskConfigFactory, alloc_dir: AllocDir
) -> None:
    task = task_config_factory(hello_task(["/bin/echo", "hi"]))
    driver_harness.start(task)
    assert driver_harness.client.wait_task(task.id, timeout=30).exit_code == 0
    assert b"hi" in alloc_dir.wait_for_output("task", b"hi")
