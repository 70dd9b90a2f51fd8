"""Log collection as Nomad's logmon does it: read a task's fifo into rotated files.

Files are ``<task>.stdout.<N>`` / ``<task>.stderr.<N>`` in ``<alloc>/alloc/logs``; a file that
reaches ``max_file_size`` MB moves on to N+1, and only the newest ``max_files`` are kept.
"""

from __future__ import annotations

import os
import re
import select
import threading

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


class FifoCollector:
    """Creates a task's fifo (0600) and copies whatever is written into rotated files."""

    def __init__(self, fifo: str, sink: RotatingFile) -> None:
        self.fifo = fifo
        self.sink = sink
        if not os.path.exists(fifo):
            os.mkfifo(fifo, 0o600)
        # Read-write: the collector never sees end-of-file when a writer goes and comes back.
        self._fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"logs-{os.path.basename(fifo)}")
        self._thread.start()

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self._fd, 65536)
                except BlockingIOError:
                    continue
                if chunk:
                    self.sink.write(chunk)
                    continue
            if self._stop.is_set():
                return

    def close(self) -> None:
        """Drain what is buffered, then stop and remove the fifo."""
        self._stop.set()
        self._thread.join(5)
        os.close(self._fd)
        self.sink.close()
        try:
            os.unlink(self.fifo)
        except FileNotFoundError:
            pass
