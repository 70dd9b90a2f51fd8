"""driversdk.codeid: a run server serves only commands whose context key equals its own, so the
key must tell apart what would make a forked copy behave differently, and nothing else. Real
interpreters, a real network namespace and real source-file stats."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRINT_KEY = "from driversdk.codeid import context_key; print(context_key())"


def key(*prefix: str, flags: tuple[str, ...] = ()) -> str:
    done = subprocess.run(
        [*prefix, sys.executable, *flags, "-c", PRINT_KEY], capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_same_context_gives_the_same_key() -> None:
    assert key() == key()


@pytest.mark.parametrize("flags", [("-W", "error"), ("-X", "utf8"), ("-O",), ("-X", "importtime")])
def test_interpreter_options_change_the_key(flags: tuple[str, ...]) -> None:
    assert key(flags=flags) != key()


@pytest.mark.root
@pytest.mark.parametrize("namespace", ["--net", "--uts", "--ipc"])
def test_another_namespace_changes_the_key(namespace: str) -> None:
    assert key("unshare", namespace) != key()


@pytest.mark.root
def test_lower_resource_limits_change_the_key() -> None:
    assert key("prlimit", "--nofile=512:512") != key()


def test_an_edit_of_the_code_changes_the_key() -> None:
    source = ROOT / "driversdk" / "codeid.py"
    before = source.stat()
    first = key()
    try:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
        assert key() != first
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert key() == first
