"""Files of an allocation's directory as Nomad's ``/v1/client/fs/ls`` and ``/v1/client/fs/cat``
read them, without ever leaving the directory.

Tasks write into the allocation directory (``alloc/``, their own task dir), so any name in it may
be a symlink a task planted to a host file. Each path component is therefore opened relative to
its parent with ``O_NOFOLLOW``: a symlink is listed but never followed, and ``..`` is refused
before anything is opened. A task's ``secrets`` directory is never read, as in Nomad.
"""

from __future__ import annotations

import datetime
import errno
import os
import stat
from dataclasses import dataclass
from typing import Any

from driversdk.errors import DriverSDKError

# The most ``cat`` returns at once; a log is read through the logs endpoint, which streams.
MAX_CAT = 16 * 1024 * 1024


class AllocFSError(DriverSDKError):
    """A path the allocation directory cannot answer, with Nomad's status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class _Walked:
    parent: int  # the directory holding ``name`` (the caller closes it)
    name: str  # "" for the allocation directory itself


def _parts(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise AllocFSError(400, "Path escapes the alloc directory")
    if len(parts) >= 2 and parts[1] == "secrets":
        raise AllocFSError(403, "Reading secret file prohibited")
    return parts


def _walk(alloc_dir: str, path: str) -> _Walked:
    parts = _parts(path)
    try:
        fd = os.open(alloc_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise AllocFSError(404, "alloc directory not found (the allocation was garbage collected)") from None
    try:
        for part in parts[:-1]:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as err:
        os.close(fd)
        raise _os_error(err, path) from None
    return _Walked(fd, parts[-1] if parts else "")


def _os_error(err: OSError, path: str) -> AllocFSError:
    if err.errno == errno.ENOENT:
        return AllocFSError(404, f"file {path!r} not found in the allocation directory")
    if err.errno in (errno.ELOOP, errno.ENOTDIR):
        return AllocFSError(400, f"{path!r} goes through a symlink or a file in the allocation directory; "
                                 "only its real directories are read")  # fmt: skip
    return AllocFSError(500, f"reading {path!r} in the allocation directory failed: {err.strerror}")


def _info(name: str, st: os.stat_result) -> dict[str, Any]:
    """Nomad's AllocFileInfo."""
    mtime = datetime.datetime.fromtimestamp(st.st_mtime, datetime.UTC)
    return {
        "Name": name,
        "IsDir": stat.S_ISDIR(st.st_mode),
        "Size": st.st_size,
        "FileMode": stat.filemode(st.st_mode),
        "ModTime": mtime.isoformat().replace("+00:00", "Z"),
        "ContentType": "" if stat.S_ISDIR(st.st_mode) else "text/plain; charset=utf-8",
    }


def list_dir(alloc_dir: str, path: str) -> list[dict[str, Any]]:
    walked = _walk(alloc_dir, path)
    try:
        if walked.name:
            fd = os.open(walked.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=walked.parent)  # fmt: skip
        else:
            fd = os.dup(walked.parent)
    except OSError as err:
        raise _os_error(err, path) from None
    finally:
        os.close(walked.parent)
    try:
        out = []
        for name in sorted(os.listdir(fd)):
            try:
                out.append(_info(name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
            except FileNotFoundError:
                continue  # removed while listing
        return out
    finally:
        os.close(fd)


def stat_file(alloc_dir: str, path: str) -> dict[str, Any]:
    walked = _walk(alloc_dir, path)
    try:
        if not walked.name:
            return _info("alloc", os.fstat(walked.parent))
        return _info(walked.name, os.stat(walked.name, dir_fd=walked.parent, follow_symlinks=False))
    except OSError as err:
        raise _os_error(err, path) from None
    finally:
        os.close(walked.parent)


def read_file(alloc_dir: str, path: str) -> bytes:
    walked = _walk(alloc_dir, path)
    try:
        if not walked.name:
            raise AllocFSError(400, f"file {path!r} is a directory")
        # Looked at before it is opened: opening a device or a FIFO a task made could act on it.
        kind = os.stat(walked.name, dir_fd=walked.parent, follow_symlinks=False).st_mode
        if stat.S_ISDIR(kind):
            raise AllocFSError(400, f"file {path!r} is a directory")
        if not stat.S_ISREG(kind):
            raise AllocFSError(400, f"file {path!r} is not a regular file")
        fd = os.open(walked.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=walked.parent)
    except OSError as err:
        raise _os_error(err, path) from None
    finally:
        os.close(walked.parent)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise AllocFSError(400, f"file {path!r} is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise AllocFSError(400, f"file {path!r} is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CAT and (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_CAT:
            raise AllocFSError(400, f"file {path!r} is larger than {MAX_CAT} bytes; read a task's log with the logs "
                                    "endpoint")  # fmt: skip
        return b"".join(chunks)
    finally:
        os.close(fd)
