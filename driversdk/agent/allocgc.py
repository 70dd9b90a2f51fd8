"""Garbage collection of terminal allocations, as Nomad's client does it.

Nomad's client keeps a terminal allocation (its directory, logs and state) until it collects it:
periodically (``gc_interval``), and when new allocations arrive, it destroys the allocations
that have been over the longest, one at a time, while the disk holding the alloc dirs is fuller
than ``gc_disk_usage_threshold`` percent, its inodes fuller than ``gc_inode_usage_threshold``
percent, or the node knows more than ``gc_max_allocs`` allocations (making room for the ones
about to start); ``nomad system gc`` collects every terminal allocation at once. A collected
allocation is deleted from the client's state.

Here the allocations are those of earlier ``driversdk run`` processes in the data dir. Removing an
alloc dir must not reach outside it, whatever its tasks left there: nothing is followed through a
symlink (a link is removed as a link) and no mount point is crossed. An alloc dir with anything
still mounted below it is not collected at all and is reported, as is one whose CSI volume claims
are not released yet (the volume watcher still needs the allocation).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from driversdk.errors import DriverSDKError
from driversdk.mountinfo import mount_points
from driversdk.paths import check_name
from driversdk.plugin.host import pid_alive

if TYPE_CHECKING:
    from driversdk.agent.state.runstate import AllocRecord, RunState
    from driversdk.jobspec.clientconfig import ClientConfig

# Nomad's client defaults (command/agent/config.go: GCInterval, GCDiskUsageThreshold,
# GCInodeUsageThreshold, GCMaxAllocs).
DEFAULT_GC_INTERVAL = 60.0
DEFAULT_GC_DISK_USAGE_THRESHOLD = 80.0
DEFAULT_GC_INODE_USAGE_THRESHOLD = 70.0
DEFAULT_GC_MAX_ALLOCS = 50

# One collection at a time: the periodic one and a purged job's would otherwise walk the same
# alloc dirs side by side, each finding the other's half-removed trees.
_ONE_COLLECTION = threading.Lock()

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_Level = tuple[int, list[str], str, str]


@dataclass(frozen=True)
class GCPolicy:
    max_allocs: int = DEFAULT_GC_MAX_ALLOCS
    disk_usage_threshold: float = DEFAULT_GC_DISK_USAGE_THRESHOLD
    inode_usage_threshold: float = DEFAULT_GC_INODE_USAGE_THRESHOLD
    interval: float = DEFAULT_GC_INTERVAL

    @classmethod
    def of(cls, client: ClientConfig) -> GCPolicy:
        return cls(
            max_allocs=client.gc_max_allocs,
            disk_usage_threshold=client.gc_disk_usage_threshold,
            inode_usage_threshold=client.gc_inode_usage_threshold,
            interval=client.gc_interval,
        )


@dataclass
class GCReport:
    """What one collection did: the allocations collected (id, job, why) and those it had to keep
    (id, one sentence saying why and what to do)."""

    collected: list[tuple[str, str, str]] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f'garbage collected allocation {a[:8]} of job "{job}" ({why})' for a, job, why in self.collected]
        return out + [why for _, why in self.kept]


@dataclass(frozen=True)
class Usage:
    """The alloc dirs' filesystem, as Nomad's host stats measure it (percent used)."""

    disk_percent: float
    inode_percent: float

    @classmethod
    def of(cls, path: str) -> Usage:
        st = os.statvfs(path)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        free = st.f_bavail * st.f_frsize
        disk = 100.0 * used / (used + free) if used + free else 0.0
        inodes = 100.0 * (st.f_files - st.f_ffree) / st.f_files if st.f_files else 0.0
        return cls(disk, inodes)


class _Refused(DriverSDKError):
    """An alloc dir this collection must not remove (raised and caught inside this module only)."""


def collect(
    data_dir: str, state: RunState, policy: GCPolicy, *, room_for: int = 0, everything: bool = False
) -> GCReport:
    """Collect terminal allocations of ``data_dir``: every one (``everything``, ``system gc``), or
    the oldest first while a threshold is exceeded or more than ``policy.max_allocs`` allocations
    would be known once ``room_for`` new ones start."""
    report = GCReport()
    allocs_dir = os.path.join(data_dir, "allocs")
    with _ONE_COLLECTION:
        queue = [a for a in state.terminal_allocs() if not _still_owned(a)]
        mounted = _mount_points()
        for alloc in queue:
            if everything:
                reason = "forced collection"
            else:
                reason = _reason(allocs_dir, state, policy, room_for)
                if not reason:
                    break
            kept = _destroy(allocs_dir, alloc, state, mounted)
            if kept:
                report.kept.append((alloc.alloc_id, kept))
            else:
                report.collected.append((alloc.alloc_id, alloc.job, reason))
    return report


def collect_job(data_dir: str, state: RunState, job: str) -> GCReport:
    """Collect every terminal allocation of one job now: a purged job's, as Nomad's garbage
    collection removes a purged job's allocations (a new job of the same name starts clean)."""
    report = GCReport()
    allocs_dir = os.path.join(data_dir, "allocs")
    with _ONE_COLLECTION:
        mounted = _mount_points()
        for alloc in state.terminal_allocs():
            if alloc.job != job or _still_owned(alloc):
                continue
            kept = _destroy(allocs_dir, alloc, state, mounted)
            if kept:
                report.kept.append((alloc.alloc_id, kept))
            else:
                report.collected.append((alloc.alloc_id, alloc.job, "job purged"))
    return report


def _mount_points() -> frozenset[str]:
    """The node's mount points, read once a collection: read again for each of 1000 allocation
    dirs, mountinfo was most of a big job's purge. A mount made after the read is still never
    crossed: the removal checks each directory's mount as it descends."""
    return mount_points()


def _still_owned(alloc: AllocRecord) -> bool:
    """A live run other than this process recorded it: that run may still be closing it."""
    return alloc.run_pid != os.getpid() and pid_alive(alloc.run_pid)


def _reason(allocs_dir: str, state: RunState, policy: GCPolicy, room_for: int) -> str:
    """Why a further allocation must be collected, as Nomad's client says it; "" when none."""
    try:
        usage = Usage.of(allocs_dir if os.path.isdir(allocs_dir) else os.path.dirname(allocs_dir))
    except OSError:
        usage = Usage(0.0, 0.0)
    if usage.disk_percent > policy.disk_usage_threshold:
        return f"disk usage of {usage.disk_percent:.0f} is over gc threshold of {policy.disk_usage_threshold:.0f}"
    if usage.inode_percent > policy.inode_usage_threshold:
        return f"inode usage of {usage.inode_percent:.0f} is over gc threshold of {policy.inode_usage_threshold:.0f}"
    known = state.alloc_count()
    if known > policy.max_allocs - room_for:
        if room_for:
            return f"{room_for} new allocation(s) and {known} known, over the limit ({policy.max_allocs})"
        return f"number of allocations ({known}) is over the limit ({policy.max_allocs})"
    return ""


def _destroy(allocs_dir: str, alloc: AllocRecord, state: RunState, mounted_now: frozenset[str]) -> str:
    """Remove the allocation's dir and forget it; "" when done, else why it was kept."""
    name = f'allocation {alloc.alloc_id[:8]} of job "{alloc.job}"'
    if check_name(alloc.alloc_id, "alloc id") is not None:
        return f"{name} was not garbage collected: its recorded id is not a safe directory name"
    if state.csi_use_left(alloc.alloc_id):
        return (
            f"{name} was not garbage collected: its CSI volume claims are not released yet; see `driversdk volume "
            "status` (released by the volume watcher, or `driversdk volume detach`)"
        )
    path = os.path.join(allocs_dir, alloc.alloc_id)
    real = os.path.join(os.path.realpath(allocs_dir), alloc.alloc_id)
    mounted = sorted(p for p in mounted_now if p == real or p.startswith(real + "/"))
    if mounted:
        return (
            f"{name} was not garbage collected: {', '.join(mounted)} is still mounted in its alloc dir; unmount it "
            "(umount) and run `driversdk system gc`"
        )
    try:
        _remove_at(allocs_dir, alloc.alloc_id)
    except _Refused as err:
        return f"{name} was not garbage collected: {err}; unmount it (umount) and run `driversdk system gc`"
    except OSError as err:
        return f"{name} was not garbage collected: removing {err.filename or path} failed: {err.strerror or err}"
    state.alloc_collected(alloc.alloc_id)
    return ""


def _mount_id(fd: int) -> int:
    """The id of the mount an open file is on (``mnt_id`` in /proc/self/fdinfo), which tells a
    bind mount of the same filesystem apart where st_dev cannot."""
    with open(f"/proc/self/fdinfo/{fd}") as info:
        for line in info:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise OSError(errno.ENOTSUP, "the kernel does not say which mount an open file is on")


def _remove_at(parent: str, name: str) -> None:
    """Remove ``parent``/``name`` and everything below it through directory descriptors: a
    symlink is unlinked (never followed), a directory on another mount is refused (never
    crossed). A missing entry is already gone."""
    try:
        parent_fd = os.open(parent, _OPEN_DIR)
    except FileNotFoundError:
        return
    # Each level: (its fd, the entries left to remove, its name in the level above, its path for
    # messages). A deep tree costs descriptors, not Python recursion.
    stack: list[_Level] = []
    try:
        home = _mount_id(parent_fd)
        _descend(parent_fd, name, home, parent, stack)
        while stack:
            fd, entries, own, path = stack[-1]
            if entries:
                _descend(fd, entries.pop(), home, path, stack)
                continue
            stack.pop()
            os.close(fd)
            os.rmdir(own, dir_fd=stack[-1][0] if stack else parent_fd)
    finally:
        for fd, *_ in stack:
            os.close(fd)
        os.close(parent_fd)


def _descend(dir_fd: int, name: str, home: int, where: str, stack: list[_Level]) -> None:
    """Remove ``name`` under ``dir_fd`` if it is not a directory; else open it (checked to be on
    the ``home`` mount) and push it with its entries. One that does not exist is gone already."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link or a file meanwhile
            os.unlink(name, dir_fd=dir_fd)
            return
        raise
    try:
        if _mount_id(fd) != home:
            raise _Refused(f"{where}/{name} is a mount point in its alloc dir")
        entries = os.listdir(fd)
    except BaseException:
        os.close(fd)
        raise
    stack.append((fd, entries, name, f"{where}/{name}"))


class PeriodicGC:
    """What ``driversdk run`` does: collect at start (making room for the allocations it is about
    to start), then every ``gc_interval`` while it runs, saying each collection in one line."""

    def __init__(self, data_dir: str, state: RunState, policy: GCPolicy, say: Callable[[str], None]) -> None:
        self._data_dir = data_dir
        self._state = state
        self._policy = policy
        self._say = say
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="alloc-gc", daemon=True)

    def start(self, room_for: int) -> PeriodicGC:
        self._once(room_for)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the periodic collection (before the run closes its own allocations)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._policy.interval):
            self._once(0)

    def _once(self, room_for: int) -> None:
        try:
            report = collect(self._data_dir, self._state, self._policy, room_for=room_for)
        except (DriverSDKError, OSError) as err:
            self._say(f"garbage collection of terminal allocations failed: {err}")
            return
        for line in report.lines():
            self._say(line)
