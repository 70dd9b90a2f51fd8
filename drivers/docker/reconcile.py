"""gc.dangling_containers: remove task containers that no live docker plugin owns.

Like Nomad's dangling-container reconciler (drivers/docker/reconcile_dangling.go), a background
thread looks, every ``period``, for running containers made for tasks that nobody tracks, e.g.
because the plugin was killed between creating a container and StartTask returning, so the
host never got a handle to stop or destroy it. Its first pass waits max(period, creation_grace),
which gives a relaunched plugin's host time to recover the tasks of the plugin before it.

Nomad can call a container "untracked" when its own driver does not track it: one Nomad agent
runs one docker plugin per engine. Here several plugins share one engine (one per
`driversdk run`, test processes, a Nomad agent), and none of them knows the others' tasks, so
"not in my task table" would remove a neighbour's live task. So ownership is recorded where
every plugin can check it:

- at creation, the container is labelled with the creating plugin's identity (boot id, pid and
  process start time, so a recycled pid never passes for the old owner) and with its task
  directory;
- the plugin that starts or recovers the task writes its identity to ``private/docker-owner``
  in that task directory; a label cannot change after creation, and a recovered task's owner
  is the plugin that recovered it.

A container is dangling only when all of these hold: it carries our task labels and an owner
record, it is not one of this plugin's tasks, it is older than creation_grace, neither owner
record names a live process, and it has been seen ownerless for creation_grace (so a plugin
that another host is relaunching gets that long to recover the task). A container with our
labels but no owner record is never touched: nothing tells whether it is free.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from functools import cache
from typing import Any

from drivers.docker.config import DanglingContainers
from drivers.docker.labels import LABEL_ALLOC_ID, LABEL_TASK_ID

log = logging.getLogger("driversdk.docker.reconcile")

LABEL_OWNER = "io.driversdk.owner"
LABEL_TASK_DIR = "io.driversdk.task_dir"
OWNER_FILE = os.path.join("private", "docker-owner")
# Nomad looks at running containers only; "created" ones are added because a plugin killed
# between create and start leaves exactly that. Exited containers wait for their task's
# DestroyTask (or gc.container) as in Nomad.
STATUSES = ("running", "created")


@cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return "unknown"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command name: field 3 (state) is fields[0], field 22 (starttime) fields[19].
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return fields[19]


def identity(pid: int | None = None) -> str:
    """``<boot id>:<pid>:<start time>`` of a process (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{_boot_id()}:{pid}:{_start_time(pid) or '?'}"


def alive(owner: str) -> bool:
    """Whether the process an identity names still runs (the same process, not a reused pid)."""
    boot, _, rest = owner.strip().partition(":")
    pid_text, _, started = rest.partition(":")
    if boot != _boot_id() or not pid_text.isdigit():
        return False
    return _start_time(int(pid_text)) == started


def owner_file(task_dir: str) -> str:
    return os.path.join(task_dir, OWNER_FILE)


def claim(task_dir: str, container_id: str) -> None:
    """Record this plugin as the owner of a task's container, in the task's private dir."""
    path = owner_file(task_dir)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as fh:
            fh.write(f"{identity()} {container_id}\n")
        os.replace(tmp, path)
    except OSError as err:
        # Not fatal: this plugin tracks the task anyway; only other plugins could mistake it.
        log.warning(
            "cannot record this plugin as the owner of a container; once its creator is gone, "
            "another plugin sharing the engine may remove it",
            extra={"container_id": container_id, "path": path, "error": str(err)},
        )


def _claimed_by(task_dir: str, container_id: str) -> str | None:
    try:
        fd = os.open(owner_file(task_dir), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as fh:
        owner, _, cid = fh.read(512).strip().partition(" ")
    # The task dir may have been reused by a later container of the same task.
    return owner if cid == container_id else None


def owned(labels: dict[str, str], container_id: str) -> bool | None:
    """True when a live process owns the container, False when none does, None when unknown."""
    creator = labels.get(LABEL_OWNER)
    if not creator:
        return None
    if alive(creator):
        return True
    task_dir = labels.get(LABEL_TASK_DIR)
    claimant = _claimed_by(task_dir, container_id) if task_dir else None
    return claimant is not None and alive(claimant)


class Reconciler:
    """The background loop; ``tracked`` returns the container ids of this plugin's tasks."""

    def __init__(self, config: DanglingContainers, api: Callable[[], Any], tracked: Callable[[], set[str]]) -> None:
        self.config = config
        self._api = api
        self._tracked = tracked
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Container id -> monotonic time this reconciler first saw it without a live owner.
        self._ownerless: dict[str, float] = {}

    def start(self) -> None:
        if not self.config.enabled:
            log.debug("skipping dangling containers handling; is disabled")
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="docker-reconcile")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        last_succeeded = True
        delay = max(self.config.period, self.config.creation_grace)
        while not self._stop.wait(delay):
            delay = self.config.period
            try:
                self.iterate()
            except Exception as err:  # an engine that is away is retried next period, quietly
                if last_succeeded:
                    log.warning("failed to remove dangling containers", extra={"error": str(err)})
                last_succeeded = False
            else:
                last_succeeded = True

    def dangling(self) -> list[dict[str, Any]]:
        """Containers to remove now (and updates when each was first seen ownerless)."""
        now, wall = time.monotonic(), time.time()
        tracked = self._tracked()
        listed = self._api().containers(all=True, filters={"label": [LABEL_OWNER]})
        seen: set[str] = set()
        out = []
        for c in listed:
            cid, labels = str(c["Id"]), c.get("Labels") or {}
            if c.get("State") not in STATUSES or cid in tracked:
                continue
            if not _ours(labels) or float(c.get("Created") or wall) > wall - self.config.creation_grace:
                continue
            if owned(labels, cid) is not False:
                continue
            seen.add(cid)
            since = self._ownerless.setdefault(cid, now)
            if now - since >= self.config.creation_grace:
                out.append(c)
        self._ownerless = {cid: t for cid, t in self._ownerless.items() if cid in seen}
        return out

    def iterate(self) -> None:
        found = self.dangling()
        if not found:
            return
        if self.config.dry_run:
            log.info("detected untracked containers", extra={"container_ids": ",".join(c["Id"] for c in found)})
            return
        api = self._api()
        for c in found:
            cid, labels = str(c["Id"]), c.get("Labels") or {}
            # Ask again right before removing: a host may have recovered it since the listing.
            if cid in self._tracked() or owned(labels, cid) is not False:
                continue
            fields = {
                "container_id": cid,
                "container_name": ",".join(n.lstrip("/") for n in c.get("Names") or ()),
                "task_id": labels.get(LABEL_TASK_ID, ""),
                "alloc_id": labels.get(LABEL_ALLOC_ID, ""),
            }
            try:
                api.remove_container(cid, force=True)
            except Exception as err:
                log.warning("failed to remove untracked container", extra={**fields, "error": str(err)})
                continue
            self._ownerless.pop(cid, None)
            log.info("removed untracked container", extra=fields)


def _ours(labels: dict[str, str]) -> bool:
    # Only containers made for tasks: both task labels, and the owner label we set at creation.
    return all(labels.get(k) for k in (LABEL_TASK_ID, LABEL_ALLOC_ID, LABEL_OWNER))
