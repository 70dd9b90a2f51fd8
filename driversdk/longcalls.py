"""Threads for the driver calls that may take long (StartTask, StopTask, DestroyTask, ExecTask).

Each such call has a thread to itself for as long as it runs: it never waits in a queue behind
another long call (a job of 1000 tasks stopping issues 1000 StopTask calls, each waiting out a
kill timeout). The threads are kept for a while after their call, and a call takes a kept one
when there is one: a burst of calls starts threads once, not once a call. The caller (the
plugin's event loop) never waits for a thread to start either; a starter thread of its own does
that. Before this, the loop started a thread per call and waited until it ran, which under a
busy interpreter lock took milliseconds a call: 2000 calls of a 1000-task teardown queued behind
that wait while the driver sat idle.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

log = logging.getLogger("driversdk.longcalls")

# How long a thread whose call ended waits for the next one before it ends.
KEEP_IDLE_S = 10.0


class LongCallThreads:
    """Run each submitted function on a thread of its own (a kept one when one is idle)."""

    def __init__(self, name: str = "long-call", keep_idle: float = KEEP_IDLE_S) -> None:
        self._name = name
        self._keep_idle = keep_idle
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # work came (the kept threads wait on it)
        self._wanted = threading.Condition(lock)  # a thread is wanted (the starter waits on it)
        self._work: collections.deque[Callable[[], None]] = collections.deque()
        self._idle = 0  # threads waiting for work
        self._to_start = 0  # threads asked of the starter and not started yet
        self._started = 0
        self._starter: threading.Thread | None = None

    def submit(self, fn: Callable[[], None]) -> None:
        """Have ``fn`` run now on a thread of its own; returns without waiting for any thread."""
        with self._cond:
            self._work.append(fn)
            if self._idle + self._to_start >= len(self._work):
                self._cond.notify()  # a kept thread (or one on its way) takes it
                return
            self._to_start += 1
            if self._starter is None:
                self._starter = threading.Thread(target=self._start_threads, name=f"{self._name}-starter", daemon=True)
                starter = self._starter
            else:
                starter = None
            self._wanted.notify()
        if starter is not None:
            starter.start()  # once per process: the first long call pays for it

    def _start_threads(self) -> None:
        while True:
            with self._wanted:
                while not self._to_start:
                    self._wanted.wait()
            # Started outside the lock: Thread.start waits until the thread runs.
            self._started += 1
            worker = threading.Thread(target=self._serve, name=f"{self._name}-{self._started}", daemon=True)
            worker.start()
            with self._cond:
                self._to_start -= 1
                self._idle += 1

    def _serve(self) -> None:
        """Counted idle by the starter; takes work until none comes for ``keep_idle`` seconds."""
        with self._cond:
            while True:
                while not self._work:
                    if not self._cond.wait(self._keep_idle) and not self._work:
                        self._idle -= 1
                        return
                fn = self._work.popleft()
                self._idle -= 1
                self._cond.release()
                try:
                    fn()
                except BaseException:  # fn reports its own outcome; this keeps the thread serving
                    log.exception("a long driver call raised past its own handler")
                finally:
                    self._cond.acquire()
                    self._idle += 1
