"""Opening a task's log fifos for writing: existing fifos only, never created."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time

from driversdk.errors import DriverError

DEV_NULL = "/dev/null"


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
            fd = _open_fifo(path, task=task, what=what)
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


def _open_fifo(path: str, *, task: str, what: str) -> int:
    """Open the fifo for writing without following a symlink or writing into anything else.

    The fifos sit in alloc/logs, which tasks of the allocation can write: a root plugin that
    followed a planted symlink (or opened a hard link to a host file) would write the task's output
    into a host file. The entry is pinned with O_PATH (which opens nothing, so a planted device
    cannot react), checked, then reopened through /proc/self/fd so the check and the open see the
    same inode."""
    pinned = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(pinned)
        if path != DEV_NULL and not stat.S_ISFIFO(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a fifo"
            raise DriverError(
                f"task {task!r}: {what} log path {path!r} is {kind}; refusing to write the task's output to it "
                "(something replaced the log collector's fifo)"
            )
        return os.open(f"/proc/self/fd/{pinned}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    finally:
        os.close(pinned)


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
