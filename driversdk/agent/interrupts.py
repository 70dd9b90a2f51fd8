"""The operator's interrupts of ``driversdk run`` (Ctrl-C, SIGTERM) as seen by its CSI work.

The first interrupt cancels the CSI calls of setup (a claim waiting for its plugin, a publish that
does not answer) so the run moves to teardown at once; teardown's calls (node unpublish, unstage,
controller unpublish) are then still made, each with a short deadline. A second interrupt cancels
those too: what is left stays recorded as a past claim, for the volume watcher of a later command
or ``driversdk volume detach``.

Signal handlers only queue the interrupt (``SimpleQueue.put`` may be called from one); a thread of
the run does the cancelling, which takes locks. ``close()`` ends that thread.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

from driversdk.csi.cancel import Cancel

# Each CSI call of a run's release of its claims, retries included: a plugin that does not answer
# must not hold the run's exit (the volume watcher of a later command tries again).
TEARDOWN_CALL_TIMEOUT = 30.0
# ... once the operator has interrupted the run: they are waiting for it to end.
INTERRUPTED_CALL_TIMEOUT = 10.0


class RunInterrupts:
    def __init__(self, data_dir: str, on_interrupt: Callable[[int], None] | None = None) -> None:
        self.data_dir = data_dir
        self.setup = Cancel("interrupted")
        self.teardown = Cancel("teardown abandoned after a second interrupt")
        self.count = 0
        self._on_interrupt = on_interrupt or (lambda _: None)
        self._queue: queue.SimpleQueue[bool] = queue.SimpleQueue()
        # Daemon only as a backstop: run_jobs closes it on every path it reaches after start().
        self._thread = threading.Thread(target=self._loop, name="run interrupts", daemon=True)
        self._thread.start()

    def signal(self) -> None:
        """Record an interrupt; safe in a signal handler."""
        self._queue.put(True)

    def _loop(self) -> None:
        while self._queue.get():
            self.interrupt()

    def interrupt(self) -> None:
        self.count += 1
        (self.setup if self.count == 1 else self.teardown).cancel()
        self._on_interrupt(self.count)

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def call_timeout(self) -> float:
        return INTERRUPTED_CALL_TIMEOUT if self.interrupted else TEARDOWN_CALL_TIMEOUT

    def close(self) -> None:
        self._queue.put(False)
        self._thread.join(5)


_runs: dict[str, RunInterrupts] = {}
_runs_lock = threading.Lock()


def start(data_dir: str, on_interrupt: Callable[[int], None] | None = None) -> RunInterrupts:
    """The interrupts of the run of this data dir (one run per data dir and process)."""
    run = RunInterrupts(os.path.abspath(data_dir), on_interrupt)
    with _runs_lock:
        _runs[run.data_dir] = run
    return run


def stop(run: RunInterrupts) -> None:
    with _runs_lock:
        if _runs.get(run.data_dir) is run:
            del _runs[run.data_dir]
    run.close()


def of(data_dir: str) -> RunInterrupts | None:
    """The run of this data dir in this process, if one is running (``driversdk volume`` has none)."""
    with _runs_lock:
        return _runs.get(os.path.abspath(data_dir))
