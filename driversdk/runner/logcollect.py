"""Log collection as Nomad's logmon does it: read a task's fifos into rotated files.

Files are ``<task>.stdout.<N>`` / ``<task>.stderr.<N>`` in ``<alloc>/alloc/logs``; a file that
reaches ``max_file_size`` MB moves on to N+1, and only the newest ``max_files`` are kept.

The reader is a small detached process per task (:func:`spawn`), not a thread of ``driversdk
run``: a task writing straight into its fifo (exec) would die of SIGPIPE the moment the run
process is killed, and a restarted run could not recover it. That process is
:mod:`driversdk.runner.logcollector`; this module is the runner's side of it (start, adopt, stop,
read what it reported).

The collector runs as root, and ``alloc/logs`` is writable by the task (exec mounts the alloc
dir), so every name in it is the task's to change at any moment. The collector therefore holds
the logs dir open once and works only relative to that descriptor, never follows a symlink, and
writes only to regular files it owns that have no other name (a hard link to a host file is
refused like a symlink). A refused log file is left where it is and the collector moves on to the
next index, so no output is lost; each refusal is one line in an events file outside the task's
view (``<alloc>/<task>/private``, which no driver shows the task), which the runner reads with
:func:`read_events` and prints as a task event.
"""

import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from driversdk.childwait import wait_child
from driversdk.runner import logcollector
from driversdk.runner.logcollector import (
    _NOFOLLOW,
    CHUNK,
    LOG_MODE,
    MIB,
    Refused,
    RotatingFile,
    _dir_refusal,
    fifo_paths,
    open_dir,
)

__all__ = ["CHUNK", "LOG_MODE", "MIB", "Logmon", "Refused", "RotatingFile", "fifo_paths", "open_dir", "spawn", "stop"]


def events_path(logs_dir: str, task: str) -> str:
    """``<alloc>/<task>/private/logmon.events``: Nomad's task-private dir, never shown to the task."""
    alloc_dir = os.path.dirname(os.path.dirname(os.path.abspath(logs_dir)))
    return os.path.join(alloc_dir, task, "private", "logmon.events")


@dataclass(frozen=True)
class Logmon:
    """A running log monitor: its pid, the two fifos it reads and the file it reports to."""

    pid: int
    stdout_fifo: str
    stderr_fifo: str
    events: str = ""

    def __post_init__(self) -> None:
        if not self.events:  # adopted from state.db, which records the pid only
            task = os.path.basename(self.stdout_fifo)[1 : -len(".stdout.fifo")]
            object.__setattr__(self, "events", events_path(os.path.dirname(self.stdout_fifo), task))


def spawn(
    logs_dir: str, task: str, max_files: int, max_size: int, timeout: float = 10.0, events: str | None = None
) -> Logmon:
    """Create the task's fifos (0600) and start a detached reader; returns once it holds them open.

    ``events`` is where the collector reports what it refused; by default the task's private dir.
    """
    # Imported here: the collector process itself must start on the standard library alone.
    from driversdk.errors import DriverError

    events = events or events_path(logs_dir, task)
    os.makedirs(os.path.dirname(events), mode=0o700, exist_ok=True)
    try:
        dir_fd = open_dir(logs_dir)
    except Refused as err:
        raise DriverError(_dir_refusal(task, logs_dir, err)) from None
    made: list[str] = []
    try:
        for fifo in fifo_paths(logs_dir, task):
            try:
                os.mkfifo(os.path.basename(fifo), 0o600, dir_fd=dir_fd)
                made.append(os.path.basename(fifo))
            except FileExistsError:
                pass  # a restarted run adopts its task's fifos; the collector checks what is there
        args = [sys.executable, "-I", "-S", os.path.abspath(logcollector.__file__), "--dir", logs_dir, "--task", task,
                "--max-files", str(max_files), "--max-size", str(max_size), "--events", events]  # fmt: skip
        child = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal goes to the run, which decides
            close_fds=True,
        )
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], timeout)
        line = child.stdout.readline().decode(errors="replace").strip() if ready else ""
        child.stdout.close()
        if line != "ready":
            child.kill()
            child.wait()
            if line.startswith("refused "):
                raise DriverError(line.removeprefix("refused "))
            raise OSError(f'the log collector for task "{task}" did not start within {timeout:g}s')
    except BaseException:
        for name in made:  # nothing leaks: only the fifos this call made, never the task's
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass
        raise
    finally:
        os.close(dir_fd)
    _children[child.pid] = child
    stdout_fifo, stderr_fifo = fifo_paths(logs_dir, task)
    return Logmon(child.pid, stdout_fifo, stderr_fifo, events)


_children: dict[int, subprocess.Popen[bytes]] = {}


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(logmon: Logmon) -> bool:
    """True when that pid is still our collector for those fifos (pids get reused)."""
    child = _children.get(logmon.pid)
    if child is not None and child.poll() is not None:
        return False
    cmdline = _cmdline(logmon.pid)
    logs_dir = os.path.dirname(logmon.stdout_fifo)
    # The collector's module by its package path, not this file's absolute one: a run of an
    # upgraded installation (another venv, another checkout) adopts what the previous one started.
    # logcollect.py: what releases before the collector had a module of its own started.
    ours = "driversdk/runner/logcollector.py" in cmdline or "driversdk/runner/logcollect.py" in cmdline
    return ours and f"--dir {logs_dir} " in cmdline + " "


def stop(logmon: Logmon, timeout: float = 5.0) -> None:
    """Let the collector drain what the fifos still hold, then remove the fifos."""
    if alive(logmon):
        try:
            os.kill(logmon.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        child = _children.pop(logmon.pid, None)
        if child is not None:
            if not wait_child(child, timeout):
                child.kill()
                child.wait()
        else:  # adopted from an earlier run: not our child, so poll
            deadline = time.monotonic() + timeout
            while os.path.exists(f"/proc/{logmon.pid}") and time.monotonic() < deadline:
                time.sleep(0.02)
    try:
        dir_fd = open_dir(os.path.dirname(logmon.stdout_fifo))
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
