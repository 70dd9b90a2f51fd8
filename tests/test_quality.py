"""The project's own standards, enforced: ruff clean, formatted, and mypy --strict clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ["driversdk", "drivers"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_is_clean() -> None:
    done = _run("ruff", "check", *CODE, "tests", "examples", "bench")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean() -> None:
    done = _run("ruff", "format", "--check", *CODE, "tests", "examples", "bench")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_is_clean() -> None:
    done = _run("mypy", "--strict", *CODE)
    assert done.returncode == 0, done.stdout + done.stderr
