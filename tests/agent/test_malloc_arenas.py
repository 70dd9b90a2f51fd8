"""The agent caps glibc's malloc arenas (driversdk.mallocarenas): threads that allocate at once
share two arenas instead of getting up to eight per core that keep what they freed. Checked in a
real process with glibc's own report (malloc_stats, on stderr), with and without the cap."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

PROGRAM = """
import ctypes, sys, threading
from driversdk.mallocarenas import limit_malloc_arenas
if sys.argv[1] == "capped":
    assert limit_malloc_arenas()
start = threading.Barrier(16)
def churn():
    start.wait()
    for _ in range(3000):
        blocks = [bytearray(4096 + i) for i in range(32)]  # above pymalloc's 512 bytes: glibc's
        del blocks
threads = [threading.Thread(target=churn) for _ in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(None).malloc_stats()
"""


def arenas(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return len(re.findall(r"^Arena \d+:", done.stderr, re.MULTILINE))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_threads_allocating_at_once_share_at_most_the_capped_arenas() -> None:
    # The main arena plus at most one more: mallopt(M_ARENA_MAX, 2).
    assert arenas("capped") <= 2
    # Without the cap the same program spreads over more (what the agent held before).
    assert arenas("default") > 2
