"""The log collector process: a task's two fifos copied into rotated files.

Started by :func:`driversdk.runner.logcollect.spawn` as ``python -I -S logcollector.py``, once per
task, and said ready on its stdout once it holds both fifos. It imports the standard library's
smallest modules and driversdk.errors (which imports nothing) and nothing else (no argparse, no
dataclasses, no re), so it is ready in about the time an interpreter takes to start: a task's
start waits for it. What it refuses and why is in logcollect's docstring.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import stat
import sys
from collections.abc import Callable  # typing is not imported: it alone costs ~10 ms of a start

if not __package__:
    # Started by spawn() as a script under -I -S, which keeps the project off sys.path; the one
    # project module it needs (driversdk.errors, which imports nothing) lives three levels up.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from driversdk.errors import DriverSDKError

MIB = 1024 * 1024
LOG_MODE = 0o640  # the operator's group may read a task's logs; nobody else
# The fifos' kernel buffer (Linux's default pipe-max-size; 64 KiB otherwise): a task that writes
# fast wakes the collector once a MiB instead of sixteen times.
PIPE_SIZE = MIB
# What one splice(2) moves at most, and the read size when splice cannot be used. Reads stay
# small enough that the bytes are still in the CPU cache when they are written out again.
CHUNK = 128 * 1024
# A task that keeps planting entries must not fill the disk with our complaints about them.
MAX_EVENTS = 100

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
_KINDS = {
    stat.S_IFLNK: "a symlink",
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a fifo",
    stat.S_IFREG: "a regular file",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


class Refused(DriverSDKError):
    """An entry the collector will not read or write; ``what`` says why, as in "is a symlink"."""

    def __init__(self, what: str, fmt: int) -> None:
        super().__init__(what)
        self.what = what
        self.fmt = fmt

    def as_log_file(self) -> str:
        """The middle of a log-file refusal sentence."""
        if self.fmt == stat.S_IFLNK:
            return "was replaced by a symlink; the collector did not follow it"
        if self.fmt != stat.S_IFREG:
            return f"{self.what}, not a regular file; the collector did not write to it"
        return f"{self.what}; the collector did not write to it"


def _check(st: os.stat_result, want: int) -> None:
    fmt = stat.S_IFMT(st.st_mode)
    if fmt != want:
        raise Refused(f"is {_KINDS.get(fmt, 'not a file')}", fmt)
    if st.st_uid != os.geteuid():
        raise Refused(f"is owned by uid {st.st_uid}, not by the collector", fmt)
    if st.st_nlink != 1:
        raise Refused("is a hard link to another file", fmt)


def open_dir(path: str) -> int:
    """The logs dir, opened once; a symlink in its place is refused (ELOOP / ENOTDIR)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused("is a symlink or not a directory", 0) from None
        raise


def _open_entry(dir_fd: int, name: str, want: int, flags: int) -> int:
    """Open ``name`` in the logs dir only when it is a ``want`` (S_IFREG, S_IFIFO) of ours."""
    # O_PATH opens nothing (no fifo blocks, no device node the task made wakes up) and with
    # O_NOFOLLOW pins the entry itself, symlink included: the checks and the real open below see
    # one inode, whatever the task renames meanwhile.
    pin = os.open(name, os.O_PATH | _NOFOLLOW, dir_fd=dir_fd)
    try:
        _check(os.fstat(pin), want)
        # Through /proc/self/fd the kernel reopens the pinned inode, not what the name means now
        # (that magic link is the one link followed here, so no O_NOFOLLOW on this open).
        fd = os.open(f"/proc/self/fd/{pin}", flags | os.O_CLOEXEC | os.O_NOCTTY)
    finally:
        os.close(pin)
    try:
        _check(os.fstat(fd), want)
    except Refused:
        os.close(fd)
        raise
    return fd


def _open_log(dir_fd: int, name: str) -> int:
    """A log file to append to: a new one we create, or an existing one that passes the checks.

    Positioned at its end rather than opened O_APPEND: splice(2) refuses an O_APPEND target, and
    the collector is the file's only writer (root's 0640 file, no other name), so it is the same.
    """
    for _ in range(3):
        try:
            # O_EXCL: a fresh regular file of ours, or EEXIST for anything there (a dangling symlink too).
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, LOG_MODE, dir_fd=dir_fd)
        except FileExistsError:
            try:
                fd = _open_entry(dir_fd, name, stat.S_IFREG, os.O_WRONLY | os.O_NONBLOCK)
            except FileNotFoundError:
                continue  # removed between the two opens: create it after all
            os.lseek(fd, 0, os.SEEK_END)
            return fd
        os.fchmod(fd, LOG_MODE)  # the collector's umask does not decide who may read the logs
        return fd
    raise Refused("keeps appearing and disappearing", 0)


class Events:
    """The collector's side of its events file: one sentence a line, appended."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.count = 0

    def __call__(self, sentence: str) -> None:
        if not self.path or self.count >= MAX_EVENTS:
            return
        self.count += 1
        if self.count == MAX_EVENTS:
            sentence += f"; the collector reports no more than {MAX_EVENTS} of these"
        line = (sentence.replace("\n", " ") + "\n").encode(errors="replace")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o600)
            try:
                os.write(fd, line)  # one write with O_APPEND: a reader never sees half a line from us
            finally:
                os.close(fd)
        except OSError:
            pass  # the report is lost, never the task's output


class RotatingFile:
    """One output stream of a task, appended to ``<base>.<N>`` in the logs dir.

    ``directory`` is the logs dir's path or a descriptor of it (the collector shares one between
    stdout and stderr); every file is opened, created and removed relative to it.
    """

    def __init__(
        self,
        directory: str | int,
        base: str,
        max_files: int,
        max_size: int,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self._own_dir = isinstance(directory, str)
        self.dir_fd = open_dir(directory) if isinstance(directory, str) else directory
        self.base = base
        self.max_files = max(1, max_files)
        self.max_size = max(1, max_size)
        self._report = report or (lambda _sentence: None)
        self._prefix = base + "."
        self._fd = -1
        self._size = 0
        self._splice = hasattr(os, "splice")  # until the kernel or the filesystem says otherwise
        self.index = max(self._indexes(), default=0)  # resume at the highest existing index
        self._open(self.index)

    def _indexes(self) -> list[int]:
        return [i for i in map(self._index_of, os.listdir(self.dir_fd)) if i is not None]

    def _index_of(self, name: str) -> int | None:
        """N of ``<base>.<N>`` (1 to 9 ASCII digits), else None."""
        if not name.startswith(self._prefix):
            return None
        digits = name[len(self._prefix) :]
        return int(digits) if 0 < len(digits) <= 9 and digits.isascii() and digits.isdigit() else None

    def _open(self, index: int) -> None:
        refused: list[tuple[str, Refused]] = []
        while True:
            name = f"{self.base}.{index}"
            try:
                fd = _open_log(self.dir_fd, name)
                break
            except Refused as err:
                refused.append((name, err))  # left in place: renaming in the task's dir is one more race
                index += 1
        self._fd, self.index = fd, index
        self._size = os.lseek(fd, 0, os.SEEK_CUR)  # the end: _open_log positioned it there
        for bad, why in refused:
            self._report(f'log file "{bad}" in alloc/logs {why.as_log_file()} and writes to "{name}"')

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            room = self.max_size - self._size
            if room <= 0:
                self._rotate()
                continue
            written = os.write(self._fd, view[:room])
            self._size += written
            view = view[written:]

    def pull(self, source: int, buffer: bytearray) -> int:
        """Move what the non-blocking pipe ``source`` holds into the file (up to a MiB).

        splice(2) moves it inside the kernel, without the copy through our memory a read and a
        write make; where it is refused (EINVAL: a filesystem without splice support) the bytes
        go through ``buffer``. Returns the byte count, 0 at end of file; raises BlockingIOError
        when the pipe is empty.
        """
        if self._size >= self.max_size:
            self._rotate()
        if self._splice:
            try:
                moved = os.splice(source, self._fd, min(PIPE_SIZE, self.max_size - self._size))
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                self._splice = False
            else:
                self._size += moved
                return moved
        size = os.readv(source, [buffer])
        self.write(memoryview(buffer)[:size])
        return size

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        self._open(self.index + 1)
        # Listing instead of counting down from the index: indexes may have gaps (refused
        # entries, or a huge one the task planted), and unlink never follows a symlink.
        keep_from = self.index - self.max_files + 1
        for old in self._indexes():
            if old < keep_from:
                try:
                    os.unlink(f"{self.base}.{old}", dir_fd=self.dir_fd)
                except OSError:
                    pass  # gone already, or a directory the task made: not ours to remove

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._own_dir:
            os.close(self.dir_fd)


def fifo_paths(logs_dir: str, task: str) -> tuple[str, str]:
    return os.path.join(logs_dir, f".{task}.stdout.fifo"), os.path.join(logs_dir, f".{task}.stderr.fifo")


def _dir_refusal(task: str, logs_dir: str, err: Refused) -> str:
    return (
        f'the log collector for task "{task}" refused the logs dir "{logs_dir}": it {err.what}; remove it and run '
        "the task again"
    )


def _fifo_refusal(task: str, kind: str, name: str, err: Refused) -> str:
    return (
        f'the log collector for task "{task}" refused its {kind} fifo "{name}" in alloc/logs: it {err.what}, not '
        "the fifo the collector made; remove it and run the task again"
    )


def _collect(logs_dir: str, task: str, max_files: int, max_size: int, events: str | None) -> None:
    stopping = False

    def on_term(*_: object) -> None:
        nonlocal stopping
        stopping = True

    # The signal also writes a byte to this pipe, so select wakes at once instead of at its timeout.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    report = Events(events)
    fifos: dict[str, int] = {}
    try:
        dir_fd = open_dir(logs_dir)
    except Refused as err:
        sys.stdout.write(f"refused {_dir_refusal(task, logs_dir, err)}\n")
        return
    for fifo, kind in zip(fifo_paths(logs_dir, task), ("stdout", "stderr"), strict=True):
        name = os.path.basename(fifo)
        try:
            # Read-write: the reader never sees end-of-file when a writer goes and comes back.
            fifos[kind] = _open_entry(dir_fd, name, stat.S_IFIFO, os.O_RDWR | os.O_NONBLOCK)
        except Refused as err:
            sys.stdout.write(f"refused {_fifo_refusal(task, kind, name, err)}\n")
            return
        try:
            fcntl.fcntl(fifos[kind], fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass  # EPERM above pipe-max-size without CAP_SYS_RESOURCE: the default buffer works, slower
    sinks = {fd: RotatingFile(dir_fd, f"{task}.{kind}", max_files, max_size, report) for kind, fd in fifos.items()}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    buffer = bytearray(CHUNK)  # reused for every chunk when splice cannot be
    while True:
        try:
            ready, _, _ = select.select([*sinks, wake_r], [], [], None if not stopping else 0)
        except InterruptedError:
            ready = []
        got = False
        for fd in ready:
            if fd == wake_r:
                os.read(wake_r, 64)
                continue
            try:
                if sinks[fd].pull(fd, buffer):
                    got = True
            except BlockingIOError:
                continue
        if stopping and not got:
            break
    for fd, sink in sinks.items():
        os.close(fd)
        sink.close()
    os.close(dir_fd)


USAGE = "usage: logcollector.py --dir DIR --task NAME [--max-files N] [--max-size BYTES] [--events FILE]"


def parse_args(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs (what spawn() passes); a usage line on anything else."""
    known = {"--dir", "--task", "--max-files", "--max-size", "--events"}
    if len(argv) % 2 or any(flag not in known for flag in argv[::2]):
        sys.exit(USAGE)
    args = dict(zip(argv[::2], argv[1::2], strict=True))
    if "--dir" not in args or "--task" not in args:
        sys.exit(USAGE)
    for number in ("--max-files", "--max-size"):
        if not args.get(number, "1").isdigit():
            sys.exit(f"{number} must be a whole number; {USAGE}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    max_files, max_size = int(args.get("--max-files", "10")), int(args.get("--max-size", str(10 * MIB)))
    _collect(args["--dir"], args["--task"], max_files, max_size, args.get("--events"))


if __name__ == "__main__":
    main()
