"""Which pin dirs a docker plugin made, kept where a relaunched plugin finds them.

A pin (see ``container.pin_sources``) lives from the container's create until it has started.
A plugin killed in between (SIGKILL, the OOM killer) leaves the pin mounted in the alloc dir,
where nothing else unmounts it: the alloc dir could then never be removed. So each pin dir is
recorded, with the identity of the plugin process that made it, in a root-only dir; a plugin
that starts (SetConfig) releases the pins of recorded processes that no longer run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile

from drivers.docker import reconcile
from driversdk import pinning

log = logging.getLogger(__name__)

RECORD_DIR = "/run/driversdk/docker-pins"
# The prefix every pin dir's name starts with (container.pin_sources names them so): a record
# that names anything else is not ours to unmount.
PIN_DIR_PREFIX = ".driversdk-pins-"


def record(directory: str, records: str = RECORD_DIR) -> str | None:
    """Record ``directory`` as this process's; the record's path, or None when it cannot be
    written (warned: the pin still works, only a crash before its release would leave it)."""
    try:
        parent = os.path.dirname(records)
        os.makedirs(parent, 0o755, exist_ok=True)
        info = os.lstat(parent)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise pinning.PinError(f"{parent} is not a directory only uid {os.geteuid()} may write")
        pinning.private_dir(records)
        fd, path = tempfile.mkstemp(dir=records, prefix="pins-")
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{reconcile.identity()}\n{directory}\n")
        return path
    except (OSError, pinning.PinError) as err:
        log.warning("cannot record a pin dir for release after a crash", extra={"path": directory, "error": str(err)})
        return None


def forget(path: str | None) -> None:
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def release_stale(records: str = RECORD_DIR) -> list[str]:
    """Release the pin dirs of recorded plugin processes that no longer run; returns those dirs."""
    try:
        names = sorted(os.listdir(records))
    except FileNotFoundError:
        return []
    released = []
    for name in names:
        path = os.path.join(records, name)
        try:
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)) as fh:
                owner, directory = fh.read().split("\n")[:2]
        except (OSError, ValueError):
            continue  # being written, or not a record of ours
        if reconcile.alive(owner):
            continue
        if _release_dir(directory):
            released.append(directory)
            forget(path)
    return released


def _release_dir(directory: str) -> bool:
    """Unpin every entry of a dead plugin's pin dir and remove it; False when it must stay."""
    if not os.path.basename(directory).startswith(PIN_DIR_PREFIX):
        log.warning("a pin record names a dir that is not a pin dir; left alone", extra={"path": directory})
        return True  # the record is dropped: it could never be acted on
    try:
        pinning.private_dir(directory, create=False)
    except FileNotFoundError:
        return True  # removed with its alloc dir
    except pinning.PinError as err:
        log.warning("a recorded pin dir is no longer ours; left alone", extra={"path": directory, "error": str(err)})
        return True
    for entry in os.listdir(directory):
        try:
            pinning.unpin(os.path.join(directory, entry))
        except OSError as err:
            log.warning("cannot release a crashed plugin's pin", extra={"path": entry, "error": str(err)})
            return False
    pinning.remove_private_dir(directory)
    log.info("released the pins of a plugin that died mid-start", extra={"path": directory})
    return True
