"""Find, load or pull a task's image, and forget images nobody uses any more (gc.image)."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

from docker.errors import APIError, ImageNotFound, NotFound

from drivers.docker.config import PluginConfig, TaskDockerConfig
from driversdk.errors import DriverError
from driversdk.model import TaskConfig

log = logging.getLogger("driversdk.docker.images")


def split_reference(image: str) -> tuple[str, str]:
    """(repository, tag); a missing tag means latest, a digest keeps the whole reference."""
    if "@" in image:
        return image, ""
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = image.rsplit(":", 1)
        return repo, tag
    return image, "latest"


def ensure_image(api: Any, task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig) -> str:
    """The image id to run; like Nomad, a :latest or force_pull image is always pulled."""
    repo, tag = split_reference(cfg.image)
    reference = f"{repo}:{tag}" if tag else repo
    if not cfg.force_pull and tag != "latest":
        try:
            return str(api.inspect_image(reference)["Id"])
        except (ImageNotFound, NotFound):
            pass
    if cfg.load:
        archive = os.path.join(task.local_dir, cfg.load)
        try:
            with open(archive, "rb") as fh:
                for _ in api.load_image(fh.read(), quiet=True) or ():
                    pass
        except OSError as err:
            raise DriverError(f"task {task.name!r}: unable to open image archive: {err}") from None
        except APIError as err:
            raise DriverError(
                f"task {task.name!r}: loading image archive {cfg.load!r} failed: {err.explanation}"
            ) from None
        try:
            return str(api.inspect_image(reference)["Id"])
        except (ImageNotFound, NotFound):
            raise DriverError(
                f"task {task.name!r}: image archive {cfg.load!r} does not contain image {reference!r}"
            ) from None
    timeout = cfg.image_pull_timeout or plugin.image_pull_timeout
    try:
        _pull(api, repo, tag, cfg.auth, reference, timeout, plugin.pull_activity_timeout)
        return str(api.inspect_image(reference)["Id"])
    except PullStalled as err:
        raise DriverError(f"task {task.name!r}: Failed to pull `{reference}`: {err}", recoverable=True) from None
    except (APIError, NotFound) as err:
        cause = getattr(err, "explanation", None) or str(err)
        not_found = "not found" in cause or "does not exist" in cause
        raise DriverError(
            f"task {task.name!r}: Failed to pull `{reference}`: {cause}; the image is not present locally "
            "and the registry could not provide it (load it with `docker load` or set `load` in the task config)",
            recoverable=not not_found,
        ) from None


class PullStalled(Exception):
    pass


def _pull(
    api: Any, repo: str, tag: str, auth: dict[str, str] | None, reference: str, timeout: float, activity: float
) -> None:
    """Pull with both limits Nomad applies: the whole pull, and the time between progress events."""
    events: queue.Queue[dict[str, Any] | BaseException | None] = queue.Queue()

    def run() -> None:
        try:
            for event in api.pull(repo, tag=tag or None, stream=True, decode=True, auth_config=auth):
                events.put(event)
            events.put(None)
        except BaseException as err:
            events.put(err)

    # A stalled pull cannot be interrupted from here; the daemon thread ends with its connection.
    threading.Thread(target=run, daemon=True, name=f"pull-{reference}").start()
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PullStalled(f"the pull did not finish within image_pull_timeout ({timeout:.0f}s)")
        try:
            event = events.get(timeout=min(activity, remaining))
        except queue.Empty:
            if time.monotonic() >= deadline:
                continue
            raise PullStalled(f"the pull made no progress for pull_activity_timeout ({activity:.0f}s)") from None
        if event is None:
            return
        if isinstance(event, BaseException):
            raise event
        if "error" in event:
            raise APIError(str(event["error"]))


class ImageGC:
    """Reference counts of image ids by task; an unused image is removed after a delay.

    Removal untags the references our tasks used, without force: unlike a forced removal by
    id, it never deletes other tags of the same image an operator relies on.
    """

    def __init__(self) -> None:
        self._refs: dict[str, set[str]] = {}
        self._names: dict[str, set[str]] = {}
        self._timers: dict[str, threading.Timer] = {}
        self._lock = threading.Lock()

    def acquire(self, image_id: str, reference: str, owner: str) -> None:
        with self._lock:
            self._refs.setdefault(image_id, set()).add(owner)
            self._names.setdefault(image_id, set()).add(reference)
            timer = self._timers.pop(image_id, None)
        if timer is not None:
            timer.cancel()

    def release(self, api: Any, image_id: str, owner: str, delay: float) -> None:
        with self._lock:
            owners = self._refs.get(image_id)
            if owners is None:
                return
            owners.discard(owner)
            if owners:
                return
            del self._refs[image_id]
            timer = threading.Timer(delay, self._remove, args=(api, image_id))
            timer.daemon = True
            self._timers[image_id] = timer
        timer.start()

    def _remove(self, api: Any, image_id: str) -> None:
        with self._lock:
            self._timers.pop(image_id, None)
            if image_id in self._refs:
                return
            names = self._names.pop(image_id, set())
        for name in sorted(names):
            try:
                api.remove_image(name)
                log.info("removed unused image", extra={"image": name, "image_id": image_id})
            except (APIError, NotFound) as err:
                log.debug("image not removed", extra={"image": name, "error": str(err)})
