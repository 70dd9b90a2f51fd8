"""Opening a task's log fifos for writing: existing fifos only, never created."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time

from driversdk.errors import DriverError
from driversdk.logfifo import DEV_NULL, open_fifo_for_writing


def open_log(path: str, *, task: str, what: str, timeout: float) -> int:
    """Open ``path`` write-only without creating it; waits up to ``timeout`` for a reader.

    A fifo refuses a non-blocking writer (ENXIO) until its reader (Nomad's logmon) has opened
    it; polling that way keeps StartTask from hanging forever on a fifo nobody reads.
    """
    if not path:
        path = DEV_NULL
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = open_fifo_for_writing(path, task=task, what=what)
            break
        except FileNotFoundError:
            raise DriverError(
                f"task {task!r}: {what} log path {path!r} does not exist; the log collector must create the fifo "
                "before the task starts",
                recoverable=True,
            ) from None
        except OSError as err:
            if err.errno != errno.ENXIO or time.monotonic() > deadline:
                raise DriverError(
                    f"task {task!r}: {what} log fifo {path!r} has no reader after {timeout:.0f}s; "
                    "check that the log collector is running",
                    recoverable=True,
                ) from None
            time.sleep(0.02)
    # The task's writes should block when the reader is slow, not fail with EAGAIN.
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    return fd


def open_logs(stdout: str, stderr: str, *, task: str, disabled: bool, timeout: float = 10.0) -> tuple[int, int]:
    if disabled:
        stdout = stderr = DEV_NULL
    out = open_log(stdout, task=task, what="stdout", timeout=timeout)
    try:
        err = open_log(stderr, task=task, what="stderr", timeout=timeout)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(out)
        raise
    return out, err
