"""Opening a task's log fifo for writing, as a root driver must: never through a planted link.

The fifos sit in the allocation's ``alloc/logs``, which every task of the allocation can write.
A driver that followed a symlink (or opened a hard link to a host file) put there by a task would
write another task's output into a host file as root. The entry is pinned with O_PATH (which opens
nothing, so a planted device cannot react), checked to be a fifo, then reopened through
/proc/self/fd, so the check and the open see the same inode.
"""

from __future__ import annotations

import os
import stat

from driversdk.errors import DriverError

DEV_NULL = "/dev/null"


class NotAFifoError(DriverError):
    """The log path is not the fifo the log collector made."""


def open_fifo_for_writing(path: str, *, task: str, what: str) -> int:
    """A non-blocking write-only fd on the fifo at ``path``.

    Raises :class:`NotAFifoError` with an operator sentence for a symlink or anything but a fifo
    (``/dev/null`` is allowed: it is what a host passes when logs are disabled), and the open's
    own OSError otherwise (ENOENT before the collector made the fifo, ENXIO before it reads).
    """
    pinned = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(pinned)
        if path != DEV_NULL and not stat.S_ISFIFO(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a fifo"
            raise NotAFifoError(
                f"task {task!r}: {what} log path {path!r} is {kind}; refusing to write the task's output to it "
                "(something replaced the log collector's fifo)"
            )
        return os.open(f"/proc/self/fd/{pinned}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    finally:
        os.close(pinned)
