"""Wait for a child process to exit, with a timeout, and learn of the exit when it happens.

``Popen.wait(timeout)`` polls with sleeps that double up to 50 ms, so a child that exits a moment
after the wait began is noticed up to 50 ms late; a host that stops a plugin or a log collector
pays that on every stop. A pidfd (Linux 5.3+) becomes readable the moment the process exits, so
this waits exactly that long, then reaps it through ``Popen`` (which keeps its bookkeeping).
Without pidfds it falls back to ``Popen.wait``.
"""

from __future__ import annotations

import os
import select
import subprocess


def wait_child(child: subprocess.Popen[bytes], timeout: float) -> bool:
    """True once ``child`` has exited and been reaped, waiting at most ``timeout`` seconds."""
    if child.poll() is not None:
        return True
    try:
        fd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):  # no pidfd_open (old kernel or Python): poll as Popen does
        try:
            child.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        exited = bool(poller.poll(max(0, int(timeout * 1000))))
    finally:
        os.close(fd)
    if not exited:
        return child.poll() is not None
    child.wait()  # exited: reaps at once
    return True
