"""Letting a task's user write its own dirs, as Nomad does for tasks that run as a host user.

Nomad's client creates every task dir world-writable (0777, owned by nobody) so any task user
can write them. Here a task's own dirs become its user's (``local/``, ``secrets/``, ``tmp/``,
mode otherwise kept), and the allocation's shared ``alloc/data`` and ``alloc/tmp``, when the
user could not write them, get /tmp's mode 1777: every task of the group can write there but
none can remove another's files. Nothing is followed: a symlink a task planted where one of
these dirs should be is refused.
"""

from __future__ import annotations

import contextlib
import os
import stat

from driversdk.errors import DriverError
from driversdk.model import TaskConfig

SHARED_MODE = 0o1777


def _open_dir(path: str, *, task: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise DriverError(
            f"task {task!r}: {path!r} is not a directory ({err.strerror}); refusing to hand it to the task's user"
        ) from None


def grant_task_dirs(task: TaskConfig, uid: int, gid: int) -> None:
    """Make the task's dirs writable by ``uid``/``gid``; nothing to do for root."""
    if uid == 0:
        return
    for path in (task.local_dir, task.secrets_dir, os.path.join(task.task_dir, "tmp")):
        fd = _open_dir(path, task=task.name)
        if fd is None:
            continue
        try:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | stat.S_IRWXU)
        finally:
            os.close(fd)
    for path in (os.path.join(task.shared_alloc_dir, "data"), os.path.join(task.shared_alloc_dir, "tmp")):
        fd = _open_dir(path, task=task.name)
        if fd is None:
            continue
        try:
            st = os.fstat(fd)
            writable = st.st_uid == uid and st.st_mode & stat.S_IWUSR
            if not writable and not st.st_mode & stat.S_IWOTH:
                with contextlib.suppress(PermissionError):
                    os.fchmod(fd, SHARED_MODE)
        finally:
            os.close(fd)
