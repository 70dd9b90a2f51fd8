"""Copy a container's stdout and stderr into the task's log fifos, resumably.

Each stream is followed with engine timestamps; the newest timestamp copied is written to a
position file, so a plugin that restarts (and recovers the task) asks the engine only for what
came after it: no line is lost and none is written twice.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
from datetime import datetime
from typing import Any

log = logging.getLogger("driversdk.docker.logs")


def _parse_ts(text: bytes) -> float:
    # 2026-11-22T12:00:00.123456789Z: datetime takes microseconds; keep nanoseconds apart.
    s = text.decode()
    main, _, frac = s.rstrip("Z").partition(".")
    base = datetime.fromisoformat(main + "+00:00").timestamp()
    return base + (int(frac.ljust(9, "0")[:9]) / 1e9 if frac else 0.0)


class PositionFile:
    """The engine timestamp (as text, nanosecond precision) of the last line copied, per stream."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> str:
        try:
            with open(self.path) as fh:
                return fh.read().strip()
        except FileNotFoundError:
            return ""

    def write(self, ts: str) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(ts)
        os.replace(tmp, self.path)


class StreamCopier:
    """Follows one stream (stdout or stderr) of a container into one fifo."""

    def __init__(
        self, api: Any, container_id: str, stream: str, fifo: str, position: PositionFile, tty: bool = False
    ) -> None:
        self.api = api
        self.container_id = container_id
        self.stream = stream
        self.fifo = fifo
        self.position = position
        self.tty = tty
        self.bytes_copied = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"logs-{stream}-{container_id[:12]}")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _open_fifo(self) -> int | None:
        # Opening write-only blocks until the log collector reads; poll so stop() stays prompt.
        while not self._stop.is_set():
            try:
                return os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as err:
                if err.errno not in (errno.ENXIO, errno.ENOENT):
                    log.error("cannot open log fifo", extra={"fifo": self.fifo, "error": str(err)})
                    return None
                time.sleep(0.1)
        return None

    def _run(self) -> None:
        fd = self._open_fifo()
        if fd is None:
            return
        os.set_blocking(fd, True)
        lines: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        writer = threading.Thread(target=self._write, args=(fd, lines), daemon=True)
        writer.start()
        try:
            self._follow(lines)
        finally:
            lines.put(None)
            writer.join()
            os.close(fd)

    def _follow(self, lines: queue.Queue[tuple[str, bytes] | None]) -> None:
        last = self.position.read()
        while not self._stop.is_set():
            since = _parse_ts(last.encode()) if last else 0
            try:
                chunks = self.api.logs(
                    self.container_id,
                    stdout=self.stream == "stdout",
                    stderr=self.stream == "stderr",
                    stream=True,
                    follow=True,
                    timestamps=True,
                    since=since if since else None,
                )
                pending = b""
                for chunk in chunks:
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        last = self._queue_line(lines, line + b"\n", last)
                    if self._stop.is_set():
                        return
                if pending:
                    last = self._queue_line(lines, pending, last)
            except Exception as err:  # the engine went away or the container is gone
                log.debug("log stream ended", extra={"container": self.container_id, "error": str(err)})
            if not self._running():
                return
            self._stop.wait(0.5)

    def _queue_line(self, lines: queue.Queue[tuple[str, bytes] | None], line: bytes, last: str) -> str:
        ts, _, payload = line.partition(b" ")
        ts_text = ts.decode(errors="replace")
        # Resumed streams start at the last second we saw; skip what was already copied.
        if last and _key(ts_text) <= _key(last):
            return last
        lines.put((ts_text, payload))
        return ts_text

    def _write(self, fd: int, lines: queue.Queue[tuple[str, bytes] | None]) -> None:
        """Write everything queued so far as one batch, with one position update per batch."""
        finished = False
        while not finished:
            batch: list[tuple[str, bytes]] = []
            item = lines.get()
            while True:
                if item is None:
                    finished = True
                    break
                batch.append(item)
                try:
                    item = lines.get_nowait()
                except queue.Empty:
                    break
            if not batch:
                continue
            # Record before writing: whatever a reader has seen is then never sent again after a
            # restart. (A crash between the two steps loses that one batch instead.)
            self.position.write(batch[-1][0])
            data = b"".join(payload for _, payload in batch)
            try:
                _write_all(fd, data)
            except BrokenPipeError:
                pass
            self.bytes_copied += len(data)

    def _running(self) -> bool:
        try:
            state = self.api.inspect_container(self.container_id)["State"]
        except Exception:
            return False
        return bool(state.get("Running"))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _key(ts: str) -> tuple[str, str]:
    main, _, frac = ts.rstrip("Z").partition(".")
    return main, frac.ljust(9, "0")


class LogCollector:
    """Both streams of one container (a tty container has only stdout)."""

    def __init__(self, api: Any, container_id: str, stdout: str, stderr: str, state_dir: str, tty: bool) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.copiers = [
            StreamCopier(api, container_id, "stdout", stdout, PositionFile(os.path.join(state_dir, "stdout.pos")), tty)
        ]
        if not tty:
            self.copiers.append(
                StreamCopier(api, container_id, "stderr", stderr, PositionFile(os.path.join(state_dir, "stderr.pos")))
            )

    def start(self) -> None:
        for c in self.copiers:
            c.start()

    def stop(self) -> None:
        for c in self.copiers:
            c.stop()

    def drain(self, timeout: float) -> None:
        """Wait for the copiers to reach the end of an exited container's logs."""
        deadline = time.monotonic() + timeout
        for c in self.copiers:
            c.join(max(0.0, deadline - time.monotonic()))
