"""Per-task cgroups: limits, OOM detection, usage, removal; cgroup v1 (incl. hybrid) and v2.

The driver owns a parent cgroup per task (``<root>/driversdk-exec/<container id>``) carrying the
limits, and hands runc a child of it (``.../task``). runc deletes its child when the container
exits, but the parent stays until DestroyTask, so the OOM counter and the last usage figures can
still be read after the task is gone.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from driversdk.errors import DriverError
from driversdk.model import Resources
from driversdk.mountinfo import read_mountinfo

CGROUP_PARENT = "driversdk-exec"
RUNC_CHILD = "task"
MIB = 1024 * 1024


@functools.cache
def cgroup_mounts() -> dict[str, str]:
    """Controller name -> mount point of its hierarchy; key "" is the unified (v2) hierarchy."""
    mounts: dict[str, str] = {}
    for entry in read_mountinfo():
        if entry.fs_type == "cgroup2":
            mounts.setdefault("", entry.mount_point)
        elif entry.fs_type == "cgroup":
            for opt in entry.super_options:
                if opt in ("rw", "ro") or opt.startswith("release_agent") or opt == "clone_children":
                    continue
                mounts.setdefault(opt, entry.mount_point)
    return mounts


def unified_only() -> bool:
    """True on a pure cgroup v2 host (the unified hierarchy mounted at /sys/fs/cgroup)."""
    return os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _read(path: str) -> str:
    return _read_bytes(path).decode()


def _read_bytes(path: str) -> bytes:
    # os.open/os.read rather than open(): a stats stream reads several of these files a second
    # for every running task, and a text file object costs several times the read itself.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_int(path: str, read: Callable[[str], bytes] = _read_bytes) -> int:
    try:
        text = read(path).strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def _keyed(path: str, read: Callable[[str], bytes] = _read_bytes) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        data = read(path)
    except OSError:
        return out
    for line in data.split(b"\n"):
        key, _, value = line.partition(b" ")
        if value and value.lstrip(b"-").isdigit() and b" " not in value:
            out[key.decode()] = int(value)
    return out


def _pick(data: bytes, keys: tuple[bytes, ...]) -> list[int]:
    """The values of ``keys`` (each ``b"\\n<name> "``) in a flat-keyed cgroup file; 0 when absent.

    A stats sample needs three of v1 memory.stat's ~50 lines: finding them with bytes.find (C)
    instead of splitting and converting every line cuts the sample's Python work by more than half.
    """
    data = b"\n" + data  # the first line has a newline before it like the others
    values = []
    for key in keys:
        at = data.find(key)
        if at < 0:
            values.append(0)
            continue
        start = at + len(key)
        end = data.find(b"\n", start)
        try:
            values.append(int(data[start:] if end < 0 else data[start:end]))
        except ValueError:  # "max" and the like: no number to report
            values.append(0)
    return values


def _pick_from(path: str, keys: tuple[bytes, ...], read: Callable[[str], bytes]) -> list[int]:
    try:
        data = read(path)
    except OSError:
        return [0] * len(keys)
    return _pick(data, keys)


# The lines of the flat-keyed files a stats sample reads, in the order CgroupSample wants them.
V1_MEMORY_STAT = (b"\ntotal_rss ", b"\ntotal_cache ", b"\ntotal_swap ")
V1_CPU_STAT = (b"\nnr_throttled ", b"\nthrottled_time ")
V2_MEMORY_STAT = (b"\nanon ", b"\nfile ")
V2_CPU_STAT = (b"\nuser_usec ", b"\nsystem_usec ", b"\nusage_usec ", b"\nnr_throttled ", b"\nthrottled_usec ")


class CounterFiles:
    """A task's cgroup counter files, kept open between samples.

    A stats stream samples every running task once a second, and opening a cgroup file (a path
    walk through cgroupfs, then the close) costs more than reading it: with the files held open a
    sample is a pread(2) of each, from offset 0, which makes the kernel render the file afresh.
    A file that cannot be kept open (no descriptor left) is opened for that read only. Safe to
    share between threads; after :meth:`close` every read opens its file again.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def read(self, path: str) -> bytes:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None and not self._closed:
                try:
                    fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as err:
                    if err.errno not in (errno.EMFILE, errno.ENFILE):
                        raise
            if fd is not None:
                # Under the lock: close() must not free the number while a read still uses it.
                return os.pread(fd, 65536, 0)
        return _read_bytes(path)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def memory_limit_bytes(resources: Resources) -> int:
    """The hard memory limit Nomad asks for: memory_max when set, otherwise memory; 0 = none.
    memory_max = -1 is no hard limit (Nomad's executor then leaves memory.max at "max" and keeps
    memory as the soft limit), whatever the client put in the Linux limit."""
    if resources.memory_max_mb < 0:
        return 0
    if resources.linux.memory_limit_bytes > 0:
        return resources.linux.memory_limit_bytes
    return max(resources.memory_max_mb, resources.memory_mb) * MIB


def cpu_shares(resources: Resources) -> int:
    shares = resources.linux.cpu_shares or resources.cpu_shares
    return max(shares, 2) if shares else 0


@dataclass(frozen=True)
class CgroupSample:
    """One reading of a task cgroup's counters (cumulative; the caller computes rates)."""

    cpu_user_ns: int
    cpu_system_ns: int
    cpu_total_ns: int
    throttled_periods: int
    throttled_ns: int
    memory_usage: int
    memory_max_usage: int
    memory_rss: int
    memory_cache: int
    memory_swap: int
    at: float


@dataclass(frozen=True)
class TaskCgroup:
    """The parent cgroup of one task, named after its container id."""

    container_id: str
    v2: bool
    parent: str = CGROUP_PARENT
    """The cgroup (relative to each hierarchy's root) under which task cgroups are made."""

    @classmethod
    def for_container(cls, container_id: str, parent: str = CGROUP_PARENT) -> TaskCgroup:
        return cls(container_id, unified_only(), parent)

    @property
    def relative(self) -> str:
        return f"{self.parent}/{self.container_id}"

    @property
    def runc_path(self) -> str:
        """The cgroupsPath for runc's config.json: a child of ours, which runc creates and deletes."""
        return f"/{self.relative}/{RUNC_CHILD}"

    def _dir(self, controller: str) -> str | None:
        mounts = cgroup_mounts()
        base = mounts.get("" if self.v2 else controller)
        return os.path.join(base, self.relative) if base else None

    def create(self, resources: Resources) -> None:
        """Create the parent cgroup with the task's memory and CPU limits."""
        limit = memory_limit_bytes(resources)
        soft = resources.memory_mb * MIB if resources.memory_mb > 0 else 0
        shares = cpu_shares(resources)
        quota, period = resources.linux.cpu_quota, resources.linux.cpu_period
        try:
            if self.v2:
                self._create_v2(limit, soft, shares, quota, period)
            else:
                self._create_v1(limit, soft, shares, quota, period)
        except OSError as err:
            with contextlib.suppress(DriverError):
                self.remove()
            raise DriverError(
                f"failed to create cgroup {self.relative!r} with the task's limits: {err.strerror or err}; "
                "check that the cgroup hierarchies are mounted read-write and the plugin runs as root",
                recoverable=True,
            ) from None

    def _create_v1(self, limit: int, soft: int, shares: int, quota: int, period: int) -> None:
        for controller in ("memory", "cpu", "cpuacct"):
            path = self._dir(controller)
            if path:
                os.makedirs(path, exist_ok=True)
        mem = self._dir("memory")
        if mem and limit:
            _write(f"{mem}/memory.limit_in_bytes", str(limit))
            # Without a swap limit the task would swap instead of being OOM-killed at its limit.
            if os.path.exists(f"{mem}/memory.memsw.limit_in_bytes"):
                _write(f"{mem}/memory.memsw.limit_in_bytes", str(limit))
            if soft and soft < limit:
                _write(f"{mem}/memory.soft_limit_in_bytes", str(soft))
        elif mem and soft:  # no hard limit (memory_max = -1): memory stays the soft one
            _write(f"{mem}/memory.soft_limit_in_bytes", str(soft))
        cpu = self._dir("cpu")
        if cpu and shares:
            _write(f"{cpu}/cpu.shares", str(shares))
        if cpu and quota > 0 and period > 0:
            _write(f"{cpu}/cpu.cfs_period_us", str(period))
            _write(f"{cpu}/cpu.cfs_quota_us", str(quota))

    def _create_v2(self, limit: int, soft: int, shares: int, quota: int, period: int) -> None:
        root = cgroup_mounts().get("", "/sys/fs/cgroup")
        parent = os.path.join(root, self.parent)
        os.makedirs(parent, exist_ok=True)
        for path in (root, parent):
            with contextlib.suppress(OSError):
                _write(f"{path}/cgroup.subtree_control", "+memory +cpu")
        path = os.path.join(root, self.relative)
        os.makedirs(path, exist_ok=True)
        with contextlib.suppress(OSError):
            _write(f"{path}/cgroup.subtree_control", "+memory +cpu")
        if limit:
            _write(f"{path}/memory.max", str(limit))
            with contextlib.suppress(OSError):
                _write(f"{path}/memory.swap.max", "0")
            if soft and soft < limit:
                _write(f"{path}/memory.low", str(soft))
        elif soft:  # no hard limit (memory_max = -1): memory.max stays "max", memory the soft one
            _write(f"{path}/memory.low", str(soft))
        if shares:
            _write(f"{path}/cpu.weight", str(1 + ((shares - 2) * 9999) // 262142))
        if quota > 0 and period > 0:
            _write(f"{path}/cpu.max", f"{quota} {period}")

    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process of the task at its memory limit."""
        if self.v2:
            path = self._dir("")
            return bool(path) and _keyed(f"{path}/memory.events").get("oom_kill", 0) > 0
        parent = self._dir("memory")
        if not parent:
            return False
        # v1 counts a kill only in the victim's own cgroup (runc's child), not in its parents.
        for path in (parent, os.path.join(parent, RUNC_CHILD)):
            control = _keyed(f"{path}/memory.oom_control")
            if control.get("oom_kill", 0) > 0:
                return True
        if "oom_kill" in _keyed(f"{parent}/memory.oom_control"):
            return False
        # Kernels before 4.13 lack the counter; hitting the limit is the best sign left.
        return _read_int(f"{parent}/memory.failcnt") > 0 and _read_int(f"{parent}/memory.memsw.failcnt") > 0

    @functools.cached_property
    def _counter_dirs(self) -> tuple[str, str, str]:
        """(memory, cpuacct, cpu) directories for v1, the unified one thrice for v2: joined once,
        not on every sample (the mounts and the name never change)."""
        if self.v2:
            path = self._dir("") or ""
            return path, path, path
        return self._dir("memory") or "", self._dir("cpuacct") or "", self._dir("cpu") or ""

    def sample(self, files: CounterFiles | None = None) -> CgroupSample:
        """The counters now; ``files`` keeps them open between samples (a stats stream's)."""
        read = files.read if files is not None else _read_bytes
        mem_dir, acct, cpu_dir = self._counter_dirs
        if self.v2:
            user, system, total, periods, throttled = _pick_from(f"{cpu_dir}/cpu.stat", V2_CPU_STAT, read)
            anon, file = _pick_from(f"{mem_dir}/memory.stat", V2_MEMORY_STAT, read)
            usage = _read_int(f"{mem_dir}/memory.current", read)
            return CgroupSample(
                cpu_user_ns=user * 1000,
                cpu_system_ns=system * 1000,
                cpu_total_ns=total * 1000,
                throttled_periods=periods,
                throttled_ns=throttled * 1000,
                memory_usage=usage,
                memory_max_usage=_read_int(f"{mem_dir}/memory.peak", read) or usage,
                memory_rss=anon,
                memory_cache=file,
                memory_swap=_read_int(f"{mem_dir}/memory.swap.current", read),
                at=time.monotonic(),
            )
        rss, cache, swap = _pick_from(f"{mem_dir}/memory.stat", V1_MEMORY_STAT, read)
        periods, throttled = _pick_from(f"{cpu_dir}/cpu.stat", V1_CPU_STAT, read)
        return CgroupSample(
            cpu_user_ns=_read_int(f"{acct}/cpuacct.usage_user", read),
            cpu_system_ns=_read_int(f"{acct}/cpuacct.usage_sys", read),
            cpu_total_ns=_read_int(f"{acct}/cpuacct.usage", read),
            throttled_periods=periods,
            throttled_ns=throttled,
            memory_usage=_read_int(f"{mem_dir}/memory.usage_in_bytes", read),
            memory_max_usage=_read_int(f"{mem_dir}/memory.max_usage_in_bytes", read),
            memory_rss=rss,
            memory_cache=cache,
            memory_swap=swap,
            at=time.monotonic(),
        )

    def existing(self) -> list[str]:
        """Every directory of this task's cgroup still present, in any hierarchy."""
        found = []
        for base in set(cgroup_mounts().values()):
            path = os.path.join(base, self.relative)
            if os.path.isdir(path):
                found.append(path)
        return sorted(found)

    def kill_all(self) -> list[int]:
        """SIGKILL every process left in the task's cgroups (all hierarchies, children included).

        For a task whose StartTask never finished there is no container state to trust: runc's
        init may be half-way through creating it. The cgroup is the one complete list.
        """
        killed: set[int] = set()
        for base in self.existing():
            for dirpath, _dirs, _files in os.walk(base):
                with contextlib.suppress(OSError):
                    for pid in _read(f"{dirpath}/cgroup.procs").split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                            killed.add(int(pid))
        return sorted(killed)

    def remove(self, timeout: float = 5.0) -> None:
        """Remove the task's cgroups in every hierarchy (runc creates its child in all of them)."""
        deadline = time.monotonic() + timeout
        for path in self.existing():
            _rmdir_tree(path, deadline, self.relative)


def _rmdir_tree(path: str, deadline: float, what: str) -> None:
    children = []
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            children.append(entry.path)
    for child in children:
        _rmdir_tree(child, deadline, what)
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as err:
            # EBUSY while the last task processes are still being reaped by the kernel.
            if err.errno != errno.EBUSY or time.monotonic() > deadline:
                procs: Any = ""
                with contextlib.suppress(OSError):
                    procs = _read(f"{path}/cgroup.procs").split()
                raise DriverError(
                    f"failed to remove cgroup {path!r} of {what!r}: {err.strerror}"
                    + (f" (processes still inside: {', '.join(procs)})" if procs else "")
                    + "; kill those processes and remove the directory",
                ) from None
            time.sleep(0.05)
