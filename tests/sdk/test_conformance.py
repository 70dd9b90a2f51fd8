"""The conformance kit against the example hello driver, and against a driver that lies."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from driversdk.testing import DriverHarness
from driversdk.testing.conformance import run_conformance

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HERE = Path(__file__).resolve().parent


def hello_task(argv: Sequence[str]) -> Mapping[str, Any]:
    return {"command": argv[0], "args": list(argv[1:])}


def test_conformance_hello_driver_claims_are_true(tmp_path: Path) -> None:
    with DriverHarness([sys.executable, str(EXAMPLES / "hello_driver.py")]) as h:
        results = run_conformance(h, hello_task, str(tmp_path), timeout=30)
    failed = [str(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)
    names = {r.name for r in results}
    assert {"send_signals", "exec", "wait returns the exit code", "stdout reaches the log fifo"} <= names


def test_conformance_catches_a_driver_that_claims_exec_it_lacks(tmp_path: Path) -> None:
    with DriverHarness([sys.executable, str(HERE / "plugins" / "lying_driver.py")]) as h:
        results = run_conformance(h, hello_task, str(tmp_path), timeout=30)
    by_name = {r.name: r for r in results}
    assert not by_name["exec"].passed
    assert "UNIMPLEMENTED" in by_name["exec"].detail
    assert by_name["send_signals"].passed
