"""Copy a container's stdout and stderr into the task's log fifos, without loss, resumably.

A task started by this plugin is attached to before it starts: its output reaches the fifo as
the raw bytes it wrote (no 16 KiB splitting, no timestamps), and because the engine blocks a
container whose attached reader falls behind, a task that floods its output is slowed down
instead of losing lines in the engine's bounded (rotated) log. The byte offset copied is kept in
a position file.

After a plugin restart the container is no longer attached; the new copier follows the engine's
log (with timestamps) from the recorded position, joins the engine's 16 KiB partial messages back
into the lines the task wrote, and records engine timestamps from then on. Only what the engine
rotated away before it was read is lost on that path, as with Nomad's docker_logger.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import select
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from driversdk.logfifo import NotAFifoError, open_fifo_for_writing

log = logging.getLogger("driversdk.docker.logs")

# The engine stores (and returns) a line longer than this as several partial messages.
PARTIAL_SIZE = 16 * 1024
# Output stamped by the engine this long after our last recorded write was not copied by us;
# bounds the overlap guess when the engine no longer holds what came before the position.
RESUME_GRACE = 1.0
# Chunks the reader may queue ahead of the fifo writer: beyond it, back-pressure reaches the task.
QUEUE_CHUNKS = 64


def _parse_ts(text: str) -> float:
    # 2026-11-22T12:00:00.123456789Z: datetime takes microseconds; keep nanoseconds apart.
    main, _, frac = text.rstrip("Z").partition(".")
    base = datetime.fromisoformat(main + "+00:00").timestamp()
    return base + (int(frac.ljust(9, "0")[:9]) / 1e9 if frac else 0.0)


def _key(ts: str) -> tuple[str, str]:
    main, _, frac = ts.rstrip("Z").partition(".")
    return main, frac.ljust(9, "0")


@dataclass(frozen=True)
class Position:
    """Where a stream's copy stands: a byte offset (attached) or an engine timestamp (followed)."""

    container: str = ""
    offset: int | None = None
    at: float = 0.0
    ts: str = ""


class PositionFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> Position:
        try:
            with open(self.path) as fh:
                text = fh.read().strip()
        except FileNotFoundError:
            return Position()
        if not text.startswith("{"):
            return Position(ts=text)  # the layout before positions named their container
        try:
            raw = json.loads(text)
            return Position(
                container=str(raw.get("container", "")),
                offset=int(raw["offset"]) if raw.get("offset") is not None else None,
                at=float(raw.get("at", 0.0)),
                ts=str(raw.get("ts", "")),
            )
        except (ValueError, TypeError):
            return Position()

    def write(self, position: Position) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(asdict(position), fh)
        os.replace(tmp, self.path)


def attach(api: Any, container_id: str, stream: str) -> Any:
    """An attach connection to one stream of a created container (made before it starts)."""
    params = {"stdout": int(stream == "stdout"), "stderr": int(stream == "stderr"), "stream": 1, "logs": 0}
    sock = api.attach_socket(container_id, params=params)
    api._disable_socket_timeout(sock)  # a quiet task must not time the connection out
    return sock


def _recv(sock: Any, size: int) -> bytes:
    if hasattr(sock, "recv"):
        return bytes(sock.recv(size))
    return bytes(sock.read(size) or b"")


class _Demux:
    """Strips the engine's 8-byte stream headers from an attach (non-tty) byte stream."""

    def __init__(self) -> None:
        self._header = b""
        self._left = 0

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        i = 0
        while i < len(data):
            if self._left == 0:
                need = 8 - len(self._header)
                self._header += data[i : i + need]
                i += need
                if len(self._header) == 8:
                    self._left = int.from_bytes(self._header[4:8], "big")
                    self._header = b""
                continue
            take = data[i : i + self._left]
            out += take
            self._left -= len(take)
            i += len(take)
        return bytes(out)


def _messages(chunks: Iterable[bytes], tty: bool) -> Iterator[tuple[str, bytes, bool]]:
    """(timestamp, payload, partial) per engine log message of a `logs(timestamps=True)` stream.

    Without a tty each chunk is one message. With a tty the stream is raw: a message ends at a
    newline, or after PARTIAL_SIZE payload bytes, where the engine cut a long line.
    """
    if not tty:
        for chunk in chunks:
            ts, _, payload = chunk.partition(b" ")
            yield ts.decode(errors="replace"), payload, not payload.endswith(b"\n")
        return
    buf = b""
    for chunk in chunks:
        buf += chunk
        while True:
            space = buf.find(b" ")
            if space < 0:
                break
            end = buf.find(b"\n", space + 1, space + 1 + PARTIAL_SIZE)
            if end >= 0:
                yield buf[:space].decode(errors="replace"), buf[space + 1 : end + 1], False
                buf = buf[end + 1 :]
            elif len(buf) - space - 1 >= PARTIAL_SIZE:
                yield buf[:space].decode(errors="replace"), buf[space + 1 : space + 1 + PARTIAL_SIZE], True
                buf = buf[space + 1 + PARTIAL_SIZE :]
            else:
                break
    if buf:
        ts, _, payload = buf.partition(b" ")
        yield ts.decode(errors="replace"), payload, True


_Item = tuple[Position, bytes]


class StreamCopier:
    """Copies one stream (stdout or stderr) of a container into one fifo."""

    def __init__(
        self,
        api: Any,
        container_id: str,
        stream: str,
        fifo: str,
        position: PositionFile,
        tty: bool = False,
        sock: Any = None,
    ) -> None:
        self.api = api
        self.container_id = container_id
        self.stream = stream
        self.fifo = fifo
        self.position = position
        self.tty = tty
        self.bytes_copied = 0
        self._sock = sock
        self._attached_to_end = False
        self._attached_offset: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"logs-{stream}-{container_id[:12]}")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._close_socket()
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        raw = getattr(sock, "_sock", sock)
        try:
            raw.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        try:
            sock.close()
        except OSError:
            pass

    def _open_fifo(self) -> int | None:
        # Opening write-only blocks until the log collector reads; poll so stop() stays prompt.
        while not self._stop.is_set():
            try:
                return open_fifo_for_writing(self.fifo, task=f"container {self.container_id[:12]}", what=self.stream)
            except NotAFifoError as err:
                log.error("refusing the log fifo", extra={"fifo": self.fifo, "error": str(err)})
                return None
            except OSError as err:
                if err.errno not in (errno.ENXIO, errno.ENOENT):
                    log.error("cannot open log fifo", extra={"fifo": self.fifo, "error": str(err)})
                    return None
                time.sleep(0.1)
        return None

    def _run(self) -> None:
        fd = self._open_fifo()
        if fd is None:
            self._close_socket()
            return
        # Bounded: a fifo nobody drains stops the reader, and so the attached task.
        items: queue.Queue[_Item | None] = queue.Queue(maxsize=QUEUE_CHUNKS)
        writer = threading.Thread(target=self._write, args=(fd, items), daemon=True)
        writer.start()
        try:
            if self._sock is not None:
                self._copy_attached(items)
                self._close_socket()
            # Not attached (a recovered task), or the attachment ended while the container still
            # runs (the engine restarted): follow the engine's log from the recorded position.
            if not self._stop.is_set() and not self._attached_to_end:
                self._follow(items)
        finally:
            self._put(items, None, force=True)
            writer.join()
            os.close(fd)

    def _put(self, items: queue.Queue[_Item | None], item: _Item | None, force: bool = False) -> bool:
        while True:
            try:
                items.put(item, timeout=0.2)
                return True
            except queue.Full:
                if self._stop.is_set() and not force:
                    return False
                if self._stop.is_set():
                    # The writer is stuck on a fifo nobody reads; it gives up on stop too.
                    try:
                        items.get_nowait()
                    except queue.Empty:
                        pass

    def _copy_attached(self, items: queue.Queue[_Item | None]) -> None:
        demux = None if self.tty else _Demux()
        offset = 0
        sock = self._sock
        while not self._stop.is_set():
            try:
                data = _recv(sock, 65536)
            except OSError as err:
                log.debug("attach stream ended", extra={"container": self.container_id, "error": str(err)})
                break
            if not data:
                break
            payload = demux.feed(data) if demux is not None else data
            if payload:
                offset += len(payload)
                if not self._put(items, (Position(self.container_id, offset=offset), payload)):
                    return
        self._attached_offset = offset
        self._attached_to_end = not self._running()

    def _follow(self, items: queue.Queue[_Item | None]) -> None:
        pos = self.position.read()
        if self._attached_offset is not None:
            # The attachment ended early: continue after what it queued, not what was recorded.
            pos = Position(self.container_id, offset=self._attached_offset, at=time.time())
        if pos.container and pos.container != self.container_id:
            pos = Position()  # a previous container of this task: nothing of this one was copied
        last = pos.ts
        skip_to = pos.offset or 0
        guard = pos.at + RESUME_GRACE
        consumed = 0
        while not self._stop.is_set():
            running = self._running()
            since = _parse_ts(last) if last else 0
            parts: list[bytes] = []
            try:
                chunks = self.api.logs(
                    self.container_id,
                    stdout=self.stream == "stdout",
                    stderr=self.stream == "stderr",
                    stream=True,
                    # A stopped container's log is read to its end; a follow request could end
                    # at the end of a rotated file instead.
                    follow=running,
                    timestamps=True,
                    since=since if since else None,
                )
                for ts, payload, partial in _messages(chunks, self.tty):
                    if self._stop.is_set():
                        return
                    # A resumed request starts at the last second we saw; skip what was copied.
                    if last and _key(ts) <= _key(last):
                        continue
                    parts.append(payload)
                    if partial:
                        continue
                    line, parts = b"".join(parts), []
                    if consumed < skip_to:
                        if _parse_ts(ts) > guard:
                            skip_to = consumed  # the engine no longer holds what came before
                        else:
                            take = min(len(line), skip_to - consumed)
                            consumed += take
                            line = line[take:]
                    last = ts
                    if line and not self._put(items, (Position(self.container_id, ts=ts), line)):
                        return
            except Exception as err:  # the engine went away or the container is gone
                log.debug("log stream ended", extra={"container": self.container_id, "error": str(err)})
                running = True  # ask again: whether it still runs is unknown
            if not running:
                if parts:  # the task's last line had no newline
                    self._put(items, (Position(self.container_id, ts=last), b"".join(parts)))
                return
            self._stop.wait(0.5)

    def _write(self, fd: int, items: queue.Queue[_Item | None]) -> None:
        """Write everything queued so far as one batch, with one position update per batch."""
        finished = False
        while not finished:
            batch: list[_Item] = []
            item = items.get()
            while True:
                if item is None:
                    finished = True
                    break
                batch.append(item)
                try:
                    item = items.get_nowait()
                except queue.Empty:
                    break
            if not batch:
                continue
            # Record before writing: whatever a reader has seen is then never sent again after a
            # restart. (A crash between the two steps loses that one batch instead.)
            last = batch[-1][0]
            self.position.write(Position(last.container, last.offset, time.time(), last.ts))
            data = b"".join(payload for _, payload in batch)
            if not self._write_all(fd, data):
                finished = True
            self.bytes_copied += len(data)
        # Let a reader blocked on a full queue finish.
        while True:
            try:
                items.get_nowait()
            except queue.Empty:
                break

    def _write_all(self, fd: int, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                if self._stop.is_set():
                    return False
                select.select([], [fd], [], 0.2)
                continue
            except BrokenPipeError:
                return True
            view = view[written:]
        return True

    def _running(self) -> bool:
        try:
            state = self.api.inspect_container(self.container_id)["State"]
        except Exception:
            return False
        return bool(state.get("Running"))


class LogCollector:
    """Both streams of one container (a tty container has only stdout).

    With ``attach`` (a container created but not started yet) both streams are attached now, so
    the copy starts at the task's first byte; the caller starts the container afterwards.
    """

    def __init__(
        self,
        api: Any,
        container_id: str,
        stdout: str,
        stderr: str,
        state_dir: str,
        tty: bool,
        attach_now: bool = False,
    ) -> None:
        os.makedirs(state_dir, exist_ok=True)
        streams = [("stdout", stdout)] if tty else [("stdout", stdout), ("stderr", stderr)]
        socks: list[Any] = []
        try:
            for name, _ in streams:
                socks.append(attach(api, container_id, name) if attach_now else None)
        except BaseException:
            for s in socks:
                if s is not None:
                    s.close()
            raise
        self.copiers = [
            StreamCopier(api, container_id, name, fifo, PositionFile(os.path.join(state_dir, f"{name}.pos")), tty, sock)
            for (name, fifo), sock in zip(streams, socks, strict=True)
        ]

    def start(self) -> None:
        for c in self.copiers:
            c.start()

    def stop(self) -> None:
        for c in self.copiers:
            c.stop()

    def drain(self, timeout: float) -> None:
        """Wait for the copiers to reach the end of an exited container's output.

        ``timeout`` bounds a stall, not the copy: a copier that still makes progress is waited
        for, so a task that wrote a lot just before it exited loses nothing; one that copied
        nothing for ``timeout`` seconds (a fifo nobody reads) is given up on.
        """
        copied, since = -1, time.monotonic()
        while any(c.is_alive() for c in self.copiers):
            total = sum(c.bytes_copied for c in self.copiers)
            if total != copied:
                copied, since = total, time.monotonic()
            elif time.monotonic() - since >= timeout:
                return
            for c in self.copiers:
                c.join(0.1)
