"""Turn a TaskConfig plus the docker task config into the engine's container-create request.

Everything a task asks for that the operator has not allowed is refused here, with a sentence,
before the engine is asked to create anything.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Any

from docker.types import DriverConfig, LogConfig, Ulimit
from docker.types import Mount as DockerMount

from drivers.docker import pinrecord
from drivers.docker.config import DOCKER_DEFAULT_CAPS, MODE_KINDS, PluginConfig, TaskDockerConfig
from drivers.docker.labels import LABEL_ALLOC_ID, LABEL_TASK_ID
from drivers.docker.pinrecord import PIN_DIR_PREFIX
from driversdk import pinning
from driversdk.errors import ConfigError, DriverError
from driversdk.model import NetworkIsolationMode, TaskConfig
from driversdk.mountinfo import find_mount
from driversdk.paths import show

log = logging.getLogger("driversdk.docker")

EXTRA_LABEL_FIELDS = (
    "job_name",
    "job_id",
    "task_group_name",
    "task_name",
    "namespace",
    "node_name",
    "node_id",
)


@dataclass(frozen=True)
class TaskSource:
    """A bind source inside the alloc dir: tasks write there, so between our check and the
    engine's start it could become a symlink to anywhere on the host. It is pinned (see
    :func:`pin_sources`) and the engine gets the pinned path."""

    where: str
    """How the operator names the bind: 'docker volume "data:/data"', 'mount[0]'."""
    relative: str
    """The source relative to the alloc dir."""
    in_binds: bool
    """In host_config["binds"] (a "src:dst[:mode]" string) or host_config["mounts"]."""
    index: int
    suffix: str = ""
    """The ":dst[:mode]" rest of a bind string."""
    create: bool = False
    """A missing source dir is made (as the engine does for ``volumes``), never through a symlink."""
    propagation: str = ""


@dataclass
class ContainerSpec:
    name: str
    image: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    host_config: dict[str, Any] = field(default_factory=dict)
    # Endpoint settings (aliases, static addresses) for the network the container joins.
    endpoint: dict[str, Any] = field(default_factory=dict)
    # How often creation is retried after a name conflict (container_exists_attempts).
    create_attempts: int = 5
    # Bind sources a task can change, to pin before the container is created.
    task_sources: list[TaskSource] = field(default_factory=list)


# Propagation modes the engine only grants a source on a shared (or, for slave, slave) mount.
_SHARED_PROPAGATIONS = frozenset({"shared", "rshared", "slave", "rslave"})

# A seccomp profile is a few KiB of JSON (Docker's default is ~20 KiB); this bounds what the
# root plugin reads from a path a job names.
SECCOMP_PROFILE_MAX = 1 << 20


def container_name(task: TaskConfig) -> str:
    return f"{task.name.replace('/', '_')}-{task.alloc_id}"


def _in_alloc_dir(path: str, task: TaskConfig) -> str | None:
    """``path`` relative to the alloc dir when it names something inside it, taken as written
    (a symlink on the way is no way out: the pin refuses it); None outside."""
    for root in (task.alloc_dir, os.path.realpath(task.alloc_dir)):
        rel = pinning.relative_beneath(root, path)
        if rel is not None:
            return rel
    return None


def _labels(task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig) -> dict[str, str]:
    labels = dict(cfg.labels)
    labels[LABEL_ALLOC_ID] = task.alloc_id
    labels[LABEL_TASK_ID] = task.id
    values = {
        "job_name": task.job_name,
        "job_id": task.job_id,
        "task_group_name": task.task_group_name,
        "task_name": task.name,
        "namespace": task.namespace,
        "node_name": task.node_name,
        "node_id": task.node_id,
    }
    for name in EXTRA_LABEL_FIELDS:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in plugin.extra_labels):
            labels[f"com.hashicorp.nomad.{name}"] = values[name]
    return labels


def _binds(task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig, sources: list[TaskSource]) -> list[str]:
    label = f":{plugin.selinux_label}" if plugin.selinux_label else ""
    ro_label = f":ro,{plugin.selinux_label}" if plugin.selinux_label else ":ro"
    binds = [
        f"{task.shared_alloc_dir}:/alloc{label}",
        f"{task.local_dir}:/local{label}",
        f"{task.secrets_dir}:/secrets{label}",
    ]
    # alloc/logs lies in alloc/, which every task of the group writes: pinned like a task's own bind.
    logs = os.path.join(task.shared_alloc_dir, "logs")
    logs_rel = _in_alloc_dir(logs, task)
    if logs_rel is not None:
        sources.append(TaskSource("the /alloc/logs bind", logs_rel, True, len(binds), f":/alloc/logs{ro_label}"))
    binds.append(f"{logs}:/alloc/logs{ro_label}")
    for spec in cfg.volumes:
        parts = spec.split(":")
        if len(parts) < 2:
            raise ConfigError(f"task {task.name!r}: invalid docker volume {spec!r}: not <src>:<destination> format")
        src = parts[0]
        if cfg.volume_driver:
            if not plugin.volumes_enabled:
                raise ConfigError(
                    f"task {task.name!r}: volumes are not enabled; cannot use volume driver {cfg.volume_driver!r} "
                    "(set volumes { enabled = true } in the docker plugin config)"
                )
            # A named volume of that driver: the name is only cleaned, never made a host path.
            src = os.path.normpath(src)
        elif not os.path.isabs(src):
            src = os.path.normpath(os.path.join(task.task_dir, src))
        inside = None if cfg.volume_driver else _in_alloc_dir(src, task)
        if not cfg.volume_driver and not plugin.volumes_enabled and inside is None:
            raise ConfigError(
                f"task {task.name!r}: volumes are not enabled; cannot mount host path: {spec!r} "
                "(set volumes { enabled = true } in the docker plugin config, or mount from inside the alloc dir)"
            )
        mode = parts[2] if len(parts) > 2 else ""
        if plugin.selinux_label:
            mode = f"{mode},{plugin.selinux_label}" if mode else plugin.selinux_label
        suffix = f":{parts[1]}" + (f":{mode}" if mode else "")
        if inside is not None:
            propagation = next((m for m in mode.split(",") if m in _SHARED_PROPAGATIONS), "")
            sources.append(
                TaskSource(f"docker volume {spec!r}", inside, True, len(binds), suffix, create=True,
                           propagation=propagation)
            )  # fmt: skip
        binds.append(f"{src}{suffix}")
    return binds


def _mounts(
    task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig, sources: list[TaskSource]
) -> list[DockerMount]:
    out: list[DockerMount] = []
    for i, m in enumerate(cfg.mounts):
        if m.type == "bind":
            src = m.source if os.path.isabs(m.source) else os.path.normpath(os.path.join(task.task_dir, m.source))
            inside = _in_alloc_dir(src, task)
            if not plugin.volumes_enabled and inside is None:
                raise ConfigError(
                    f"task {task.name!r}: mount[{i}]: volumes are not enabled; cannot mount host path: {src!r} "
                    "(set volumes { enabled = true } in the docker plugin config)"
                )
            if inside is not None:
                # The engine refuses a missing source of a bind mount; so do we, never making one.
                sources.append(TaskSource(f"mount[{i}]", inside, False, len(out), propagation=m.propagation or ""))
            out.append(DockerMount(m.target, src, type="bind", read_only=m.readonly, propagation=m.propagation or None))
        elif m.type == "volume":
            if not plugin.volumes_enabled:
                raise ConfigError(
                    f"task {task.name!r}: mount[{i}]: volumes are not enabled; cannot mount volume: {m.source!r} "
                    "(set volumes { enabled = true } in the docker plugin config)"
                )
            out.append(
                DockerMount(
                    m.target,
                    m.source or None,
                    type="volume",
                    read_only=m.readonly,
                    no_copy=m.no_copy,
                    labels=m.volume_labels,
                    driver_config=(DriverConfig(m.volume_driver, m.volume_driver_options) if m.volume_driver else None),
                )
            )
        else:
            out.append(DockerMount(m.target, None, type="tmpfs", tmpfs_size=m.tmpfs_size, tmpfs_mode=m.tmpfs_mode))
    # Nomad's own mounts (host and CSI volumes): no volumes.enabled gate, propagation mapped
    # private -> rprivate, host-to-task -> rslave, bidirectional -> rshared.
    for mount in task.mounts:
        out.append(
            DockerMount(
                mount.task_path,
                mount.host_path,
                type="bind",
                read_only=mount.readonly,
                propagation=mount.propagation.linux,
            )
        )
    return out


def _capabilities(task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig) -> tuple[list[str], list[str]]:
    allowed = set(plugin.allow_caps)
    if "all" not in allowed:
        refused = sorted(c for c in cfg.cap_add if c not in allowed)
        if refused:
            raise ConfigError(
                f"task {task.name!r}: driver does not allow the following capabilities: {', '.join(refused)} "
                "(add them to allow_caps in the docker plugin config)"
            )
    cap_add = ["ALL"] if "all" in cfg.cap_add else [c.upper() for c in cfg.cap_add]
    if "all" in cfg.cap_drop:
        cap_drop = ["ALL"]
    else:
        dropped = set(cfg.cap_drop)
        if "all" not in allowed:
            dropped |= {c for c in DOCKER_DEFAULT_CAPS if c not in allowed}
        dropped -= set(cfg.cap_add)
        cap_drop = sorted(c.upper() for c in dropped)
    return cap_add, cap_drop


def _resources(task: TaskConfig, cfg: TaskDockerConfig) -> dict[str, Any]:
    res = task.resources
    mib = 1024 * 1024
    host: dict[str, Any] = {"cpu_shares": max(2, res.cpu_shares or 0)}
    if res.memory_max_mb == -1:
        # memory_max = -1 (Nomad's memoryNoLimit): no hard limit, memory is the reservation.
        hard = 0
        if res.memory_mb:
            host["mem_reservation"] = res.memory_mb * mib
    else:
        hard = max(cfg.memory_hard_limit, res.memory_max_mb) or res.memory_mb
    if hard:
        if res.memory_mb and res.memory_mb > hard:
            raise ConfigError(f"task {task.name!r}: task memory requirements exceed driver hard limit of {hard} MB")
        host["mem_limit"] = hard * mib
        host["memswap_limit"] = hard * mib
        if res.memory_mb and res.memory_mb < hard:
            host["mem_reservation"] = res.memory_mb * mib
    if cfg.cpu_hard_limit:
        percent = res.linux.percent_ticks or 0.0
        if percent <= 0:
            raise ConfigError(
                f"task {task.name!r}: cpu_hard_limit needs the task's cpu share of the node (resources.cpu)"
            )
        period = cfg.cpu_cfs_period
        host["cpu_period"] = period
        host["cpu_quota"] = max(1000, int(percent * period * (os.cpu_count() or 1)))
    return host


def _log_config(cfg: TaskDockerConfig, plugin: PluginConfig) -> LogConfig:
    """The engine-side log: the task's logging block, else the plugin's (json-file, 2 x 2m).

    As in Nomad, a task that sets neither a type nor options gets the plugin's bounded log; the
    engine default (an unbounded json-file) would let a flooding task fill the engine's disk.
    """
    if not cfg.logging_type and cfg.logging_config is None:
        return LogConfig(type=plugin.logging_type, config=dict(plugin.logging_config))
    return LogConfig(type=cfg.logging_type, config=dict(cfg.logging_config or {}))


def _modes(task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig) -> dict[str, str]:
    """pid/ipc/userns/uts modes, each within the plugin's allowed_modes unless allow_privileged."""
    wanted = {"pid": cfg.pid_mode, "ipc": cfg.ipc_mode, "userns": cfg.userns_mode, "uts": cfg.uts_mode}
    for kind in MODE_KINDS:
        mode = wanted[kind]
        if not mode or plugin.allow_privileged:
            continue
        if not any(fnmatch.fnmatchcase(mode, p) for p in plugin.allowed_modes[kind]):
            raise ConfigError(
                f'task {task.name!r}: cannot apply "{kind}_mode" configuration: {mode!r} is not in the docker '
                f"plugin config's allowed_modes {{ {kind} = [...] }} (add it there, or set allow_privileged)"
            )
    return {f"{kind}_mode": wanted[kind] for kind in MODE_KINDS if wanted[kind]}


def _runtime(task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig) -> str | None:
    runtime = cfg.runtime
    if "NVIDIA_VISIBLE_DEVICES" in task.device_env:
        if runtime and runtime != plugin.nvidia_runtime:
            raise ConfigError(
                f"task {task.name!r}: conflicting runtime requests: the task asks for runtime {runtime!r} but "
                f"its nvidia device needs the nvidia_runtime {plugin.nvidia_runtime!r}"
            )
        return plugin.nvidia_runtime
    if runtime and runtime not in plugin.allow_runtimes:
        raise ConfigError(
            f"task {task.name!r}: requested runtime {runtime!r} is not allowed "
            f"(allow_runtimes in the docker plugin config is {list(plugin.allow_runtimes)})"
        )
    return runtime or None


def _pids_limit(task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig) -> int | None:
    if plugin.pids_limit and cfg.pids_limit > plugin.pids_limit:
        raise ConfigError(
            f"task {task.name!r}: pids_limit cannot be greater than nomad plugin config pids_limit: {plugin.pids_limit}"
        )
    return cfg.pids_limit or plugin.pids_limit or None


def _security_opt(task: TaskConfig, cfg: TaskDockerConfig) -> list[str] | None:
    """security_opt as given, except that seccomp=<file> carries the file's compacted JSON."""
    out = []
    for opt in cfg.security_opt:
        key, sep, value = opt.partition("=")
        if key == "seccomp" and sep and value != "unconfined":
            opt = "seccomp=" + json.dumps(_seccomp_profile(task, opt, value), separators=(",", ":"))
        out.append(opt)
    return out or None


def _seccomp_profile(task: TaskConfig, opt: str, path: str) -> Any:
    """The profile at ``path``, read only as a regular file of at most SECCOMP_PROFILE_MAX bytes.

    The job names the path and the plugin runs as root: a device (/dev/zero never ends), a fifo
    (blocks the open and every read) or a directory is refused. A symlink is followed: an
    operator's profile in /etc may well be one, and a regular file is all that is read."""
    where = f"task {task.name!r}: security_opt {opt!r}"
    try:
        # O_NONBLOCK: opening a fifo with no writer returns at once instead of waiting for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(f"{where}: cannot read the seccomp profile {path!r}: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"{where}: the seccomp profile {path!r} is {_file_kind(info.st_mode)}, not a regular file; point "
                "seccomp= at a JSON profile file"
            )
        if info.st_size > SECCOMP_PROFILE_MAX:
            raise ConfigError(
                f"{where}: the seccomp profile {path!r} is {info.st_size} bytes, more than the "
                f"{SECCOMP_PROFILE_MAX} a profile may have; point seccomp= at a JSON profile file"
            )
        data = b""
        while len(data) <= SECCOMP_PROFILE_MAX:
            chunk = os.read(fd, SECCOMP_PROFILE_MAX + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > SECCOMP_PROFILE_MAX:
            raise ConfigError(f"{where}: the seccomp profile {path!r} grew past {SECCOMP_PROFILE_MAX} bytes while read")
    finally:
        os.close(fd)
    try:
        return json.loads(data)
    except ValueError:
        raise ConfigError(f"{where}: the seccomp profile {path!r} is not valid JSON") from None


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


@dataclass
class Pins:
    """The pinned bind sources of one container create; released once the container started
    (it holds its own mounts then) or on any failure."""

    directory: str = ""
    paths: list[str] = field(default_factory=list)
    record: str | None = None  # pinrecord's note of ``directory``, for a plugin that dies first

    def release(self) -> None:
        for path in reversed(self.paths):
            try:
                pinning.unpin(path)
            except OSError as err:
                log.warning("cannot remove a pinned bind source", extra={"path": path, "error": str(err)})
        self.paths.clear()
        if self.directory:
            pinning.remove_private_dir(self.directory)
            if not os.path.lexists(self.directory):
                pinrecord.forget(self.record)
            self.directory = ""


def pin_sources(task: TaskConfig, spec: ContainerSpec) -> Pins:
    """Pin every bind source of ``spec`` that lies in the alloc dir and point the spec at the
    pins: each is opened beneath the alloc dir without following a symlink (a missing ``volumes``
    dir is made there, as the engine would), and bind-mounted onto an entry of a 0700 dir of
    ours in the alloc dir, which no task reaches. The engine then resolves only our path."""
    pins = Pins()
    if not spec.task_sources:
        return pins
    try:
        try:
            pins.directory = pinning.private_dir(tempfile.mkdtemp(prefix=PIN_DIR_PREFIX, dir=task.alloc_dir),
                                                 create=False)  # fmt: skip
        except (OSError, pinning.PinError) as err:
            raise DriverError(
                f"task {task.name!r}: cannot make a private dir for its bind sources in the alloc dir "
                f"{task.alloc_dir} ({getattr(err, 'strerror', None) or err}); check the alloc dir's permissions"
            ) from None
        pins.record = pinrecord.record(pins.directory)
        for n, source in enumerate(spec.task_sources):
            pinned = _pin_one(task, source, pins.directory, str(n))
            pins.paths.append(pinned)
            if source.in_binds:
                spec.host_config["binds"][source.index] = pinned + source.suffix
            else:
                spec.host_config["mounts"][source.index]["Source"] = pinned
            if source.propagation:
                _check_propagation(task, source, pinned)
    except BaseException:
        pins.release()
        raise
    return pins


def _pin_one(task: TaskConfig, source: TaskSource, directory: str, name: str) -> str:
    shown = show(os.path.join(task.alloc_dir, source.relative), 4096)
    try:
        fd = pinning.open_beneath(task.alloc_dir, source.relative, create_dirs=source.create)
    except pinning.PinError as err:
        raise ConfigError(
            f"task {task.name!r}: {source.where}: the source {shown} cannot be mounted: {err.reason} inside the "
            "alloc dir, which tasks can change; name the directory or file itself, with no symlink on the way"
        ) from None
    except OSError as err:
        raise ConfigError(
            f"task {task.name!r}: {source.where}: cannot open the source {shown} ({err.strerror or err})"
        ) from None
    try:
        if pinning.kind_of(fd) is pinning.Kind.OTHER:
            raise ConfigError(
                f"task {task.name!r}: {source.where}: the source {shown} is neither a directory nor a regular "
                "file; bind a directory or a file"
            )
        try:
            return pinning.pin(fd, directory, name).path
        except OSError as err:
            raise ConfigError(
                f"task {task.name!r}: {source.where}: cannot pin the source {shown} ({err.strerror or err})"
            ) from None
    finally:
        os.close(fd)


def _check_propagation(task: TaskConfig, source: TaskSource, pinned: str) -> None:
    entry = find_mount(pinned)
    ok = entry.shared or (entry.slave and "slave" in source.propagation)
    if not ok:
        raise ConfigError(
            f"task {task.name!r}: {source.where}: propagation {source.propagation!r} needs the source on a shared "
            f"mount, but the alloc dir's mount {entry.mount_point!r} is {entry.propagation}; run "
            f"`mount --make-rshared {entry.mount_point}` on the host or drop the propagation mode"
        )


def _ulimits(cfg: TaskDockerConfig) -> list[Ulimit] | None:
    out = []
    for name, value in sorted(cfg.ulimit.items()):
        soft, _, hard = value.partition(":")
        out.append(Ulimit(name=name, soft=int(soft), hard=int(hard or soft)))
    return out or None


def _ports(task: TaskConfig, cfg: TaskDockerConfig, network_mode: str) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    """(port_bindings, exposed ports) for the group ports the task lists in `ports`."""
    if cfg.port_map:
        raise ConfigError(
            f"task {task.name!r}: 'port_map' cannot map group network ports, use 'ports' instead "
            "(port_map only maps the ports of a task-level network block, which this driver is never given)"
        )
    if not cfg.ports or network_mode.startswith("container:"):
        return {}, []
    allocated = {p.label: p for p in task.resources.ports}
    bindings: dict[str, Any] = {}
    exposed: list[tuple[int, str]] = []
    for label in cfg.ports:
        port = allocated.get(label)
        if port is None:
            raise ConfigError(f"task {task.name!r}: Port {label!r} not found, check network block")
        inside = port.to if port.to > 0 else port.value
        for proto in ("tcp", "udp"):
            key = f"{inside}/{proto}"
            bindings.setdefault(key, []).append((port.host_ip, port.value) if port.host_ip else port.value)
            exposed.append((inside, proto))
    return bindings, exposed


def build(task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig) -> ContainerSpec:
    if cfg.privileged and not plugin.allow_privileged:
        raise ConfigError(
            f"task {task.name!r}: Docker privileged mode is disabled on this Nomad agent "
            "(set allow_privileged = true in the docker plugin config)"
        )
    cap_add, cap_drop = _capabilities(task, cfg, plugin)
    sources: list[TaskSource] = []
    command: list[str] | None = None
    if cfg.command is not None:
        command = [cfg.command, *cfg.args]
    elif cfg.args:
        command = list(cfg.args)
    network_mode = cfg.network_mode
    spec = task.network_isolation_spec
    if network_mode is None and spec is not None and spec.mode is NetworkIsolationMode.GROUP:
        sandbox = spec.labels.get("docker_sandbox_container_id")
        if sandbox:
            network_mode = f"container:{sandbox}"
    network_mode = network_mode or "default"
    port_bindings, exposed = _ports(task, cfg, network_mode)
    if task.dns is not None:
        # Nomad manages DNS for this task (a group network.dns): its servers win over the task's.
        dns = {
            "dns": list(task.dns.servers) or None,
            "dns_search": list(task.dns.searches) or None,
            "dns_opt": list(task.dns.options) or None,
        }
    else:
        dns = {
            "dns": list(cfg.dns_servers) or None,
            "dns_search": list(cfg.dns_search_domains) or None,
            "dns_opt": list(cfg.dns_options) or None,
        }
    oom_score_adj = cfg.oom_score_adj if cfg.oom_score_adj is not None else plugin.oom_score_adj
    host_config = {
        "binds": _binds(task, cfg, plugin, sources),
        "mounts": _mounts(task, cfg, plugin, sources),
        "privileged": cfg.privileged,
        "cap_add": cap_add or None,
        "cap_drop": cap_drop or None,
        "network_mode": network_mode,
        "log_config": _log_config(cfg, plugin),
        **_resources(task, cfg),
        **dns,
        **_modes(task, cfg, plugin),
        "port_bindings": port_bindings or None,
        # The engine refuses host entries in a container that shares another's network.
        "extra_hosts": (list(cfg.extra_hosts) or None) if not network_mode.startswith("container:") else None,
        "devices": [f"{d.host_path}:{d.container_path}:{d.permissions}" for d in cfg.devices] or None,
        "ulimits": _ulimits(cfg),
        "sysctls": dict(cfg.sysctl) or None,
        "shm_size": cfg.shm_size or None,
        "pids_limit": _pids_limit(task, cfg, plugin),
        "read_only": cfg.readonly_rootfs or None,
        "security_opt": _security_opt(task, cfg),
        "init": cfg.init or None,
        "runtime": _runtime(task, cfg, plugin),
        "storage_opt": dict(cfg.storage_opt) or None,
        "cpuset_cpus": cfg.cpuset_cpus or None,
        "oom_score_adj": oom_score_adj or None,
        "group_add": list(cfg.group_add) or None,
        "cgroupns": cfg.cgroupns or None,
        "volume_driver": cfg.volume_driver or None,
    }
    kwargs: dict[str, Any] = {
        "command": command,
        "entrypoint": list(cfg.entrypoint) if cfg.entrypoint is not None else None,
        "working_dir": cfg.work_dir,
        "hostname": cfg.hostname,
        "labels": _labels(task, cfg, plugin),
        "environment": [f"{k}={v}" for k, v in sorted(task.env.items())],
        "user": task.user or None,
        "tty": cfg.tty,
        "stdin_open": cfg.interactive,
        "detach": True,
        "ports": exposed or None,
        "mac_address": cfg.mac_address or None,
        "healthcheck": {"Test": ["NONE"]} if cfg.healthchecks_disable else None,
    }
    endpoint: dict[str, Any] = {}
    if cfg.network_aliases:
        endpoint["aliases"] = list(cfg.network_aliases)
    if cfg.ipv4_address:
        endpoint["ipv4_address"] = cfg.ipv4_address
    if cfg.ipv6_address:
        endpoint["ipv6_address"] = cfg.ipv6_address
    return ContainerSpec(
        name=container_name(task),
        image=cfg.image,
        kwargs=kwargs,
        host_config=host_config,
        endpoint=endpoint,
        create_attempts=cfg.container_exists_attempts or plugin.container_exists_attempts,
        task_sources=sources,
    )
