"""`driversdk plugin test`: the conformance kit from the command line, against real plugin subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LIAR = str(Path(__file__).resolve().parent / "plugins" / "lies_driver.py")
TASK = '{"command": "$0", "args": "$@"}'


def _plugin_test(*extra: str, lie: str = "", timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DRIVERSDK_VERBOSE"}
    env["LIE"] = lie
    return subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "plugin", "test", "--task", TASK, *extra, "--", sys.executable, LIAR],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_a_lie_is_one_failing_block_and_exit_1_without_grpc_noise() -> None:
    done = _plugin_test(lie="signals")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    checks = [line for line in lines if line.startswith(("ok   ", "FAIL "))]
    assert len(checks) == 13, done.stdout
    [fail] = [line for line in checks if line.startswith("FAIL ")]
    assert fail.startswith("FAIL send_signals: SignalTask(SIGUSR1) succeeded but the task's trap never ran")
    block = done.stdout[done.stdout.index(fail) :].splitlines()[:3]
    assert block[1].strip().startswith("advertised: send_signals=True")
    assert block[2].strip().startswith("change:")
    assert "DEBUG" not in done.stdout + done.stderr and "grpc" not in done.stderr.lower()


def test_an_honest_driver_passes_every_check_with_exit_0() -> None:
    done = _plugin_test()
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(line.startswith("ok   ") for line in done.stdout.splitlines()), done.stdout


def test_a_task_template_without_the_command_is_refused_in_one_sentence() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "plugin", "test", "--task", '{"command": "sh"}', "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith('error: --task must use "$0" where the command to run goes')
    assert done.stderr.count("\n") == 1
