"""Opening the directory that holds a relative path below a root, one component at a time and never
through a symbolic link: the only safe way to write a job's files (templates, artifacts) into a dir
that the job's own tasks may have filled with links."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from driversdk.errors import DriverSDKError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeStep(DriverSDKError):
    """A directory on the way is a symbolic link or not a directory, or (``missing``) is not there and
    was not to be made. The caller turns it into its own sentence; ``name`` is the component."""

    def __init__(self, name: str, *, missing: bool) -> None:
        super().__init__(name)
        self.name = name
        self.missing = missing


def open_parent(root: str, parts: Sequence[str], *, create: bool) -> int:
    """A descriptor of the directory holding ``parts[-1]`` below ``root``; each directory on the way is
    opened with O_NOFOLLOW, and made (0755) when missing if ``create``. The caller closes it."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for name in parts[:-1]:
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise UnsafeStep(name, missing=True) from None
                os.mkdir(name, 0o755, dir_fd=fd)
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeStep(name, missing=False) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd
