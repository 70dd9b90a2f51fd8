"""Reading a task's rotated log files: all of them, the last N lines, or following them.

The files are ``<task>.<kind>.<N>`` in ``<alloc>/alloc/logs``, a directory the task can write:
any name there may be a symlink, a hard link to a host file, a fifo or a device at any moment.
So the directory is opened once without following links and every file relative to it: pinned
with ``O_PATH | O_NOFOLLOW``, checked to be a regular file with one name (the rule of
:func:`driversdk.agent.logmon.tasklogs.is_log_file`), then reopened ``O_NONBLOCK`` through
``/proc/self/fd`` so that the check and the read see one inode and nothing a task planted is
ever opened for reading (no fifo blocks us, no device node is woken up).

Following waits on inotify, not on a timer: the standard library has no binding, so
``inotify_init1`` and ``inotify_add_watch`` are called through ctypes. The watch is on the
opened logs directory (through its ``/proc/self/fd`` link, so a task that swaps the directory
for another cannot redirect it), and an append to the current file or a new rotated file wakes
the reader at once.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import select
import stat
import struct
import time
from collections.abc import Callable

from driversdk.errors import DriverSDKError

BLOCK = 65536

# From <sys/inotify.h>; stable kernel ABI.
IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
# Events about the watch itself, not about a name in the directory: always worth a look.
_SELF = IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


class LogError(DriverSDKError):
    """A logs directory that cannot be read safely."""


class LogDir:
    """One task's logs of one kind (stdout or stderr), in a logs directory held open."""

    def __init__(self, fd: int, task: str, kind: str) -> None:
        self.fd = fd
        self.prefix = f"{task}.{kind}."
        self._pattern = re.compile(re.escape(self.prefix) + r"([0-9]{1,9})")

    @classmethod
    def open(cls, alloc_dir: str, task: str, kind: str) -> LogDir | None:
        """The task's logs, or None when the allocation has no logs directory."""
        # alloc_dir is the runner's; `alloc` and `alloc/logs` are the task's to replace.
        try:
            top = os.open(alloc_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            shared = _open_dir(top, "alloc", alloc_dir)
            if shared is None:
                return None
            try:
                logs = _open_dir(shared, "logs", os.path.join(alloc_dir, "alloc"))
            finally:
                os.close(shared)
        finally:
            os.close(top)
        return None if logs is None else cls(logs, task, kind)

    def indexes(self) -> list[int]:
        """The rotation indexes present now, oldest first."""
        return sorted(int(m.group(1)) for n in os.listdir(self.fd) if (m := self._pattern.fullmatch(n)))

    def open_file(self, index: int) -> int | None:
        """A read descriptor on file ``index``; None when it is gone or is not a regular file with
        one name (a symlink, fifo, device or hard link the task put there is never read)."""
        try:
            pin = os.open(f"{self.prefix}{index}", os.O_PATH | _NOFOLLOW, dir_fd=self.fd)
        except OSError:
            return None
        try:
            if not _plain_file(os.fstat(pin)):
                return None
            # The magic link reopens the pinned inode, whatever the name means by now.
            fd = os.open(f"/proc/self/fd/{pin}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError:
            return None
        finally:
            os.close(pin)
        if not _plain_file(os.fstat(fd)):
            os.close(fd)
            return None
        return fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _plain_file(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _open_dir(parent: int, name: str, where: str) -> int | None:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LogError(
                f'"{name}" in {where} is a symlink or not a directory (the task can write there); '
                "its logs are not read through it"
            ) from None
        raise


class Follower:
    """A position in the stream of one kind's files, read forward.

    The log collector creates ``N+1`` only after its last write to ``N`` (it rotates when the next
    write does not fit), so once ``N+1`` exists, reading ``N`` to its end has everything and the
    reader moves on. The current file stays open: when the collector deletes it (``max_files``)
    while we read, the rest is still readable.
    """

    def __init__(self, logs: LogDir, index: int = -1, fd: int | None = None) -> None:
        self.logs = logs
        self.index = index
        self.fd = fd

    def drain(self, write: Callable[[bytes], None]) -> None:
        """Everything written since the last call, across any rotations in between."""
        while True:
            self._copy(write)
            later = [i for i in self.logs.indexes() if i > self.index]
            if not later:
                return
            self._copy(write)  # what was appended to this file before the next one appeared
            self.close()
            self.index = later[0]
            self.fd = self.logs.open_file(self.index)  # None: refused, skipped like the collector does

    def _copy(self, write: Callable[[bytes], None]) -> None:
        if self.fd is None:
            return
        while chunk := os.read(self.fd, BLOCK):
            write(chunk)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def last_lines(logs: LogDir, count: int) -> tuple[bytes, Follower]:
    """The last ``count`` lines across the rotated files, and a follower positioned after them.

    The files are one stream: a line may start in one file and end in the next (the collector
    rotates by size, not by line), and the newest file may end without a newline (a line still
    being written, which counts as a line). Blocks are read backwards from the end until enough
    newlines are seen, so a long log is not read whole."""
    blocks: list[bytes] = []  # newest first
    newlines = 0
    trailing: bool | None = None  # does the stream end with a newline (which ends no extra line)
    follower = Follower(logs)
    for index in reversed(logs.indexes()):
        fd = logs.open_file(index)
        if fd is None:
            continue
        end = os.fstat(fd).st_size
        if follower.fd is None and follower.index < 0:
            os.lseek(fd, end, os.SEEK_SET)  # following continues after what is printed here
            follower.index, follower.fd = index, fd
        position = end
        try:
            while position > 0 and (trailing is None or newlines - trailing < count):
                size = min(BLOCK, position)
                position -= size
                block = os.pread(fd, size, position)
                if trailing is None and block:
                    trailing = block.endswith(b"\n")
                blocks.append(block)
                newlines += block.count(b"\n")
        finally:
            if fd != follower.fd:
                os.close(fd)
        if trailing is not None and newlines - trailing >= count:
            break
    data = b"".join(reversed(blocks))
    start = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(count):
        start = data.rfind(b"\n", 0, start)
        if start < 0:
            return data, follower
    return data[start + 1 :], follower


class Inotify:
    """An inotify descriptor with directory watches, each waking only for the names it cares about."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.inotify_init1.argtypes = [ctypes.c_int]
        self._libc.inotify_init1.restype = ctypes.c_int
        self._libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._libc.inotify_add_watch.restype = ctypes.c_int
        fd = int(self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        if fd < 0:
            raise _errno_error("inotify_init1")
        self.fd = fd
        self._wanted: dict[int, Callable[[str], bool]] = {}

    def watch(self, path: str, mask: int, wanted: Callable[[str], bool]) -> None:
        """Watch the directory at ``path`` for ``mask`` events on names that ``wanted`` accepts."""
        wd = int(self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask | IN_ONLYDIR))
        if wd < 0:
            raise _errno_error("inotify_add_watch", path)
        self._wanted[wd] = wanted

    def wait(self, timeout: float) -> bool:
        """Block until a wanted event (True) or ``timeout`` seconds (False). Events on names
        nobody wants (the other kind's files, the fifos) are consumed without returning."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready and self._read():
                return True
        return False

    def _read(self) -> bool:
        wanted = False
        while True:
            try:
                buf = os.read(self.fd, BLOCK)
            except BlockingIOError:
                return wanted
            offset = 0
            while offset < len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
                name = buf[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                accept = self._wanted.get(wd)
                if mask & _SELF or (accept is not None and accept(os.fsdecode(name))):
                    wanted = True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _errno_error(call: str, path: str | None = None) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call}: {os.strerror(code)}", path)


def follow(
    follower: Follower,
    write: Callable[[bytes], None],
    running: Callable[[], bool],
    *,
    collector_alive: Callable[[], bool] = lambda: False,
    recheck: float = 1.0,
) -> None:
    """Copy the stream to ``write`` as it grows, until ``running()`` says the task has ended.

    Data wakes the reader through inotify on the logs directory; ``running`` is asked on every
    wake-up and at least every ``recheck`` seconds. (A watch on state.db cannot replace that timer:
    SQLite appends a commit to the WAL file, which wakes a watcher, before it publishes the commit
    in the shared-memory index, which does not, so the woken reader may still see the old state.)"""
    inotify = Inotify()
    try:
        prefix = follower.logs.prefix
        inotify.watch(
            f"/proc/self/fd/{follower.logs.fd}", IN_MODIFY | IN_CREATE | IN_MOVED_TO, lambda n: n.startswith(prefix)
        )
        # The watch exists before the first read: nothing written after it goes unnoticed.
        while True:
            alive = running()  # asked before reading, so what was written before the end is read
            follower.drain(write)
            if not alive:
                break
            inotify.wait(recheck)
        # The task has ended but its collector may still be copying the last bytes out of the
        # fifo: read on while they keep coming, a few seconds at most.
        give_up = time.monotonic() + 5.0
        while collector_alive() and time.monotonic() < give_up and inotify.wait(0.25):
            follower.drain(write)
    finally:
        inotify.close()
