"""The log collector process: every task's two fifos copied into rotated files, one process per data dir.

Started by :class:`driversdk.agent.logmon.tasklogs.LogCollector` as ``python -I -S collector.py
--serve <data_dir>/logmon.sock`` and said ready on its stdout once it listens. One thread runs one
epoll loop over the control socket, its client connections and every served task's fifos, so a
thousand tasks cost one small process and no thread each. The control socket speaks one JSON
object a line and answers one line each::

    {"op": "add", "dir": LOGS_DIR, "task": NAME, "max_files": N, "max_size": BYTES, "events": PATH,
     "fifos": [[DEV, INO], [DEV, INO]]}  (the fifos the runner made, owned by the task's user by now)
        -> "ok" (also when the task is served already: a recovering runner adds it again)
        -> "refused <sentence>" (a planted logs dir or fifo), "error <sentence>" (anything else)
    {"op": "remove", "dir": LOGS_DIR, "task": NAME} -> drains the fifos, closes and removes them -> "ok"
    {"op": "ping"} -> "ok"
    {"op": "bye"} -> "ok last" when no task is served and no other process is connected, else "ok"

A ready fifo moves at most one pipe buffer (1 MiB) a loop turn, so a task flooding its stdout
cannot starve the others; a task whose files cannot be written (EIO, a full disk) is paused and
tried again, never the loop's end. SIGTERM drains every fifo and exits; so does the last client
going when no task is left to serve. A flock on ``<socket>.lock`` held for the process's life
says which collector owns the socket: a socket file without it is a dead collector's, replaced.

It imports the standard library's small modules (json and socket the largest) and driversdk.errors
(which imports nothing), no argparse, dataclasses or typing, so it is ready in little more than the
time an interpreter takes to start. What it refuses and why is in tasklogs' docstring.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable  # typing is not imported: it alone costs ~10 ms of a start

if not __package__:
    # Started by spawn() as a script under -I -S, which keeps the project off sys.path; the one
    # project module it needs (driversdk.errors, which imports nothing) is in the directory that
    # holds driversdk/, four levels up from driversdk/agent/logmon/collector.py.
    _root = os.path.abspath(__file__)
    for _ in range(4):
        _root = os.path.dirname(_root)
    sys.path.insert(0, _root)

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


def _check(st: os.stat_result, want: int, known: frozenset[tuple[int, int]] = frozenset()) -> None:
    fmt = stat.S_IFMT(st.st_mode)
    if fmt != want:
        raise Refused(f"is {_KINDS.get(fmt, 'not a file')}", fmt)
    # ``known``: inodes (dev, ino) the runner made itself. A task's fifo is handed to its user by
    # runc (it chowns the task's stdio), so after a restart our own fifo is found owned by the task.
    if st.st_uid != os.geteuid() and (st.st_dev, st.st_ino) not in known:
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


def _open_entry(dir_fd: int, name: str, want: int, flags: int, known: frozenset[tuple[int, int]] = frozenset()) -> int:
    """Open ``name`` in the logs dir only when it is a ``want`` (S_IFREG, S_IFIFO) of ours."""
    # O_PATH opens nothing (no fifo blocks, no device node the task made wakes up) and with
    # O_NOFOLLOW pins the entry itself, symlink included: the checks and the real open below see
    # one inode, whatever the task renames meanwhile.
    pin = os.open(name, os.O_PATH | _NOFOLLOW, dir_fd=dir_fd)
    try:
        _check(os.fstat(pin), want, known)
        # Through /proc/self/fd the kernel reopens the pinned inode, not what the name means now
        # (that magic link is the one link followed here, so no O_NOFOLLOW on this open).
        fd = os.open(f"/proc/self/fd/{pin}", flags | os.O_CLOEXEC | os.O_NOCTTY)
    finally:
        os.close(pin)
    try:
        _check(os.fstat(fd), want, known)
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
        old = self._fd
        # The next file first: when it cannot be made (a full disk) the current one stays open and
        # the next pull tries again, instead of a stream left without a file.
        self._open(self.index + 1)
        os.close(old)
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


# Bytes a removed or stopping task's fifo is drained of at most: its writers are gone by then, but
# a process the task left behind could keep writing for ever.
DRAIN_LIMIT = 64 * MIB
# A stream whose file could not be written waits this long before it is tried again (its writer
# blocks meanwhile, once the fifo is full: nothing is dropped).
RETRY_AFTER = 1.0
# A collector nobody has connected to yet waits this long for its starter before it ends idle.
FIRST_CLIENT_WAIT = 10.0
MAX_REQUEST = 64 * 1024
LISTEN_BACKLOG = 128


class _Stream:
    """One fifo of one served task and the rotated files it is copied to."""

    def __init__(self, task: _Task, kind: str, fd: int, sink: RotatingFile) -> None:
        self.task, self.kind, self.fd, self.sink = task, kind, fd, sink
        self.paused_until = 0.0
        self.failed = ""


class _Task:
    def __init__(self, logs_dir: str, name: str, dir_fd: int, report: Events) -> None:
        self.logs_dir, self.name, self.dir_fd, self.report = logs_dir, name, dir_fd, report
        self.streams: list[_Stream] = []


class Server:
    """The event loop: control socket, client connections and every served task's fifos."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.epoll = select.epoll()
        self.tasks: dict[tuple[str, str], _Task] = {}
        self.streams: dict[int, _Stream] = {}
        self.clients: dict[int, tuple[socket.socket, bytearray]] = {}
        self.peers: dict[int, int] = {}  # client fd -> the pid of the process on the other end
        self.paused: list[_Stream] = []
        self.buffer = bytearray(CHUNK)  # reused for every chunk when splice cannot be
        self.stopping = False
        self.had_client = False
        self.started = time.monotonic()
        # The signal also writes a byte to this pipe, so epoll wakes at once.
        self.wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.epoll.register(self.wake_r, select.EPOLLIN)
        self.epoll.register(listener.fileno(), select.EPOLLIN)

    def _on_term(self, *_: object) -> None:
        self.stopping = True

    # --- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        while not self.stopping:
            try:
                ready = self.epoll.poll(self._timeout())
            except InterruptedError:
                continue
            for fd, _mask in ready:
                if fd == self.wake_r:
                    _drain_wake(fd)
                elif fd == self.listener.fileno():
                    self._accept()
                elif fd in self.clients:
                    self._serve_client(fd)
                elif fd in self.streams and not self.streams[fd].paused_until:
                    self._pull(self.streams[fd])  # at most a pipe buffer: every ready fifo gets its turn
            self._resume_paused()
            if self._idle():
                break
        for task in list(self.tasks.values()):
            self._drop(task, unlink=False)

    def _timeout(self) -> float:
        if self.paused:
            return max(0.0, min(s.paused_until for s in self.paused) - time.monotonic())
        if not self.had_client:
            return max(0.0, self.started + FIRST_CLIENT_WAIT - time.monotonic())
        return -1

    def _idle(self) -> bool:
        """Nothing to serve and nobody to serve it for (the last run or agent went)."""
        if self.tasks or self.clients:
            return False
        if not self.had_client and time.monotonic() < self.started + FIRST_CLIENT_WAIT:
            return False
        self._accept()  # a client that connected just now keeps the collector
        return not self.clients

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # EMFILE and the like: the client's connect times out and it tries again
            pid, uid = _peer(conn)
            if uid != os.geteuid():
                conn.close()  # the socket is 0600 already; a request names files to open as us
                continue
            self.had_client = True
            conn.setblocking(True)  # replies are one short line each; a client reads its reply
            self.clients[conn.fileno()] = (conn, bytearray())
            self.peers[conn.fileno()] = pid
            self.epoll.register(conn.fileno(), select.EPOLLIN)

    def _serve_client(self, fd: int) -> None:
        conn, pending = self.clients[fd]
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._close_client(fd)
            return
        pending += data
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end])
            del pending[: end + 1]
            reply = self._handle(line, self.peers.get(fd, 0))
            try:
                conn.sendall(reply.replace("\n", " ").encode(errors="replace") + b"\n")
            except OSError:
                self._close_client(fd)
                return
        if len(pending) > MAX_REQUEST:
            self._close_client(fd)

    def _close_client(self, fd: int) -> None:
        conn, _ = self.clients.pop(fd)
        self.peers.pop(fd, None)
        self.epoll.unregister(fd)
        conn.close()

    # --- requests -------------------------------------------------------------------------------

    def _handle(self, line: bytes, peer: int) -> str:
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "ping":
                return "ok"
            if op == "bye":  # "last": the collector ends once this client goes (it waits for that)
                others = any(pid != peer for pid in self.peers.values())
                return "ok" if self.tasks or others else "ok last"
            key = (str(request["dir"]), str(request["task"]))
            if op == "add":
                known = frozenset((int(dev), int(ino)) for dev, ino in request.get("fifos", []))
                return self._add(key, int(request["max_files"]), int(request["max_size"]), request.get("events"), known)
            if op == "remove":
                task = self.tasks.get(key)
                if task is not None:
                    self._drop(task, unlink=True)
                return "ok"
            return f"error unknown op {op!r}"
        except (ValueError, KeyError, TypeError) as err:
            return f"error the request {line[:200]!r} is not one the collector knows: {err}"
        except Exception as err:  # one task's request never ends the loop that serves every task
            return f"error the log collector could not do {line[:200]!r}: {err}"

    def _add(
        self, key: tuple[str, str], max_files: int, max_size: int, events: str | None, known: frozenset[tuple[int, int]]
    ) -> str:
        logs_dir, name = key
        if key in self.tasks:
            return "ok"
        try:
            dir_fd = open_dir(logs_dir)
        except Refused as err:
            return f"refused {_dir_refusal(name, logs_dir, err)}"
        except OSError as err:
            return f'error the log collector for task "{name}" could not open "{logs_dir}": {err.strerror}'
        task = _Task(logs_dir, name, dir_fd, Events(events))
        fds: list[tuple[str, int]] = []
        try:
            for fifo, kind in zip(fifo_paths(logs_dir, name), ("stdout", "stderr"), strict=True):
                fifo_name = os.path.basename(fifo)
                try:
                    # Read-write: the reader never sees end-of-file when a writer goes and comes back.
                    fd = _open_entry(dir_fd, fifo_name, stat.S_IFIFO, os.O_RDWR | os.O_NONBLOCK, known)
                    fds.append((kind, fd))
                except Refused as err:
                    raise _Refusal(_fifo_refusal(name, kind, fifo_name, err)) from None
                try:
                    fcntl.fcntl(fds[-1][1], fcntl.F_SETPIPE_SZ, PIPE_SIZE)
                except OSError:
                    pass  # EPERM above pipe-max-size without CAP_SYS_RESOURCE: the default buffer works, slower
            for kind, fd in fds:
                sink = RotatingFile(dir_fd, f"{name}.{kind}", max_files, max_size, task.report)
                task.streams.append(_Stream(task, kind, fd, sink))
        except (_Refusal, Refused, OSError) as err:
            for stream in task.streams:
                stream.sink.close()
            for _kind, fd in fds:
                os.close(fd)
            os.close(dir_fd)
            if isinstance(err, _Refusal):
                return f"refused {err}"
            why = err.strerror if isinstance(err, OSError) else str(err)
            return f'error the log collector for task "{name}" could not open its log files: {why}'
        self.tasks[key] = task
        for stream in task.streams:
            self.streams[stream.fd] = stream
            self.epoll.register(stream.fd, select.EPOLLIN)
        return "ok"

    def _drop(self, task: _Task, unlink: bool) -> None:
        """Drain what the task's fifos still hold, then close them (and remove them: ``unlink``)."""
        for stream in task.streams:
            moved = 0
            while moved < DRAIN_LIMIT:
                got = self._pull(stream, draining=True)
                if got <= 0:
                    break
                moved += got
        for stream in task.streams:
            self.streams.pop(stream.fd, None)
            if stream in self.paused:
                self.paused.remove(stream)  # out of epoll already
            else:
                self.epoll.unregister(stream.fd)
            os.close(stream.fd)
            stream.sink.close()
            if unlink:
                try:
                    os.unlink(f".{task.name}.{stream.kind}.fifo", dir_fd=task.dir_fd)
                except OSError:
                    pass  # gone already
        os.close(task.dir_fd)
        del self.tasks[(task.logs_dir, task.name)]

    # --- moving bytes ---------------------------------------------------------------------------

    def _pull(self, stream: _Stream, draining: bool = False) -> int:
        """One pull of up to a pipe buffer; the byte count, 0 when the fifo is empty, -1 on failure."""
        if stream.paused_until and not draining:
            return -1
        try:
            return stream.sink.pull(stream.fd, self.buffer)
        except BlockingIOError:
            return 0
        except (OSError, Refused) as err:
            why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            if why != stream.failed:  # one report per cause, not one per attempt
                stream.failed = why
                stream.task.report(
                    f'the log collector could not write task "{stream.task.name}"\'s {stream.kind} to alloc/logs: '
                    f"{why}; it tries again every {RETRY_AFTER:g}s and the task's writes wait meanwhile"
                )
            if not draining:
                self._pause(stream)
            return -1

    def _pause(self, stream: _Stream) -> None:
        """Out of epoll for a while: a fifo with bytes that cannot be written stays ready for ever."""
        stream.paused_until = time.monotonic() + RETRY_AFTER
        self.epoll.unregister(stream.fd)
        self.paused.append(stream)

    def _resume_paused(self) -> None:
        now = time.monotonic()
        for stream in [s for s in self.paused if s.paused_until <= now]:
            self.paused.remove(stream)
            stream.paused_until = 0.0
            self.epoll.register(stream.fd, select.EPOLLIN)


class _Refusal(DriverSDKError):
    pass


def _peer(conn: socket.socket) -> tuple[int, int]:
    """The connected process's pid and uid (SO_PEERCRED: pid, uid, gid as three ints); (0, -1)
    when the kernel cannot say."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except OSError:
        return 0, -1
    return int.from_bytes(creds[:4], sys.byteorder), int.from_bytes(creds[4:8], sys.byteorder)


def _drain_wake(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except BlockingIOError:
        pass


def _raise_fd_limit() -> None:
    """Two fifos a task, two descriptors each kept: lift the soft open-file limit to the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # the collector serves fewer tasks before a new one is refused with EMFILE


def _take_lock(path: str) -> int | None:
    """The collector's lock on ``<socket>.lock``; None when a live collector holds it and answers."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    deadline = time.monotonic() + 5.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        if _answers(path.removesuffix(".lock")) or time.monotonic() > deadline:
            os.close(fd)
            return None
        time.sleep(0.01)  # a collector ending idle: its lock goes with it


def _answers(sock_path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(sock_path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _listen(sock_path: str) -> socket.socket:
    """Bind the control socket, replacing a dead collector's socket file (we hold the lock)."""
    directory, name = os.path.split(sock_path)
    os.chdir(directory)  # a relative bind: a data dir path longer than sun_path's 108 bytes works too
    try:
        os.unlink(name)  # a dead collector's; unlink never follows a symlink
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # created 0600: nobody but us may ask the collector to read a path
    try:
        listener.bind(name)
    finally:
        os.umask(old)
    os.chmod(name, 0o600)
    listener.listen(LISTEN_BACKLOG)
    listener.setblocking(False)
    return listener


def serve(sock_path: str) -> None:
    lock = _take_lock(sock_path + ".lock")
    if lock is None:
        sys.stdout.write("busy\n")  # another collector serves this data dir: the client uses it
        sys.stdout.flush()
        return
    _raise_fd_limit()
    listener = _listen(sock_path)
    ours = os.stat(os.path.basename(sock_path), follow_symlinks=False)
    server = Server(listener)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    try:
        server.run()
    finally:
        try:  # only our socket: a successor may have bound its own already
            now = os.stat(os.path.basename(sock_path), follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino):
                os.unlink(os.path.basename(sock_path))
        except OSError:
            pass
        listener.close()
        os.close(lock)


USAGE = "usage: collector.py --serve SOCKET"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--serve" or not os.path.isabs(args[1]):
        sys.exit(USAGE)
    serve(args[1])


if __name__ == "__main__":
    main()
