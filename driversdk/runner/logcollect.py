"""Log collection as Nomad's logmon does it: read a task's fifos into rotated files.

Files are ``<task>.stdout.<N>`` / ``<task>.stderr.<N>`` in ``<alloc>/alloc/logs``; a file that
reaches ``max_file_size`` MB moves on to N+1, and only the newest ``max_files`` are kept.

The reader is a small detached process per task (:func:`spawn`), not a thread of ``driversdk
run``: a task writing straight into its fifo (exec) would die of SIGPIPE the moment the run
process is killed, and a restarted run could not recover it. This module imports only the
standard library so that process starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

MIB = 1024 * 1024


class RotatingFile:
    def __init__(self, directory: str, base: str, max_files: int, max_size: int) -> None:
        self.directory = directory
        self.base = base
        self.max_files = max(1, max_files)
        self.max_size = max(1, max_size)
        pattern = re.compile(re.escape(base) + r"\.(\d+)$")
        existing = [int(m.group(1)) for n in os.listdir(directory) if (m := pattern.match(n))]
        self.index = max(existing, default=0)  # resume at the highest existing index
        self._file = open(self._path(self.index), "ab")  # noqa: SIM115 - kept open across writes

    def _path(self, index: int) -> str:
        return os.path.join(self.directory, f"{self.base}.{index}")

    def write(self, data: bytes) -> None:
        while data:
            room = self.max_size - self._file.tell()
            if room <= 0:
                self._rotate()
                continue
            chunk, data = data[:room], data[room:]
            self._file.write(chunk)
        self._file.flush()

    def _rotate(self) -> None:
        self._file.close()
        self.index += 1
        self._file = open(self._path(self.index), "ab")  # noqa: SIM115
        for old in range(self.index - self.max_files, -1, -1):
            try:
                os.unlink(self._path(old))
            except FileNotFoundError:
                break

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class Logmon:
    """A running log monitor: its pid and the two fifos it reads."""

    pid: int
    stdout_fifo: str
    stderr_fifo: str


def fifo_paths(logs_dir: str, task: str) -> tuple[str, str]:
    return os.path.join(logs_dir, f".{task}.stdout.fifo"), os.path.join(logs_dir, f".{task}.stderr.fifo")


def spawn(logs_dir: str, task: str, max_files: int, max_size: int, timeout: float = 10.0) -> Logmon:
    """Create the task's fifos (0600) and start a detached reader; returns once it holds them open."""
    stdout_fifo, stderr_fifo = fifo_paths(logs_dir, task)
    for fifo in (stdout_fifo, stderr_fifo):
        if not os.path.exists(fifo):
            os.mkfifo(fifo, 0o600)
    args = [sys.executable, "-I", "-S", os.path.abspath(__file__), "--dir", logs_dir, "--task", task,
            "--max-files", str(max_files), "--max-size", str(max_size)]  # fmt: skip
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
    line = child.stdout.readline() if ready else b""
    child.stdout.close()
    if line.strip() != b"ready":
        child.kill()
        child.wait()
        raise OSError(f'the log collector for task "{task}" did not start within {timeout:g}s')
    _children[child.pid] = child
    return Logmon(child.pid, stdout_fifo, stderr_fifo)


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
    return __file__.rsplit(".", 1)[0] in cmdline and logs_dir in cmdline


def stop(logmon: Logmon, timeout: float = 5.0) -> None:
    """Let the collector drain what the fifos still hold, then remove the fifos."""
    if alive(logmon):
        try:
            os.kill(logmon.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        child = _children.pop(logmon.pid, None)
        if child is not None:
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        else:  # adopted from an earlier run: not our child, so poll
            deadline = time.monotonic() + timeout
            while os.path.exists(f"/proc/{logmon.pid}") and time.monotonic() < deadline:
                time.sleep(0.02)
    for fifo in (logmon.stdout_fifo, logmon.stderr_fifo):
        try:
            os.unlink(fifo)
        except FileNotFoundError:
            pass


def _collect(logs_dir: str, task: str, max_files: int, max_size: int) -> None:
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
    sinks = {}
    for fifo, kind in zip(fifo_paths(logs_dir, task), ("stdout", "stderr"), strict=True):
        # Read-write: the reader never sees end-of-file when a writer goes and comes back.
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        sinks[fd] = RotatingFile(logs_dir, f"{task}.{kind}", max_files, max_size)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
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
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if chunk:
                sinks[fd].write(chunk)
                got = True
        if stopping and not got:
            break
    for fd, sink in sinks.items():
        os.close(fd)
        sink.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="copy a task's stdout/stderr fifos into rotated files")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--max-files", type=int, default=10)
    parser.add_argument("--max-size", type=int, default=10 * MIB)
    args = parser.parse_args(argv)
    _collect(args.dir, args.task, args.max_files, args.max_size)


if __name__ == "__main__":
    main()
