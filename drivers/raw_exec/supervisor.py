"""The plugin's side of the supervisor (launch.py): start it, hear whether the task started,
recognise it again after a plugin restart, wait for it, read the exit it recorded."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

import drivers
from driversdk import procwatch
from driversdk.errors import DriverError

LAUNCH_MODULE = "drivers.raw_exec.launch"
READY_FD = 3
READY_TIMEOUT = 30.0
# The directory that holds the ``drivers`` package: the supervisor imports launch.py from it.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(drivers.__file__)))
BOOTSTRAP = (
    f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r}); from {LAUNCH_MODULE} import main; sys.exit(main(sys.argv[1:]))"
)
SUPERVISOR_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
NOFILE_ENV = "DRIVERSDK_TASK_NOFILE"  # launch.py's: the soft open-file limit to give the task


def launcher_env() -> dict[str, str]:
    """The launcher's environment. The plugin raised its own open-file limit (one pidfd per
    task); the launcher puts back the limit the plugin was started with, as Nomad's tasks get
    the agent's."""
    nofile = procwatch.original_nofile_soft()
    return SUPERVISOR_ENV if nofile is None else {**SUPERVISOR_ENV, NOFILE_ENV: str(nofile)}


def launcher(mode: str, spec_file: str, *extra: str) -> list[str]:
    """argv of ``launch.py`` in ``mode``; -I: nothing from the plugin's environment or cwd is imported."""
    return [sys.executable, "-I", "-c", BOOTSTRAP, mode, spec_file, *extra]


def _reset_signals() -> list[int]:
    return [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def spawn(spec_file: str, stdout_fd: int, stderr_fd: int, *, task: str) -> tuple[int, int]:
    """Start the supervisor; returns (supervisor pid, task pid) once the task's exec succeeded."""
    read_end, write_end = os.pipe()
    if write_end == READY_FD:  # dup2 onto itself would keep close-on-exec set
        moved = os.dup(write_end)
        os.close(write_end)
        write_end = moved
    file_actions: list[tuple[Any, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, stdout_fd, 1),
        (os.POSIX_SPAWN_DUP2, stderr_fd, 2),
        (os.POSIX_SPAWN_DUP2, write_end, READY_FD),
    ]
    try:
        try:
            pid = os.posix_spawn(
                sys.executable,
                launcher("supervise", spec_file),
                launcher_env(),
                file_actions=file_actions,
                setsid=True,
                setsigmask=(),
                setsigdef=_reset_signals(),
            )
        except OSError as err:
            raise DriverError(
                f"task {task!r}: failed to start the task supervisor {sys.executable}: {err.strerror}",
                recoverable=True,
            ) from None
        finally:
            os.close(write_end)
        line = _read_ready(read_end, pid)
    finally:
        os.close(read_end)
    kind, _, rest = line.strip().partition(" ")
    if kind == "ok" and rest.isdigit():
        return pid, int(rest)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    detail = rest if kind == "err" and rest else "the supervisor exited before starting the task"
    raise DriverError(f"task {task!r} could not be started: {detail}")


def _read_ready(fd: int, pid: int) -> str:
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
    exit_code: int
    signal: int
    finished_at: float


def read_status(status_file: str) -> Status | None:
    try:
        with open(status_file) as fh:
            raw = fh.read()
        finished = os.stat(status_file).st_mtime
    except FileNotFoundError:
        return None
    parts = raw.split()
    if not raw.endswith("\n") or len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
        return None
    return Status(exit_code=int(parts[0]), signal=int(parts[1]), finished_at=finished)


def is_supervisor(pid: int, spec_file: str) -> bool:
    """Whether ``pid`` is still this task's supervisor (guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return b"supervise" in argv and spec_file.encode() in argv
