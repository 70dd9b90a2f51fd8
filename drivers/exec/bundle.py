"""The OCI bundle of one task: an (empty, read-only) root directory plus a config.json for runc.

Every mount is listed in config.json, so runc makes all of them inside the container's own
mount namespace: nothing is ever mounted on the host for a task, and nothing can be left
mounted under the bundle when the container is gone.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import resource
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivers.exec.config import PluginConfig, TaskExecConfig
from driversdk import procwatch
from driversdk.errors import ConfigError
from driversdk.model import Device, DNSConfig, NetworkIsolationMode, TaskConfig
from driversdk.mounts import Mount, Propagation
from driversdk.taskkit.ids import HostUser

OCI_VERSION = "1.0.2"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# runc's default masked and read-only paths: kernel knobs a task must not read or change.
MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
]  # fmt: skip
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


@dataclass(frozen=True)
class Bundle:
    """Where one task's bundle lives: ``<dir>/config.json`` and ``<dir>/rootfs``."""

    dir: str

    @property
    def rootfs(self) -> str:
        return os.path.join(self.dir, "rootfs")

    @property
    def config_path(self) -> str:
        return os.path.join(self.dir, "config.json")

    @property
    def resolv_conf(self) -> str:
        return os.path.join(self.dir, "resolv.conf")

    def write(self, spec: dict[str, Any], chroot_links: dict[str, str], *, resolv_conf: str | None = None) -> None:
        os.makedirs(self.rootfs, mode=0o755, exist_ok=True)
        if resolv_conf is not None:
            with open(self.resolv_conf, "w") as fh:
                fh.write(resolv_conf)
        # A chroot_env entry that is a symlink on the host (/bin -> usr/bin on merged-/usr
        # systems) is recreated as the same symlink rather than bound, so both names work.
        for path, target in chroot_links.items():
            link = os.path.join(self.rootfs, path.lstrip("/"))
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(target, link)
        tmp = self.config_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(spec, fh)
        os.replace(tmp, self.config_path)


def mount_destination(mount: Mount, *, task: str) -> str:
    """The task path a volume is mounted at, normalised; refuses what docker refuses.

    An empty or relative destination has no meaning inside the task, and "/" (also written as
    "/..", "//" or "/a/.."), would put the volume over the task's whole root.
    """
    dest = mount.task_path
    name = f"volume {mount.request_name!r}" if mount.request_name else "a volume"
    where = f"task {task!r}: {name} (host path {mount.host_path!r})"
    if not dest.startswith("/"):
        what = "is empty" if not dest else f"{dest!r} is not an absolute path"
        raise ConfigError(f"{where}: its destination {what}; give an absolute path inside the task such as /data")
    # normpath keeps a leading "//" (POSIX allows it a meaning); inside the task it is just "/".
    normalized = posixpath.normpath("/" + dest.lstrip("/"))
    if normalized == "/":
        raise ConfigError(
            f"{where}: its destination {dest!r} is the task's root directory; mount it at a path below /, such as /data"
        )
    return normalized


def check_mount_destinations(mounts: list[Mount], *, task: str) -> None:
    for mount in mounts:
        mount_destination(mount, task=task)


def _bind(source: str, destination: str, *options: str) -> dict[str, Any]:
    return {"destination": destination, "type": "bind", "source": source, "options": ["rbind", *options]}


def chroot_entries(chroot_env: tuple[str, ...]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Read-only binds for the chroot_env dirs that exist, and symlinks for those that are links."""
    mounts: list[dict[str, Any]] = []
    links: dict[str, str] = {}
    for path in sorted(set(chroot_env), key=lambda p: (p.count("/"), p)):
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.isdir(path):
            mounts.append(_bind(path, path, "ro", "nosuid", "nodev"))
    return mounts, links


def process_user(user: HostUser) -> dict[str, Any]:
    """The OCI process user for the task's host user (resolved by :func:`driversdk.taskkit.ids.lookup_user`)."""
    out: dict[str, Any] = {"uid": user.uid, "gid": user.gid}
    if user.groups:
        out["additionalGids"] = list(user.groups)
    return out


def process_capabilities(cfg: TaskExecConfig, user: HostUser) -> dict[str, list[str]]:
    """The task's capability sets. Root keeps its whole set across exec. Any other user loses
    every capability at exec unless it is ambient: only what the job's cap_add asked for (and
    allow_caps let through) is, so a nobody task in the host's pid namespace has no CAP_KILL
    over root's processes unless the job asked for it."""
    caps = [f"CAP_{c.upper()}" for c in cfg.capabilities]
    sets: dict[str, list[str]] = {"bounding": caps, "effective": caps, "permitted": caps}
    if user.uid != 0 and cfg.added_capabilities:
        ambient = [f"CAP_{c.upper()}" for c in cfg.added_capabilities]
        sets.update(inheritable=ambient, ambient=ambient)
    return sets


def device_entries(devices: list[Device], *, task: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """OCI linux.devices nodes and the cgroup rules allowing them, from the task's device list."""
    nodes: list[dict[str, Any]] = []
    rules: list[dict[str, Any]] = []
    for dev in devices:
        access = dev.cgroup_permissions or "rwm"
        if not access or set(access) - set("rwm"):
            raise ConfigError(
                f"task {task!r}: device {dev.host_path!r} has invalid cgroup permissions {access!r}; "
                "use a combination of r, w and m"
            )
        try:
            info = os.stat(dev.host_path)
        except OSError:
            raise ConfigError(f"task {task!r}: device {dev.host_path!r} does not exist on this host") from None
        if stat.S_ISCHR(info.st_mode):
            kind = "c"
        elif stat.S_ISBLK(info.st_mode):
            kind = "b"
        else:
            raise ConfigError(f"task {task!r}: {dev.host_path!r} is not a character or block device")
        major, minor = os.major(info.st_rdev), os.minor(info.st_rdev)
        nodes.append(
            {
                "path": dev.task_path or dev.host_path,
                "type": kind,
                "major": major,
                "minor": minor,
                "fileMode": stat.S_IMODE(info.st_mode),
                "uid": info.st_uid,
                "gid": info.st_gid,
            }
        )
        rules.append({"allow": True, "type": kind, "major": major, "minor": minor, "access": access})
    return nodes, rules


def resolv_conf(dns: DNSConfig | None) -> str | None:
    """The task's /etc/resolv.conf when the TaskConfig carries DNS settings, else None (host's)."""
    if dns is None or not (dns.servers or dns.searches or dns.options):
        return None
    lines = [f"nameserver {server}" for server in dns.servers]
    if dns.searches:
        lines.append("search " + " ".join(dns.searches))
    if dns.options:
        lines.append("options " + " ".join(dns.options))
    return "\n".join(lines) + "\n"


def _hostname(task: TaskConfig) -> str:
    spec = task.network_isolation_spec
    if spec is not None and spec.hosts is not None and spec.hosts.hostname:
        return spec.hosts.hostname
    name = re.sub(r"[^A-Za-z0-9-]", "-", task.name).strip("-")
    return (name or "task")[:63]


def root_propagation(task: TaskConfig) -> str:
    """How the container's root propagates; it decides whether rslave/rshared binds work.

    rshared binds only reach the host when the container's mounts stay in the host's peer
    groups, so any bidirectional mount needs a shared root; host-to-task needs at least slave.
    """
    modes = {m.propagation for m in task.mounts}
    if Propagation.BIDIRECTIONAL in modes:
        return "rshared"
    if Propagation.HOST_TO_TASK in modes:
        return "rslave"
    return "rprivate"


def _nofile_rlimit() -> dict[str, Any]:
    """The task's open-file limit: the one the plugin was started with, as Nomad's tasks get the
    agent's. Set explicitly because runc (a Go program) raises its own soft limit to the hard one
    and, in the versions Debian ships, hands that on to the container; and the plugin raises its
    own too (driversdk.procwatch: a pidfd per task it waits for)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    original = procwatch.original_nofile_soft()
    return {"type": "RLIMIT_NOFILE", "hard": hard, "soft": soft if original is None else original}


def build_spec(
    task: TaskConfig,
    cfg: TaskExecConfig,
    plugin: PluginConfig,
    user: HostUser,
    *,
    cgroups_path: str,
    bundle_dir: str = "",
) -> tuple[dict[str, Any], dict[str, str]]:
    """The runc config.json for the task, and the symlinks its root needs.

    With ``bundle_dir`` and DNS settings in the task, the bundle's resolv.conf (written by
    :meth:`Bundle.write`) is bound over /etc/resolv.conf.
    """
    chroot_mounts, links = chroot_entries(plugin.chroot_env)
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    if cfg.ipc_mode == "private":
        mqueue = {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"}
        mounts.append({**mqueue, "options": ["nosuid", "noexec", "nodev"]})
    mounts.extend(chroot_mounts)
    # The task dirs hold what the task, its templates and artifacts wrote: nothing there is a
    # device or raises privileges (a setuid-root file a template or an earlier task left).
    mounts.append(_bind(task.shared_alloc_dir, "/alloc", "rw", "nosuid", "nodev", "rprivate"))
    mounts.append(_bind(task.local_dir, "/local", "rw", "nosuid", "nodev", "rprivate"))
    mounts.append(_bind(task.secrets_dir, "/secrets", "rw", "nosuid", "nodev", "noexec", "rprivate"))
    task_tmp = os.path.join(task.task_dir, "tmp")
    if os.path.isdir(task_tmp):
        mounts.append(_bind(task_tmp, "/tmp", "rw", "nosuid", "nodev", "rprivate"))
    if bundle_dir and resolv_conf(task.dns) is not None:
        mounts.append(_bind(Bundle(bundle_dir).resolv_conf, "/etc/resolv.conf", "ro", "rprivate"))
    for m in task.mounts:
        # runc resolves the destination inside the container's root (symlinks the task planted in
        # its own dirs included) and creates missing directories there, never on the host: this
        # driver creates nothing host-side for a volume's destination.
        destination = mount_destination(m, task=task.name)
        mounts.append(_bind(m.host_path, destination, "ro" if m.readonly else "rw", m.propagation.linux))
    # runc mounts in list order: parents first, or a chroot_env dir below /tmp (a checkout in
    # /tmp, say) would be hidden by the task's /tmp mounted after it. The sort is stable, so
    # mounts at the same depth keep their order.
    mounts.sort(key=lambda m: len(Path(m["destination"]).parts))

    namespaces: list[dict[str, str]] = [{"type": "mount"}, {"type": "uts"}]
    if cfg.pid_mode == "private":
        namespaces.append({"type": "pid"})
    if cfg.ipc_mode == "private":
        namespaces.append({"type": "ipc"})
    net = task.network_isolation_spec
    if net is not None and net.mode == NetworkIsolationMode.GROUP and net.path:
        namespaces.append({"type": "network", "path": net.path})

    device_nodes, device_rules = device_entries(task.devices, task=task.name)
    env = dict(task.env)
    env.setdefault("PATH", DEFAULT_PATH)
    propagation = root_propagation(task)
    if plugin.no_pivot_root and propagation == "rprivate":
        # runc refuses a private root without pivot_root (the chroot could be escaped through
        # the host's mount tree); a slave root is the closest it accepts.
        propagation = "rslave"
    spec: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": process_user(user),
            "args": [cfg.command, *cfg.args],
            "env": [f"{k}={v}" for k, v in sorted(env.items())],
            "cwd": cfg.work_dir,
            "capabilities": process_capabilities(cfg, user),
            # Nomad's executor leaves this off because its chroot is a copy of the host's dirs
            # whose setuid helpers (su, ping) work. Here chroot_env and the task dirs are nosuid, so
            # an exec that raises privileges has no use; a volume's setuid file does not either.
            # Ambient capabilities survive it.
            "noNewPrivileges": True,
            "rlimits": [_nofile_rlimit()],
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": _hostname(task),
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": cgroups_path,
            "rootfsPropagation": propagation,
            "devices": device_nodes,
            "resources": {"devices": [{"allow": False, "access": "rwm"}, *device_rules]},
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
        },
    }
    return spec, links
