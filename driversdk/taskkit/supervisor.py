"""Starting a task under the kit's supervisor (launch.py) and reading what it recorded.

Every process driver built on the kit runs each task the same way: the plugin writes a
:class:`Launch` to the task's ``launch.json``, starts the supervisor (posix_spawn, its own
session, every signal at its default and none blocked, stdin on /dev/null, stdout/stderr on the
task's log fifos) and waits for ``ok <pid>`` on a pipe. The supervisor outlives the plugin and
writes ``<exit code> <signal>`` to ``exit_status`` when the task ends, so a relaunched plugin
learns how a task it did not start ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from driversdk import procwatch
from driversdk.errors import DriverError
from driversdk.taskkit.ids import HostUser

LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")
SPEC_FILE = "launch.json"
STATUS_FILE = "exit_status"
READY_FD = 3
READY_TIMEOUT = 30.0
SIGNAL_OFFSET = 128
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SUPERVISOR_ENV = {"PATH": DEFAULT_PATH}
NOFILE_ENV = "DRIVERSDK_TASK_NOFILE"  # launch.py's: the soft open-file limit to give the task


@dataclass(frozen=True)
class Launch:
    """How to start one task: what a driver's launch step returns and the supervisor carries out."""

    path: str
    """The program, resolved to a file (the supervisor execs it without a PATH search)."""
    argv: list[str]
    env: dict[str, str]
    cwd: str
    user: HostUser | None = None
    """Who the task runs as; None: the plugin's own user."""
    cgroup_procs: list[str] = field(default_factory=list)
    """cgroup.procs files the task writes itself into before its exec."""
    oom_score_adj: int | None = None
    netns: str = ""
    """A network namespace to enter (the allocation's, in group network mode)."""
    signal_in_exit_code: bool = False
    """The program reports its child's death by signal N as exit 128 + N (runc, a shell)."""
    pid_file: str = ""
    """The program is a launcher (``runc run --detach``): it starts the task, writes the task's pid
    here and exits 0; the shared supervisor then follows that pid as the task."""

    def spec(self, status_file: str) -> dict[str, Any]:
        user = self.user
        return {
            "path": self.path,
            "argv": self.argv,
            "env": self.env,
            "cwd": self.cwd,
            "switch_user": user is not None,
            "uid": user.uid if user else os.geteuid(),
            "gid": user.gid if user else os.getegid(),
            "groups": list(user.groups) if user else [],
            "oom_score_adj": self.oom_score_adj,
            "cgroup_procs": self.cgroup_procs,
            "netns": self.netns,
            "status_file": status_file,
            "signal_in_exit_code": self.signal_in_exit_code,
            "pid_file": self.pid_file,
        }


def launcher_env() -> dict[str, str]:
    """The launcher's environment. The plugin raised its own open-file limit (one pidfd per
    task); the launcher puts back the limit the plugin was started with, as Nomad's tasks get
    the agent's."""
    nofile = procwatch.original_nofile_soft()
    return SUPERVISOR_ENV if nofile is None else {**SUPERVISOR_ENV, NOFILE_ENV: str(nofile)}


def launcher(mode: str, spec_file: str, *extra: str) -> list[str]:
    """argv of ``launch.py`` in ``mode``; -I -S: nothing from the plugin's environment, cwd or
    site-packages is imported."""
    return [sys.executable, "-I", "-S", LAUNCH, mode, spec_file, *extra]


def default_signals() -> list[int]:
    """Every signal a spawned supervisor starts with at its default action."""
    return [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def write_spec(task_dir: str, launch: Launch) -> str:
    """Write ``launch`` to ``task_dir``'s spec file (a new file); returns its path."""
    spec_file = os.path.join(task_dir, SPEC_FILE)
    fd = os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(launch.spec(os.path.join(task_dir, STATUS_FILE)), fh)
    return spec_file


def spawn(task_dir: str, launch: Launch, stdout_fd: int, stderr_fd: int, *, task: str) -> tuple[int, int]:
    """Write ``launch`` to ``task_dir``'s spec file and start the supervisor; returns (supervisor
    pid, task pid) once the task's exec succeeded."""
    spec_file = write_spec(task_dir, launch)
    stdio: list[tuple[Any, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, stdout_fd, 1),
        (os.POSIX_SPAWN_DUP2, stderr_fd, 2),
    ]
    pid, line = start_launcher(launcher("supervise", spec_file), stdio, task=task)
    kind, _, rest = line.strip().partition(" ")
    if kind == "ok" and rest.isdigit():
        return pid, int(rest)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    detail = rest if kind == "err" and rest else "the supervisor exited before starting the task"
    raise DriverError(f"task {task!r} could not be started: {detail}")


def start_launcher(
    argv: list[str], stdio: list[tuple[Any, ...]], *, task: str, reaped: bool = False
) -> tuple[int, str]:
    """posix_spawn ``launch.py`` (``argv``: :func:`launcher`'s) in a session of its own, every signal at
    its default and none blocked, fds 0-2 as ``stdio``'s file actions make them; returns its pid and
    the line it reported on the ready pipe (empty when it exited first). ``reaped``: the process
    watcher reaps it when it ends, from before it reports (for a child no task's watch follows)."""
    read_end, write_end = os.pipe()
    if write_end == READY_FD:  # dup2 onto itself would keep close-on-exec set
        moved = os.dup(write_end)
        os.close(write_end)
        write_end = moved
    try:
        try:
            pid = os.posix_spawn(
                sys.executable,
                argv,
                launcher_env(),
                file_actions=[*stdio, (os.POSIX_SPAWN_DUP2, write_end, READY_FD)],
                setsid=True,
                setsigmask=(),
                setsigdef=default_signals(),
            )
        except OSError as err:
            raise DriverError(
                f"task {task!r}: failed to start the task supervisor {sys.executable}: {err.strerror}",
                recoverable=True,
            ) from None
        finally:
            os.close(write_end)
        if reaped:
            procwatch.watch(pid, lambda _code: None, reap=True)
        line = read_ready(read_end, pid)
    finally:
        os.close(read_end)
    return pid, line


def read_ready(fd: int, pid: int) -> str:
    data = b""
    deadline = time.monotonic() + READY_TIMEOUT
    # poll, not select: with a pidfd per watched task, fd numbers pass select's limit of 1024.
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            raise DriverError(
                f"the task supervisor (pid {pid}) did not report within {READY_TIMEOUT:.0f}s", recoverable=True
            )
        if not poller.poll(remaining * 1000):
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


@dataclass(frozen=True)
class Status:
    """What the status file says: the task's exit code and the signal that ended it (0: none)."""

    exit_code: int
    signal: int
    finished_at: float


def read_status(status_file: str) -> Status | None:
    """The recorded exit, or None while there is none. Also reads what supervisors of earlier
    driversdk versions, still running a task a newer plugin recovers, write: exec's shell
    (``<code>\\n``, a signal as 128 + N) and ProcessDriver's shim (``{"exit_code", "signal"}``)."""
    try:
        with open(status_file) as fh:
            raw = fh.read()
        finished = os.stat(status_file).st_mtime
    except FileNotFoundError:
        return None
    if raw.startswith("{"):
        try:
            saved = json.loads(raw)
            return Status(int(saved["exit_code"]), int(saved["signal"]), finished)
        except (ValueError, KeyError, TypeError):
            return None
    parts = raw.split()
    if not raw.endswith("\n") or len(parts) not in (1, 2) or not all(p.lstrip("-").isdigit() for p in parts):
        return None  # created but not written yet
    code = int(parts[0])
    if len(parts) == 2:
        return Status(exit_code=code, signal=int(parts[1]), finished_at=finished)
    sig = code - SIGNAL_OFFSET if SIGNAL_OFFSET < code <= SIGNAL_OFFSET + 64 else 0
    return Status(exit_code=code, signal=sig, finished_at=finished)


def is_supervisor(pid: int, spec_file: str) -> bool:
    """Whether ``pid`` is still this task's supervisor (guards against pid reuse)."""
    argv = _cmdline(pid)
    return b"supervise" in argv and spec_file.encode() in argv


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []


def processes_naming(*args: str, among: Iterable[int] | None = None) -> list[int]:
    """Pids (ours excluded) whose argv holds one of ``args`` as a whole argument: a task's
    supervisor and launchers name its spec file, runc's processes its container id. ``among``:
    look only at those pids, not at every process on the node."""
    wanted = {a.encode() for a in args}
    pids = among if among is not None else (int(name) for name in os.listdir("/proc") if name.isdigit())
    return [pid for pid in pids if pid != os.getpid() and wanted.intersection(_cmdline(pid))]


def children_of(*parents: int) -> list[int] | None:
    """The child processes of ``parents`` (each thread keeps its own list in /proc); None on a
    kernel built without those lists (CONFIG_PROC_CHILDREN), where only a full scan finds them."""
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children"):
        return None
    found: list[int] = []
    for parent in parents:
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # gone
        for tid in threads:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fh:
                    found.extend(int(pid) for pid in fh.read().split())
            except (OSError, ValueError):
                continue  # the thread ended meanwhile
    return found
