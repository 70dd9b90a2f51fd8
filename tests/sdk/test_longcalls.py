"""driversdk.longcalls: each long driver call has a thread to itself, a burst reuses the threads
an earlier burst left, and kept threads end once idle."""

from __future__ import annotations

import threading
import time

from driversdk.longcalls import LongCallThreads

BURST = 50
DEADLINE_S = 60.0


def _workers(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"{name}-") and not t.name.endswith("-starter")]


def _burst(threads: LongCallThreads, n: int) -> set[str]:
    """Submit ``n`` calls that each wait until all ``n`` run at once; the names of their threads."""
    all_in = threading.Barrier(n + 1)
    release = threading.Event()
    names: set[str] = set()
    lock = threading.Lock()

    def call() -> None:
        with lock:
            names.add(threading.current_thread().name)
        all_in.wait(DEADLINE_S)  # broken (the test fails) if any call waited behind another
        release.wait(DEADLINE_S)

    for _ in range(n):
        threads.submit(call)
    all_in.wait(DEADLINE_S)
    release.set()
    return names


def test_each_call_runs_at_once_on_its_own_thread_and_a_burst_reuses_them() -> None:
    threads = LongCallThreads("lc-test", keep_idle=DEADLINE_S)
    first = _burst(threads, BURST)
    assert len(first) == BURST
    deadline = time.monotonic() + DEADLINE_S
    while threads._idle < BURST:  # every call of the burst has returned to waiting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = _burst(threads, BURST)
    assert second == first, "the second burst ran on the threads the first one left"
    assert len(_workers("lc-test")) == BURST


def test_kept_threads_end_once_idle() -> None:
    threads = LongCallThreads("lc-idle", keep_idle=0.1)
    _burst(threads, 5)
    deadline = time.monotonic() + DEADLINE_S
    while _workers("lc-idle"):
        assert time.monotonic() < deadline, _workers("lc-idle")
        time.sleep(0.05)
    # A call after they ended gets a new thread.
    done = threading.Event()
    threads.submit(done.set)
    assert done.wait(DEADLINE_S)
