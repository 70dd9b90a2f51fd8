"""Find, load or pull a task's image, and forget images nobody uses any more (gc.image)."""

from __future__ import annotations

import logging
import os
import threading
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
    try:
        for event in api.pull(repo, tag=tag or None, stream=True, decode=True, auth_config=cfg.auth):
            if "error" in event:
                raise APIError(event["error"])
        return str(api.inspect_image(reference)["Id"])
    except (APIError, NotFound) as err:
        cause = getattr(err, "explanation", None) or str(err)
        not_found = "not found" in cause or "does not exist" in cause
        raise DriverError(
            f"task {task.name!r}: Failed to pull `{reference}`: {cause}; the image is not present locally "
            "and the registry could not provide it (load it with `docker load` or set `load` in the task config)",
            recoverable=not not_found,
        ) from None


class ImageGC:
    """Reference counts of image ids by task; an unused image is removed after a delay."""

    def __init__(self) -> None:
        self._refs: dict[str, set[str]] = {}
        self._timers: dict[str, threading.Timer] = {}
        self._lock = threading.Lock()

    def acquire(self, image_id: str, owner: str) -> None:
        with self._lock:
            self._refs.setdefault(image_id, set()).add(owner)
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
        try:
            api.remove_image(image_id, force=True)
            log.info("removed unused image", extra={"image_id": image_id})
        except (APIError, NotFound) as err:
            log.debug("image not removed", extra={"image_id": image_id, "error": str(err)})
