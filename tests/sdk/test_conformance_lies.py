"""The conformance kit against drivers that lie: each lie is caught, with its sentence.

The liar (tests/sdk/plugins/lies_driver.py) is a correct ProcessDriver with one method changed,
chosen by LIE; it runs as a real plugin subprocess through the go-plugin handshake.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from driversdk.testing import DriverHarness
from driversdk.testing.conformance import CheckResult, run_conformance

LIAR = [sys.executable, str(Path(__file__).resolve().parent / "plugins" / "lies_driver.py")]


def argv_task(argv: Sequence[str]) -> Mapping[str, Any]:
    return {"command": argv[0], "args": list(argv[1:])}


def _results(lie: str, tmp_path: Path) -> dict[str, CheckResult]:
    with DriverHarness(LIAR, env={**os.environ, "LIE": lie}) as h:
        results = run_conformance(h, argv_task, str(tmp_path), timeout=30)
    return {r.name: r for r in results}


@pytest.mark.parametrize(
    ("lie", "check", "seen", "fix"),
    [
        (
            "signals",
            "send_signals",
            "SignalTask(SIGUSR1) succeeded but the task's trap never ran",
            "deliver the signal",
        ),
        ("stop_no_kill", "StopTask kills after its timeout", "a task ignoring SIGTERM still ran", "kill the task"),
        ("stop_kill_at_once", "StopTask sends the signal first", "a task that exits 0 on SIGTERM", "send the signal"),
        ("destroy", "DestroyTask(force) removes a running task", "still runs 5 s after DestroyTask", "kill the task"),
        ("inspect", "InspectTask reports the real state", "after it exited 3: RUNNING", "from the task's real state"),
        ("recover", "RecoverTask after a plugin restart", "RecoverTask answered", "reattach to the task"),
        ("stats", "TaskStats streams real numbers", "all read 0", "raise NotSupportedError"),
        ("exec", "exec", "ExecTask: UNIMPLEMENTED", "advertise exec=False"),
        ("mounts", "a TaskConfig mount is visible in the task", "could not read /conformance/probe", "NONE"),
    ],
)
def test_the_kit_catches_the_lie(lie: str, check: str, seen: str, fix: str, tmp_path: Path) -> None:
    by_name = _results(lie, tmp_path)
    result = by_name[check]
    assert not result.passed, str(result)
    block = str(result)
    assert block.startswith(f"FAIL {check}: ")
    assert seen in result.detail, block
    assert fix in result.fix, block
    assert "advertised: " in block and "change: " in block
    # One lie, one failure: every other check still passes (a lie about stop may also break
    # the checks that stop a task to see its exit).
    others = [str(r) for r in by_name.values() if not r.passed and r.name != check]
    if lie not in ("stop_no_kill", "stop_kill_at_once"):
        assert not others, "\n".join(others)
