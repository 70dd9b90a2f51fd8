"""Find, load or pull a task's image, and forget images nobody uses any more (gc.image)."""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from drivers.docker.config import PluginConfig, TaskDockerConfig
from drivers.docker.pulls import ProgressListener, PullCoordinator, PullStalled
from driversdk.errors import DriverError
from driversdk.model import TaskConfig

if TYPE_CHECKING:
    from drivers.docker import engine as sdk
else:
    from drivers.docker import sdk  # the docker SDK, loaded on first use

log = logging.getLogger("driversdk.docker.images")

# The largest image archive `load` may name. It bounds what one task can make the engine read
# and store; Nomad has no limit, real images stay far below it.
MAX_IMAGE_ARCHIVE_BYTES = 4 * 1024**3


def split_reference(image: str) -> tuple[str, str]:
    """(repository, tag); a missing tag means latest, a digest keeps the whole reference."""
    if "@" in image:
        return image, ""
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = image.rsplit(":", 1)
        return repo, tag
    return image, "latest"


# A task event: (message, annotations).
Emit = Callable[..., None]


def ensure_image(
    api: Any,
    task: TaskConfig,
    cfg: TaskDockerConfig,
    plugin: PluginConfig,
    pulls: PullCoordinator,
    make_client: Callable[[float], Any],
    emit: Emit,
) -> str:
    """The image id to run; like Nomad, a :latest, tag-less or force_pull image is always pulled."""
    repo, tag = split_reference(cfg.image)
    reference = f"{repo}:{tag}" if tag else repo
    if not cfg.force_pull and tag != "latest":
        try:
            return str(api.inspect_image(reference)["Id"])
        except (sdk.ImageNotFound, sdk.NotFound):
            pass
    if cfg.load:
        _load_archive(api, task, cfg.load)
        try:
            return str(api.inspect_image(reference)["Id"])
        except (sdk.ImageNotFound, sdk.NotFound):
            raise DriverError(
                f"task {task.name!r}: image archive {cfg.load!r} does not contain image {reference!r}"
            ) from None
    bare = repo.split("@", 1)[0]
    try:
        credentials = sdk.auth.resolve(bare, cfg.auth, plugin)
    except sdk.auth.AuthLookupError as err:
        if not cfg.auth_soft_fail:
            raise DriverError(f"task {task.name!r}: Failed to find docker auth for repo {bare!r}: {err}") from None
        log.warning("pulling without credentials (auth_soft_fail)", extra={"image": reference, "error": str(err)})
        emit(f"Failed to find docker auth for repo {bare!r}, pulling without credentials (auth_soft_fail): {err}")
        credentials = None
    timeout = cfg.image_pull_timeout or plugin.image_pull_timeout

    def report(summary: str, done: int, total: int) -> None:
        emit(
            f"Docker image pull progress: {summary}",
            image=reference,
            bytes_done=str(done),
            bytes_total=str(total),
        )

    emit("Downloading image", image=reference)
    pull_image(pulls, make_client, f"task {task.name!r}", repo, tag, reference, credentials, timeout, plugin, report)
    try:
        return str(api.inspect_image(reference)["Id"])
    except (sdk.ImageNotFound, sdk.NotFound):
        raise DriverError(
            f"task {task.name!r}: Failed to pull `{reference}`: the engine reported success but has no such image",
            recoverable=True,
        ) from None


def pull_image(
    pulls: PullCoordinator,
    make_client: Callable[[float], Any],
    where: str,
    repo: str,
    tag: str,
    reference: str,
    credentials: dict[str, str] | None,
    timeout: float,
    plugin: PluginConfig,
    report: ProgressListener | None = None,
    timeout_name: str = "image_pull_timeout",
) -> None:
    """Pull through the coordinator; failures as one sentence that starts with `where` (the task, or infra_image)."""
    try:
        pulls.pull(
            make_client, repo, tag, reference, credentials, timeout, plugin.pull_activity_timeout, report, timeout_name
        )
    except PullStalled as err:
        raise DriverError(f"{where}: Failed to pull `{reference}`: {err}", recoverable=True) from None
    except sdk.APIError as err:
        cause = err.explanation or str(err)
        # The engine's 404 (docker-py's NotFound/ImageNotFound) means no registry has the image:
        # retrying cannot help. Anything else (a registry down, an error mid-stream) may pass.
        not_found = isinstance(err, sdk.NotFound) or err.status_code == 404
        raise DriverError(
            f"{where}: Failed to pull `{reference}`: {cause}; the image is not present locally "
            "and the registry could not provide it (load it with `docker load` or set `load` in the task config)",
            recoverable=not not_found,
        ) from None


def _load_archive(api: Any, task: TaskConfig, load: str) -> None:
    """Stream the archive `load` names, from inside the task's local/ dir, into the engine."""
    fd = open_archive(task, load)
    try:
        with os.fdopen(fd, "rb") as fh:
            # A file object is sent in pieces; the archive is never held in memory whole.
            for event in api.load_image(fh, quiet=True) or ():
                if isinstance(event, dict) and event.get("error"):
                    raise sdk.APIError(str(event["error"]))
    except sdk.APIError as err:
        cause = getattr(err, "explanation", None) or str(err)
        raise DriverError(
            f"task {task.name!r}: loading image archive {load!r} (field `load`) failed: {cause}"
        ) from None
    except OSError as err:
        raise DriverError(
            f"task {task.name!r}: reading image archive {load!r} (field `load`) failed: {err.strerror or err}"
        ) from None


def open_archive(task: TaskConfig, load: str) -> int:
    """A read-only fd of the regular file `load` names under the task's local/ dir.

    Like Nomad, the name is joined to local/ (so "/image.tar" means local/image.tar). Unlike a
    plain join, nothing may lead out of it: ".." past local/ is refused and each component is
    opened relative to its parent without following symbolic links, so a link the task made
    (to /etc/shadow, say) is refused instead of read by this root-owned plugin.
    """
    where = f"task {task.name!r}: `load` = {load!r}"
    relative = os.path.normpath(load.lstrip("/") or ".")
    if relative.split("/")[0] == "..":
        raise DriverError(
            f"{where} leads out of the task's local/ dir; name an image archive inside local/ "
            "(for example one fetched there by an artifact block)"
        )
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts:
        raise DriverError(f"{where} names no file; set it to an image archive inside the task's local/ dir")
    try:
        fd = os.open(task.local_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise DriverError(f"{where}: cannot open the task's local/ dir: {err.strerror}") from None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                # lstat before open: opening a device or a fifo can itself have effects.
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise DriverError(
                    f"{where}: no such file in the task's local/ dir ({'/'.join(parts[: i + 1])!r} does not exist)"
                ) from None
            kind = _kind(st.st_mode)
            if kind == "symbolic link":
                raise DriverError(
                    f"{where}: {'/'.join(parts[: i + 1])!r} is a symbolic link; `load` reads only regular "
                    "files inside the task's local/ dir and never follows links"
                )
            if not last:
                if kind != "directory":
                    raise DriverError(f"{where}: {'/'.join(parts[: i + 1])!r} is a {kind}, not a directory")
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = child
                continue
            if kind != "regular file":
                raise DriverError(f"{where} is a {kind}; it must be a regular file (an image archive from docker save)")
            child = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
            # What was opened must be what was checked: the task may swap the name meanwhile.
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                raise DriverError(f"{where} changed while it was being opened; it must be a regular file")
            if opened.st_size > MAX_IMAGE_ARCHIVE_BYTES:
                raise DriverError(
                    f"{where} is {opened.st_size} bytes, over the {MAX_IMAGE_ARCHIVE_BYTES} byte limit "
                    "for image archives (MAX_IMAGE_ARCHIVE_BYTES)"
                )
            os.set_blocking(fd, True)
            return fd
    except DriverError:
        os.close(fd)
        raise
    except OSError as err:
        os.close(fd)
        detail = "it is or passes through a symbolic link" if err.errno == errno.ELOOP else err.strerror
        raise DriverError(f"{where}: cannot open the image archive: {detail}") from None
    raise AssertionError("unreachable")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


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
            except (sdk.APIError, sdk.NotFound) as err:
                log.debug("image not removed", extra={"image": name, "error": str(err)})
