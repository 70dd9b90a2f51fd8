"""Log collection as Nomad's logmon does it: read each task's fifos into rotated files.

Files are ``<task>.stdout.<N>`` / ``<task>.stderr.<N>`` in ``<alloc>/alloc/logs``; a file that
reaches ``max_file_size`` MB moves on to N+1, and only the newest ``max_files`` are kept.

The reader is one detached process per data dir serving every task of it
(:mod:`driversdk.agent.logmon.collector`, an epoll loop over all the fifos), not a thread of
``driversdk run``: a task writing straight into its fifo (exec) would die of SIGPIPE the moment
the run process is killed, and a restarted run could not recover it. This module is the runner's
side of it: :class:`LogCollector` starts the collector (or adopts the one a killed run or agent
left), adds and removes tasks, and restarts it with every task it served when it dies. Until a
task is removed this process also holds each of its fifos open (a "keeper"), so while a dead
collector is being replaced a task writing gets neither SIGPIPE nor EPIPE: its writes wait in the
fifo's 1 MiB buffer and the new collector copies them on, no line lost.

The collector runs as root, and ``alloc/logs`` is writable by the task (exec mounts the alloc
dir), so every name in it is the task's to change at any moment. The collector therefore holds
each logs dir open once and works only relative to that descriptor, never follows a symlink, and
writes only to regular files it owns that have no other name (a hard link to a host file is
refused like a symlink). A refused log file is left where it is and the collector moves on to the
next index, so no output is lost; each refusal is one line in an events file outside the task's
view (``<alloc>/<task>/private``, which no driver shows the task), which one thread of the runner
(:func:`watch_events`) reads for every task with :func:`read_events` and prints as task events.
"""

import json
import os
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from driversdk.agent.logmon import collector as logcollector
from driversdk.agent.logmon.collector import (
    _NOFOLLOW,
    CHUNK,
    LOG_MODE,
    MIB,
    Refused,
    RotatingFile,
    _dir_refusal,
    _fifo_refusal,
    _open_entry,
    fifo_paths,
    open_dir,
)
from driversdk.errors import DriverSDKError

__all__ = [
    "CHUNK",
    "LOG_MODE",
    "MIB",
    "LogCollector",
    "Logmon",
    "Refused",
    "RotatingFile",
    "acquire",
    "fifo_paths",
    "open_dir",
    "release",
    "spawn",
    "stop",
    "watch_events",
]

SOCKET_NAME = "logmon.sock"  # in the data dir, next to state.db
FIFOS_FILE = "logmon.fifos"  # in the task's private dir, next to the events file
START_TIMEOUT = 10.0
# A remove drains what the task's fifos hold (up to logcollector.DRAIN_LIMIT) before it answers.
REQUEST_TIMEOUT = 60.0
CLOSE_WAIT = 2.0  # how long the last client waits for the idle collector to end
EVENT_POLL = 0.5  # how often the one poller thread reads events files and looks at the collectors
_SUN_PATH_MAX = 107


def events_path(logs_dir: str, task: str) -> str:
    """``<alloc>/<task>/private/logmon.events``: Nomad's task-private dir, never shown to the task."""
    alloc_dir = os.path.dirname(os.path.dirname(os.path.abspath(logs_dir)))
    return os.path.join(alloc_dir, task, "private", "logmon.events")


def data_dir_of(logs_dir: str) -> str:
    """``<data_dir>/allocs/<alloc id>/alloc/logs`` -> the data dir, whose collector serves it."""
    path = os.path.abspath(logs_dir)  # not resolved: the task may have made its logs dir a symlink
    for _ in range(4):
        path = os.path.dirname(path)
    return os.path.realpath(path)


@dataclass(frozen=True)
class Logmon:
    """A task served by the collector: its pid (when added), the two fifos and the events file."""

    pid: int
    stdout_fifo: str
    stderr_fifo: str
    events: str = ""

    def __post_init__(self) -> None:
        if not self.events:  # adopted from state.db, which records the pid only
            object.__setattr__(self, "events", events_path(self.logs_dir, self.task))

    @property
    def logs_dir(self) -> str:
        return os.path.dirname(self.stdout_fifo)

    @property
    def task(self) -> str:
        return os.path.basename(self.stdout_fifo)[1 : -len(".stdout.fifo")]


@dataclass
class _Served:
    logmon: Logmon
    max_files: int
    max_size: int
    keepers: list[int] = field(default_factory=list)
    fifos: list[tuple[int, int]] = field(default_factory=list)  # (dev, ino) of the fifos we made


class _CollectorGone(DriverSDKError, OSError):
    """The collector closed the connection (it died, or ended idle just as we asked)."""


class LogCollector:
    """This process's side of the collector of one data dir (see the module docstring)."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.realpath(data_dir)
        self.socket_path = os.path.join(self.data_dir, SOCKET_NAME)
        self.pid = 0
        self.restarts = 0  # collectors started in place of one that died (for tests and benches)
        self._lock = threading.RLock()
        self._conn: socket.socket | None = None  # requests and their replies
        self._watch: socket.socket | None = None  # never written: its end says the collector went
        self._child: subprocess.Popen[bytes] | None = None
        self._served: dict[tuple[str, str], _Served] = {}
        with _live_lock:
            _live.add(self)
        _poller.start()

    # --- tasks ----------------------------------------------------------------------------------

    def add(
        self, logs_dir: str, task: str, max_files: int, max_size: int, events: str | None = None, legacy_pid: int = 0
    ) -> Logmon:
        """Create the task's fifos (0600) if they are not there, hold them, and have the collector
        serve them; returns once it does. Adding a served task again is harmless (recovery).

        ``events`` is where the collector reports what it refused; by default the task's private
        dir. ``legacy_pid``: a per-task collector an older release left on these fifos, stopped
        (it drains first) before the shared one takes them over.
        """
        from driversdk.errors import DriverError

        events = events or events_path(logs_dir, task)
        os.makedirs(os.path.dirname(events), mode=0o700, exist_ok=True)
        try:
            dir_fd = open_dir(logs_dir)
        except Refused as err:
            raise DriverError(_dir_refusal(task, logs_dir, err)) from None
        made: list[str] = []
        keepers: list[int] = []
        identities = os.path.join(os.path.dirname(events), FIFOS_FILE)
        try:
            known = _read_identities(identities)
            for fifo, kind in zip(fifo_paths(logs_dir, task), ("stdout", "stderr"), strict=True):
                name = os.path.basename(fifo)
                try:
                    os.mkfifo(name, 0o600, dir_fd=dir_fd)
                    made.append(name)
                except FileExistsError:
                    pass  # a restarted run adopts its task's fifos; the checks below see what is there
                try:
                    keepers.append(_open_entry(dir_fd, name, stat.S_IFIFO, os.O_RDWR | os.O_NONBLOCK, known))
                except Refused as err:
                    raise DriverError(_fifo_refusal(task, kind, name, err)) from None
            fifos = [(st.st_dev, st.st_ino) for st in map(os.fstat, keepers)]
            if frozenset(fifos) != known:
                _write_identities(identities, fifos)
            if legacy_pid:
                _stop_legacy(legacy_pid, logs_dir)
            served = _Served(Logmon(0, *fifo_paths(logs_dir, task), events), max_files, max_size, keepers, fifos)
            with self._lock:
                _room_for_fds(2 * len(self._served) + 2)
                reply = self._request(self._add_request(served))
                if reply != "ok":
                    raise DriverError(reply.split(" ", 1)[1] if " " in reply else reply)
                old = self._served.pop((logs_dir, task), None)
                served.logmon = Logmon(self.pid, *fifo_paths(logs_dir, task), events)
                self._served[(logs_dir, task)] = served
            if old is not None:
                _close_all(old.keepers)
            return served.logmon
        except BaseException:
            _close_all(keepers)
            for name in made:  # nothing leaks: only the fifos this call made, never the task's
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except OSError:
                    pass
            raise
        finally:
            os.close(dir_fd)

    def remove(self, logmon: Logmon) -> None:
        """Let the collector drain what the task's fifos still hold, then remove the fifos."""
        key = (logmon.logs_dir, logmon.task)
        with self._lock:
            served = self._served.get(key)
            if served is not None or self._conn is not None or self._adopt():
                try:
                    self._request({"op": "remove", "dir": key[0], "task": key[1]})
                except OSError:
                    pass  # no collector could be had: nothing reads the fifos that could be drained
            self._served.pop(key, None)
        if served is not None:
            _close_all(served.keepers)
        _unlink_fifos(logmon)

    def serves(self) -> list[Logmon]:
        with self._lock:
            return [s.logmon for s in self._served.values()]

    def close(self) -> None:
        """Let go of the collector: it serves on what this process did not remove (an agent
        leaving its tasks running), and ends by itself once it serves nothing and nobody is left."""
        with self._lock:
            idle = False
            if not self._served and self._conn is not None:
                try:  # only the last user waits for it to end (another run may be using it)
                    idle = self._send({"op": "bye"}) == "ok last"
                except OSError:
                    pass
            self._disconnect()
            for served in self._served.values():
                _close_all(served.keepers)
            self._served.clear()
            child, self._child = self._child, None
            pid = self.pid
        if idle:  # it ends now unless another process uses it: give it a moment, so none is left behind
            _wait_gone(pid, child, CLOSE_WAIT)
        if child is not None and child.poll() is None:
            _poller.reap(child)

    # --- the collector process ------------------------------------------------------------------

    def check(self) -> None:
        """From the poller thread: a collector that went is replaced and given every task again."""
        with self._lock:
            if self._child is not None and self._child.poll() is not None:
                self._child = None  # reaped
            if self._watch is None:
                return
            ready, _, _ = select.select([self._watch], [], [], 0)
            if not ready:
                return
            try:
                if self._watch.recv(1, socket.MSG_DONTWAIT):
                    return  # the collector never writes on it; nothing to do with a stray byte
            except BlockingIOError:
                return
            except OSError:
                pass
            self._disconnect()
            if self._served:
                self._connect(start=True)

    def _request(self, request: dict[str, object]) -> str:
        with self._lock:
            for attempt in range(3):
                try:
                    conn = self._conn or self._connect(start=True)
                    conn.sendall(json.dumps(request).encode() + b"\n")
                    return _read_line(conn)
                except OSError:
                    self._disconnect()
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    def _adopt(self) -> bool:
        """Connect to a running collector, starting none; False when nothing answers."""
        try:
            self._connect(start=False)
        except OSError:
            return False
        return True

    def _connect(self, start: bool) -> socket.socket:
        """Connect to the data dir's collector (starting one when ``start`` and none answers), and
        give it every task this process serves: a collector that replaced a dead one knows none."""
        try:
            conn = _connect_unix(self.socket_path)
        except OSError:
            if not start:
                raise
            self._start()
            deadline = time.monotonic() + START_TIMEOUT
            while True:  # "busy": another process's collector won the start; it binds in a moment
                try:
                    conn = _connect_unix(self.socket_path)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        try:
            pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != os.geteuid():
                raise PermissionError(f"{self.socket_path} is served by uid {uid}, not by this user")
            watch = _connect_unix(self.socket_path)
        except BaseException:
            conn.close()
            raise
        conn.settimeout(REQUEST_TIMEOUT)
        if self.pid and pid != self.pid:
            self.restarts += 1
        self._conn, self._watch, self.pid = conn, watch, pid
        for served in list(self._served.values()):
            reply = self._send(self._add_request(served))
            if reply != "ok":  # planted since it was first added: said where the task's events go
                logcollector.Events(served.logmon.events)(reply.split(" ", 1)[-1])
        return conn

    def _send(self, request: dict[str, object]) -> str:
        assert self._conn is not None
        self._conn.sendall(json.dumps(request).encode() + b"\n")
        return _read_line(self._conn)

    @staticmethod
    def _add_request(served: _Served) -> dict[str, object]:
        logmon = served.logmon
        return {"op": "add", "dir": logmon.logs_dir, "task": logmon.task, "max_files": served.max_files,
                "max_size": served.max_size, "events": logmon.events, "fifos": served.fifos}  # fmt: skip

    def _start(self) -> None:
        args = [sys.executable, "-I", "-S", os.path.abspath(logcollector.__file__), "--serve", self.socket_path]
        child = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal goes to the run, which decides
            close_fds=True,
            cwd="/",
        )
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], START_TIMEOUT)
        line = child.stdout.readline().decode(errors="replace").strip() if ready else ""
        child.stdout.close()
        if line == "busy":
            child.wait()
            return
        if line != "ready":
            child.kill()
            child.wait()
            raise OSError(f'the log collector for data dir "{self.data_dir}" did not start within {START_TIMEOUT:g}s')
        if self._child is not None:
            _poller.reap(self._child)
        self._child = child

    def _disconnect(self) -> None:
        for conn in (self._conn, self._watch):
            if conn is not None:
                conn.close()
        self._conn = self._watch = None


def _wait_gone(pid: int, child: subprocess.Popen[bytes] | None, timeout: float) -> None:
    if child is not None and child.pid == pid:
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        return
    deadline = time.monotonic() + timeout
    while pid and _running(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an adopted collector is reaped by whoever its parent became)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            raise _CollectorGone("the log collector closed the connection")
        data += chunk
    return data.decode(errors="replace").strip()


def _connect_unix(path: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        conn.settimeout(START_TIMEOUT)
        if len(path.encode()) <= _SUN_PATH_MAX:
            conn.connect(path)
        else:  # longer than sun_path: through a descriptor of its directory
            dir_fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                conn.connect(f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}")
            finally:
                os.close(dir_fd)
    except BaseException:
        conn.close()
        raise
    return conn


def _read_identities(path: str) -> frozenset[tuple[int, int]]:
    """The (dev, ino) of the fifos the runner made for the task, kept in its private dir: after a
    restart those fifos belong to the task's user (runc chowns a task's stdio) and are still ours."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return frozenset()
    try:
        text = os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)
    known: set[tuple[int, int]] = set()
    for line in text.splitlines():
        dev, _, ino = line.partition(" ")
        if dev.isdigit() and ino.isdigit():
            known.add((int(dev), int(ino)))
    return frozenset(known)


def _write_identities(path: str, fifos: list[tuple[int, int]]) -> None:
    temp = f"{path}.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
    try:
        os.write(fd, "".join(f"{dev} {ino}\n" for dev, ino in fifos).encode())
    finally:
        os.close(fd)
    os.replace(temp, path)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def _unlink_fifos(logmon: Logmon) -> None:
    try:
        dir_fd = open_dir(logmon.logs_dir)
    except (Refused, FileNotFoundError):
        return  # the task swapped the logs dir for something else: nothing in there is ours to remove
    try:
        for fifo in (logmon.stdout_fifo, logmon.stderr_fifo):
            try:
                os.unlink(os.path.basename(fifo), dir_fd=dir_fd)
            except FileNotFoundError:
                pass
    finally:
        os.close(dir_fd)


def _room_for_fds(keepers: int) -> None:
    """Two keepers a task: past a few hundred tasks the soft open-file limit (1024) is lifted to
    the hard one, as Go programs do at start-up (and the plugins here do, see procwatch)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and keepers + 256 > soft and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # EMFILE later says it, for the task that did not fit


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stop_legacy(pid: int, logs_dir: str, timeout: float = 5.0) -> None:
    """A per-task collector of an older release on this logs dir: SIGTERM (it drains), then wait."""
    cmdline = _cmdline(pid)
    # Per-task collectors ran as these scripts of older releases (before the agent package layout).
    ours = "driversdk/runner/logcollector.py" in cmdline or "driversdk/runner/logcollect.py" in cmdline
    if not ours or f"--dir {logs_dir} " not in cmdline + " ":
        return  # the shared collector, or a pid reused by something else
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)


# --- one collector client per data dir in this process ---------------------------------------

_collectors: dict[str, LogCollector] = {}
_live: weakref.WeakSet[LogCollector] = weakref.WeakSet()  # every client, looked after by the poller
_live_lock = threading.Lock()
_holders: dict[str, int] = {}
_registry_lock = threading.Lock()


def collector_for(data_dir: str) -> LogCollector:
    """This process's client of ``data_dir``'s collector (made on first use; starts nothing yet)."""
    key = os.path.realpath(data_dir)
    with _registry_lock:
        collector = _collectors.get(key)
        if collector is None:
            collector = _collectors[key] = LogCollector(key)
        return collector


def acquire(data_dir: str) -> LogCollector:
    """A run or an agent holds the data dir's collector client for its life (see :func:`release`)."""
    collector = collector_for(data_dir)
    with _registry_lock:
        _holders[collector.data_dir] = _holders.get(collector.data_dir, 0) + 1
    return collector


def release(data_dir: str) -> None:
    """The run or agent is done: let go of the collector. With no task left it ends; tasks left
    running (an agent's shutdown) keep it serving, and the next run or agent adopts it."""
    key = os.path.realpath(data_dir)
    with _registry_lock:
        _holders[key] = _holders.get(key, 1) - 1
        if _holders[key] > 0:
            return
        del _holders[key]
        collector = _collectors.pop(key, None)
    if collector is not None:
        collector.close()


def spawn(
    logs_dir: str,
    task: str,
    max_files: int,
    max_size: int,
    timeout: float = START_TIMEOUT,
    events: str | None = None,
    legacy_pid: int = 0,
) -> Logmon:
    """Have the data dir's collector serve the task (see :meth:`LogCollector.add`)."""
    del timeout  # the collector's start has its own (START_TIMEOUT); kept for callers
    return collector_for(data_dir_of(logs_dir)).add(logs_dir, task, max_files, max_size, events, legacy_pid)


def stop(logmon: Logmon, timeout: float = 5.0) -> None:
    """Let the collector drain what the task's fifos still hold, then remove the fifos. A client
    that nobody holds (:func:`acquire`) and that serves nothing more lets go of the collector."""
    del timeout
    key = data_dir_of(logmon.logs_dir)
    collector = collector_for(key)
    collector.remove(logmon)
    with _registry_lock:
        idle = key not in _holders and not collector.serves() and _collectors.get(key) is collector
        if idle:
            del _collectors[key]
    if idle:
        collector.close()


# --- the one thread: events of every task, and the collectors' health --------------------------


class _Poller:
    """One thread per process, however many tasks: reads every watched task's events file and
    notices a collector that went (then :meth:`LogCollector.check` replaces it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[str, tuple[Logmon, Callable[[str], None]]] = {}
        self._zombies: list[subprocess.Popen[bytes]] = []
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True, name="logmon")
                self._thread.start()

    def watch(self, logmon: Logmon, callback: Callable[[str], None]) -> None:
        with self._lock:
            self._watched[logmon.events] = (logmon, callback)
        self.start()

    def unwatch(self, logmon: Logmon) -> None:
        with self._lock:
            self._watched.pop(logmon.events, None)

    def reap(self, child: subprocess.Popen[bytes]) -> None:
        """A collector we started and no longer use: waited for when it ends, never a zombie."""
        with self._lock:
            self._zombies.append(child)

    def _run(self) -> None:
        while True:
            time.sleep(EVENT_POLL)
            try:
                self._turn()
            except Exception:  # the thread must outlive anything one turn meets; the next one tries again
                pass

    def _turn(self) -> None:
        with _live_lock:
            collectors = list(_live)
        for collector in collectors:
            try:
                collector.check()
            except Exception:  # tried again next turn; the tasks' writes wait in their fifos
                pass
        with self._lock:
            watched = list(self._watched.values())
            self._zombies = [z for z in self._zombies if z.poll() is None]
        for logmon, callback in watched:
            for sentence in new_events(logmon):
                try:
                    callback(sentence)
                except Exception:  # one task's report must not end everyone's
                    pass


_poller = _Poller()


def watch_events(logmon: Logmon, callback: Callable[[str], None]) -> None:
    """Have the poller thread hand ``callback`` each sentence the collector reports for the task."""
    _poller.watch(logmon, callback)


def unwatch_events(logmon: Logmon) -> None:
    _poller.unwatch(logmon)


def is_log_file(path: str) -> bool:
    """For readers of the logs: a regular file with one name, never what a symlink points at."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def read_events(path: str, offset: int) -> tuple[list[str], int]:
    """The complete lines a collector reported after ``offset``, and the offset to read from next."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
    except FileNotFoundError:
        return [], offset
    chunks: list[bytes] = []
    try:
        while chunk := os.pread(fd, 65536, offset + sum(map(len, chunks))):
            chunks.append(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
    return data[:end].decode(errors="replace").splitlines(), offset + end


_event_offsets: dict[str, int] = {}
_event_lock = threading.Lock()


def new_events(logmon: Logmon) -> list[str]:
    """What this collector reported since the last call for it in this process."""
    with _event_lock:
        lines, _event_offsets[logmon.events] = read_events(logmon.events, _event_offsets.get(logmon.events, 0))
    return lines
