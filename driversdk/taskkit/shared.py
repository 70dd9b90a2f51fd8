"""The shared task supervisor: one ``launch.py serve`` per plugin state dir runs every task.

A process per task (a Python supervisor, plus a foreground ``runc run`` for exec) costs some
20 MiB per task; a thousand tasks would not fit a node's budget. Instead the plugin asks one
long-lived supervisor, over a 0600 unix socket in its state dir, to start each task: the request
names the task's launch spec (written first, as for the per-task supervisor) and carries the
task's stdout and stderr fds. The supervisor is a child subreaper, so every task (and the
container init ``runc run --detach`` leaves behind) is its child; it writes each task's
``exit_status`` when it reaps it, and outlives the plugin, whose successor adopts it by
connecting to the same socket. With no task left and no request for a moment it exits; the next
start brings up a fresh one.

The plugin follows the task's own pid (pid plus start time, as pids are reused), not the
supervisor's, and reads the status file once the task is gone.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Self

from driversdk.errors import DriverError
from driversdk.taskkit import supervisor
from driversdk.taskkit.owner import ProcessIdentity
from driversdk.taskkit.supervisor import Launch

SOCKET_NAME = "supervisor.sock"  # launch.py's
SERVE = "serve"
CONNECT_ATTEMPTS = 50
RETRY_PAUSE = 0.1
REPLY_TIMEOUT = 60.0
QUIT_WAIT = 5.0
"""``runc run --detach`` answers only once the container runs; under load that takes a while."""

_start_lock = threading.Lock()  # one plugin thread brings a supervisor up at a time


@dataclass(frozen=True)
class Spawned:
    """A task the shared supervisor started."""

    supervisor: ProcessIdentity
    task: ProcessIdentity


@dataclass(frozen=True, kw_only=True)
class SharedRunState:
    """The processes a kit driver's saved task state (exec's, raw_exec's) follows: the fields are
    flat, so they sit in the driver's state JSON beside its own, under these names.

    A task run by the shared supervisor has both identities (pid plus start time). One whose
    ``task_start_time`` is 0 runs under a supervisor of its own, which is then the process
    followed by ``supervisor_pid``. The fields are keyword-only, so a driver's own fields keep
    their order in its constructor.
    """

    supervisor_pid: int
    supervisor_start_time: int = 0
    task_pid: int = 0
    """The task's main process on the host, a child of the shared supervisor."""
    task_start_time: int = 0

    def running(self, run: Spawned) -> Self:
        """This state once the shared supervisor runs the task: both processes' identities set."""
        return replace(
            self,
            supervisor_pid=run.supervisor.pid,
            supervisor_start_time=run.supervisor.start_time,
            task_pid=run.task.pid,
            task_start_time=run.task.start_time,
        )

    @property
    def shared_run(self) -> Spawned | None:
        """The task and the shared supervisor running it; None for a task under a supervisor of its own."""
        if not self.task_start_time:
            return None
        sup = ProcessIdentity(self.supervisor_pid, self.supervisor_start_time)
        return Spawned(sup, ProcessIdentity(self.task_pid, self.task_start_time))


def is_server(identity: ProcessIdentity) -> bool:
    """Whether ``identity`` is still a running shared supervisor (pid and start time, so not a
    process that reused the pid)."""
    if identity.pid <= 0 or not identity.alive():
        return False
    try:
        with open(f"/proc/{identity.pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return argv[3:5] == [supervisor.LAUNCH.encode(), SERVE.encode()]


def spawn(state_dir: str, task_dir: str, launch: Launch, stdout_fd: int, stderr_fd: int, *, task: str) -> Spawned:
    """Have ``state_dir``'s shared supervisor (started when none answers) run ``launch`` with the
    task's files in ``task_dir``, a dir of ``<state_dir>/tasks``."""
    spec_file = supervisor.write_spec(task_dir, launch)
    request = f"spawn {spec_file}\n".encode()
    for _ in range(CONNECT_ATTEMPTS):
        conn = _connect(state_dir)
        if conn is None:
            if not _start_server(state_dir, task=task):
                time.sleep(RETRY_PAUSE)  # the one holding the lock is on its way out
            continue
        with conn:
            peer = _peer(conn)
            try:
                socket.send_fds(conn, [request], [stdout_fd, stderr_fd])
                reply = _read_line(conn)
            except TimeoutError:
                raise DriverError(
                    f"task {task!r}: the task supervisor (pid {peer.pid}) did not answer within {REPLY_TIMEOUT:.0f}s",
                    recoverable=True,
                ) from None
            except OSError:
                reply = ""
        if not reply:
            # It was exiting (idle) with our connection queued: the request was never read.
            time.sleep(RETRY_PAUSE)
            continue
        kind, _, rest = reply.strip().partition(" ")
        words = rest.split()
        if kind == "ok" and len(words) == 2 and all(w.isdigit() for w in words):
            return Spawned(peer, ProcessIdentity(int(words[0]), int(words[1])))
        detail = rest if kind == "err" and rest else f"the task supervisor answered {reply.strip()!r}"
        raise DriverError(f"task {task!r} could not be started: {detail}")
    raise DriverError(
        f"task {task!r}: no task supervisor answered on {os.path.join(state_dir, SOCKET_NAME)}; "
        "check that the plugin's state dir is writable",
        recoverable=True,
    )


def release(state_dir: str) -> None:
    """Ask ``state_dir``'s supervisor to leave now if it supervises nothing (this plugin destroyed
    its last task; another plugin of the state dir may still have some: then it stays), and wait
    for it to be gone. Left alone it would leave by itself once idle for a moment."""
    conn = _connect(state_dir)
    if conn is None:
        return
    with conn:
        try:
            peer = _peer(conn)
            conn.settimeout(QUIT_WAIT)
            conn.sendall(b"quit\n")
            if _read_line(conn).strip() != "bye":
                return
        except (OSError, DriverError):
            return
    try:
        pidfd = os.pidfd_open(peer.pid)
    except ProcessLookupError:
        return
    try:
        if peer.alive():
            # Readable once it exited (a zombie too): after the bye only its exit is left.
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.poll(QUIT_WAIT * 1000)
    finally:
        os.close(pidfd)


def _connect(state_dir: str) -> socket.socket | None:
    # Through the dir's fd: a socket path is limited to 108 bytes, a state dir is not.
    dirfd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(REPLY_TIMEOUT)
        conn.connect(f"/proc/self/fd/{dirfd}/{SOCKET_NAME}")
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        return None
    finally:
        os.close(dirfd)
    return conn


def _peer(conn: socket.socket) -> ProcessIdentity:
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != os.geteuid():  # the state dir is ours alone; a socket someone else bound is not asked
        raise DriverError(f"the task supervisor socket in the state dir is served by uid {uid}, not this plugin's")
    return ProcessIdentity.of(pid) or ProcessIdentity(pid, 0)


def _read_line(conn: socket.socket) -> str:
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace") if data.endswith(b"\n") else ""


def _start_server(state_dir: str, *, task: str) -> bool:
    """Start ``launch.py serve`` (own session, stdio on /dev/null); returns once it listens (True)
    or found another one holding the state dir's supervisor lock (False)."""
    with _start_lock:
        probe = _connect(state_dir)
        if probe is not None:  # another thread of ours started it meanwhile
            probe.close()
            return True
        stdio: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
        ]
        argv = supervisor.launcher(SERVE, os.path.realpath(state_dir))
        # Our child until we exit: the watcher reaps it, so no zombie stays when it ends.
        _pid, line = supervisor.start_launcher(argv, stdio, task=task, reaped=True)
        if line.startswith(("ready", "busy")):
            return line.startswith("ready")
        raise DriverError(f"task {task!r}: the task supervisor did not start: {line.strip() or 'it exited'}")


__all__ = ["Spawned", "is_server", "release", "spawn"]
