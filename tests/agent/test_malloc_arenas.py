"""The agent caps glibc's malloc arenas (driversdk.mallocarenas): threads that allocate at once
share two arenas instead of getting up to eight per core that keep what they freed. Checked in a
real process with glibc's own report (malloc_stats, on stderr), with and without the cap."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.agent.runs import ROOT

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


TRIM_PROGRAM = """
import re, sys
from driversdk.mallocarenas import give_back_freed_memory
def rss_kib():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
blocks = [bytearray(4000) for _ in range(50000)]  # ~200 MB of glibc heap (above pymalloc's blocks)
pin = bytearray(4000)  # allocated last: the heap's top stays in use, so free() alone trims nothing
del blocks
if sys.argv[1] == "trim":
    assert give_back_freed_memory()
print(rss_kib())
"""


def rss_after(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", TRIM_PROGRAM, mode], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_heap_a_torn_down_job_freed_goes_back_to_the_kernel() -> None:
    kept, given_back = rss_after("keep"), rss_after("trim")
    assert kept > 150_000, kept  # KiB: what the agent held after a big job before
    assert given_back < kept // 4, (given_back, kept)
