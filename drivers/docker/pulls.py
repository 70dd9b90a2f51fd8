"""Image pulls: one in-flight pull per image however many tasks wait for it, its progress reported
to every waiting task, and Nomad's two limits (the whole pull, and the time between progress).

Like Nomad's coordinator (drivers/docker/coordinator.go), the first task to ask pulls; later
tasks asking for the same reference wait for that pull and share its outcome and its progress.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from driversdk.errors import DriverError

if TYPE_CHECKING:
    from drivers.docker import engine as sdk
else:
    from drivers.docker import sdk  # the docker SDK, loaded on first use

log = logging.getLogger("driversdk.docker.pulls")

# How often a running pull reports its progress as a task event (Nomad logs it every 10 s).
PULL_PROGRESS_INTERVAL = 10.0
# For tests only: a shorter interval in seconds, so a test sees several reports of a short pull.
PROGRESS_INTERVAL_ENV = "DRIVERSDK_DOCKER_PULL_PROGRESS_INTERVAL"

# (summary sentence, bytes done, bytes total) of a running pull.
ProgressListener = Callable[[str, int, int], None]


class PullStalled(DriverError):
    """A pull that passed image_pull_timeout or stopped making progress; retrying may help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, recoverable=True)


def progress_interval() -> float:
    raw = os.environ.get(PROGRESS_INTERVAL_ENV, "")
    try:
        value = float(raw) if raw else PULL_PROGRESS_INTERVAL
    except ValueError:
        return PULL_PROGRESS_INTERVAL
    return value if value > 0 else PULL_PROGRESS_INTERVAL


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass
class Progress:
    """The layers of one pull, from the engine's JSON progress messages."""

    layers: dict[str, list[Any]] = field(default_factory=dict)  # id -> [status, done, total]

    def update(self, event: dict[str, Any]) -> bool:
        """Account one message; True when it was progress (anything the engine sent about a layer)."""
        layer = event.get("id")
        status = str(event.get("status") or "")
        if not layer or status.startswith(("Pulling from", "Digest:", "Status:")):
            return bool(status)
        entry = self.layers.setdefault(str(layer), ["", 0, 0])
        entry[0] = status
        detail = event.get("progressDetail") or {}
        if status == "Downloading" and detail.get("total"):
            entry[1], entry[2] = int(detail.get("current") or 0), int(detail["total"])
        elif status in ("Download complete", "Extracting", "Pull complete", "Verifying Checksum") and entry[2]:
            entry[1] = entry[2]
        return True

    def summary(self) -> tuple[str, int, int]:
        done = sum(e[1] for e in self.layers.values())
        total = sum(e[2] for e in self.layers.values())
        complete = sum(1 for e in self.layers.values() if e[0] in ("Pull complete", "Already exists"))
        waiting = sum(1 for e in self.layers.values() if e[0] in ("Waiting", "Pulling fs layer"))
        pulling = len(self.layers) - complete - waiting
        text = (
            f"Pulled {complete}/{len(self.layers)} ({_size(done)}/{_size(total)}) layers: "
            f"{waiting} waiting/{pulling} pulling"
        )
        return text, done, total


@dataclass
class _Pull:
    listeners: list[ProgressListener] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class PullCoordinator:
    """One pull per image reference at a time; every caller gets its outcome and progress."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[str, _Pull] = {}

    def inflight(self) -> list[str]:
        with self._lock:
            return sorted(self._inflight)

    def pull(
        self,
        make_client: Callable[[float], Any],
        repo: str,
        tag: str,
        reference: str,
        auth: dict[str, str] | None,
        timeout: float,
        activity: float,
        on_progress: ProgressListener | None = None,
        timeout_name: str = "image_pull_timeout",
    ) -> bool:
        """Pull `reference`; False when this caller joined a pull another caller started."""
        with self._lock:
            pull = self._inflight.get(reference)
            leader = pull is None
            if pull is None:
                pull = self._inflight[reference] = _Pull()
            if on_progress is not None:
                pull.listeners.append(on_progress)
        if not leader:
            pull.done.wait()
            if pull.error is not None:
                raise pull.error
            return False
        try:
            _pull(make_client, repo, tag, reference, auth, (timeout, timeout_name), activity, pull)
        except BaseException as err:
            pull.error = err
            raise
        finally:
            with self._lock:
                self._inflight.pop(reference, None)
            pull.done.set()
        return True


def _socket_of(response: Any) -> socket.socket | None:
    """The connection under a streamed engine response, to cut it when a pull is abandoned."""
    try:
        raw = response.raw._fp.fp.raw
    except AttributeError:
        return None
    sock = getattr(raw, "_sock", raw)
    return sock if isinstance(sock, socket.socket) else None


def _pull(
    make_client: Callable[[float], Any],
    repo: str,
    tag: str,
    reference: str,
    auth: dict[str, str] | None,
    limit: tuple[float, str],
    activity: float,
    pull: _Pull,
) -> None:
    timeout, timeout_name = limit

    events: queue.Queue[dict[str, Any] | BaseException | None] = queue.Queue()
    # Its own connection, so an abandoned pull can be cut without touching the driver's client;
    # the engine cancels a pull whose client went away.
    client = make_client(activity + 30)
    held: dict[str, Any] = {}

    def run() -> None:
        try:
            headers = {"X-Registry-Auth": sdk.encode_header(auth)} if auth else {}
            params = {"fromImage": repo, "tag": tag} if tag else {"fromImage": repo}
            response = client._post(client._url("/images/create"), params=params, headers=headers, stream=True)
            held["response"] = response
            client._raise_for_status(response)
            for event in client._stream_helper(response, decode=True):
                events.put(event)
            events.put(None)
        except BaseException as err:
            events.put(err)

    threading.Thread(target=run, daemon=True, name=f"pull-{reference}").start()
    progress = Progress()
    start = time.monotonic()
    deadline = start + timeout
    last_activity = start
    every = progress_interval()
    next_report = start + every
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise PullStalled(f"the pull did not finish within {timeout_name} ({timeout:g}s)")
            if now - last_activity >= activity:
                raise PullStalled(f"the pull made no progress for pull_activity_timeout ({activity:g}s)")
            if now >= next_report:
                next_report = now + every
                summary, done, total = progress.summary()
                log.info("image pull progress", extra={"image": reference, "progress": summary})
                for listener in list(pull.listeners):
                    listener(summary, done, total)
            wait = max(0.01, min(deadline, last_activity + activity, next_report) - now)
            try:
                event = events.get(timeout=wait)
            except queue.Empty:
                continue
            if event is None:
                return
            if isinstance(event, BaseException):
                raise event
            if "error" in event:
                raise sdk.APIError(str(event["error"]))
            if progress.update(event):
                last_activity = time.monotonic()
    finally:
        response = held.get("response")
        sock = _socket_of(response) if response is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        client.close()
