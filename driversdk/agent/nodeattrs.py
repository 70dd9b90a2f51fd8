"""This node's attributes, named as Nomad's client fingerprints them (``client/fingerprint/``):
``kernel.*``, ``os.*`` (with ``os.cgroups.version``), ``cpu.*``, ``memory.totalbytes``,
``unique.hostname``, ``unique.network.ip-address``, ``unique.storage.*`` (of the file system the
data dir is on, as Nomad's storage fingerprint reads its alloc dir's), ``nomad.version``, and
``driver.<name>`` / ``driver.<name>.*`` from each driver plugin's first fingerprint; with the
client config's node name, datacenter, region, class, pool and ``meta`` they make the
:class:`~driversdk.jobspec.taskenv.Node` that ``${attr.*}``, ``${node.*}`` and ``${meta.*}`` and
constraints are read against.

The host is fingerprinted once per process (:func:`host_attributes` is cached); driver
attributes are asked of the plugins a run already has.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from driversdk.errors import DriverSDKError
from driversdk.jobspec.clientconfig import ClientConfig
from driversdk.jobspec.taskenv import Node
from driversdk.model import Attribute, HealthState

if TYPE_CHECKING:
    from driversdk.agent.pluginmanager.inprocess import InProcessDriver
    from driversdk.client import DriverClient

# Go's names for machine architectures (runtime.GOARCH), which Nomad reports as cpu.arch.
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386", "i386": "386", "ppc64le": "ppc64le",
           "s390x": "s390x", "riscv64": "riscv64"}  # fmt: skip


def _version() -> str:
    """nomad.version: the runner's own version (the driversdk package's), as the agent reports its own."""
    from driversdk import __version__  # not importlib.metadata: ~25 ms of imports and a scan of sys.path

    return __version__


def _os_release() -> tuple[str, str]:
    """(os.name, os.version) as gopsutil reads them: ID and VERSION_ID of /etc/os-release."""
    fields: dict[str, str] = {}
    try:
        with open("/etc/os-release", encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.strip().partition("=")
                if sep:
                    fields[key] = value.strip().strip('"')
    except OSError:
        pass
    return fields.get("ID", platform.system().lower()), fields.get("VERSION_ID", "")


def _cpu() -> dict[str, str]:
    """cpu.numcores, cpu.modelname, cpu.frequency (MHz per core) and cpu.totalcompute (their product)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    model, mhz = "", 0.0
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "cpu MHz" and not mhz:
                    mhz = float(value.strip() or 0)
    except (OSError, ValueError):
        pass
    for path in ("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq",):
        try:
            with open(path) as fh:
                mhz = max(mhz, int(fh.read().strip()) / 1000)
        except (OSError, ValueError):
            pass
    out = {"cpu.numcores": str(cores), "cpu.reservablecores": str(cores)}
    if model:
        out["cpu.modelname"] = model
    if mhz:
        out["cpu.frequency"] = f"{mhz:.0f}"
        out["cpu.totalcompute"] = str(int(mhz) * cores)
        out["cpu.usablecompute"] = out["cpu.totalcompute"]
    return out


def _memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cgroups_version() -> str:
    """os.cgroups.version: "2" when /sys/fs/cgroup is the unified hierarchy, else "1" (v1 or
    hybrid), as Nomad's cgroup fingerprint tells them apart."""
    return "2" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "1"


def storage_attributes(data_dir: str) -> dict[str, str]:
    """unique.storage.volume (the file system's source, as df names it), .bytestotal and
    .bytesfree (what an unprivileged user may still write) of the data dir's file system; the
    nearest existing parent is read when the data dir is not made yet."""
    path = os.path.abspath(data_dir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        fs = os.statvfs(path)
    except OSError:
        return {}
    out = {
        "unique.storage.bytestotal": str(fs.f_blocks * fs.f_frsize),
        "unique.storage.bytesfree": str(fs.f_bavail * fs.f_frsize),
    }
    volume = _volume_of(path)
    if volume is not None:
        out["unique.storage.volume"] = volume
    return out


@functools.lru_cache(maxsize=64)
def _volume_of(path: str) -> str | None:
    """The source of the file system ``path`` is on, found once per path (as Nomad's storage
    fingerprint does once per client): it reads the whole mount table, which grows with every
    running task's mounts, and each allocation's node facts asked for it."""
    from driversdk.mountinfo import MountinfoError, find_mount

    try:
        return find_mount(path).source
    except (MountinfoError, OSError):
        return None


def host_ip() -> str:
    """The address of the interface the default route leaves by (Nomad's network fingerprint
    picks the default-route interface); 127.0.0.1 on a host without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, the kernel picks the route
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


@functools.cache
def host_attributes() -> Mapping[str, str]:
    """The host's fingerprint, computed once per process."""
    uname = os.uname()
    os_name, os_version = _os_release()
    attrs = {
        "kernel.name": uname.sysname.lower(),
        "kernel.version": uname.release,
        "kernel.arch": uname.machine,
        "os.name": os_name,
        "os.version": os_version,
        "os.cgroups.version": cgroups_version(),
        "cpu.arch": _GOARCH.get(uname.machine, uname.machine),
        "unique.hostname": socket.gethostname(),
        "unique.network.ip-address": host_ip(),
        "nomad.version": _version(),
    }
    attrs.update(_cpu())
    memory = _memory_bytes()
    if memory:
        attrs["memory.totalbytes"] = str(memory)
    return attrs


def _text(value: object) -> str:
    if isinstance(value, Attribute):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def driver_attributes(name: str, plugin: DriverClient | InProcessDriver) -> dict[str, str]:
    """``driver.<name>`` (true when the plugin says it is healthy) and its ``driver.<name>.*``
    attributes, from the plugin's first fingerprint; nothing when it cannot be fingerprinted."""
    try:
        stream = plugin.fingerprint()
        try:
            first = next(iter(stream))
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    except (DriverSDKError, StopIteration):
        return {}
    out = {k: _text(v) for k, v in first.attributes.items()}
    if first.health == HealthState.HEALTHY:
        out.setdefault(f"driver.{name}", "true")
    return out


def node(client: ClientConfig, drivers: Mapping[str, Mapping[str, str]] | None = None) -> Node:
    """The node as taskenv and constraints see it; ``drivers``: each driver's attributes
    (:func:`driver_attributes`)."""
    attrs = dict(host_attributes())
    attrs.update(storage_attributes(client.data_dir))  # free bytes read each time: they change
    for name in sorted(drivers or {}):
        attrs.update((drivers or {})[name])
    return Node(
        id=_node_id(client),
        name=client.name or attrs["unique.hostname"],
        datacenter=client.datacenter,
        region=client.region,
        pool=client.node_pool,
        node_class=client.node_class,
        attributes=attrs,
        meta=dict(client.meta),
    )


def _node_id(client: ClientConfig) -> str:
    """A stable id per host (Nomad derives it from the host's machine id unless told otherwise)."""
    import uuid

    try:
        with open("/etc/machine-id") as fh:
            machine = fh.read().strip()
    except OSError:
        machine = socket.gethostname()
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"driversdk-node:{machine}"))


def for_alloc(
    client: ClientConfig,
    drivers: Iterable[str],
    dispense: Callable[[str], DriverClient],
    known: dict[str, dict[str, str]],
) -> Node:
    """The node for an allocation whose tasks use ``drivers``: each driver fingerprinted once per
    run (``known``: the run's fingerprints, filled in here)."""
    for driver in sorted(set(drivers)):
        if driver not in known:
            known[driver] = driver_attributes(driver, dispense(driver))
    return node(client, known)
