"""Turn a TaskConfig plus the docker task config into the engine's container-create request.

Everything a task asks for that the operator has not allowed is refused here, with a sentence,
before the engine is asked to create anything.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field
from typing import Any

from docker.types import DriverConfig, LogConfig, Ulimit
from docker.types import Mount as DockerMount

from drivers.docker.config import DOCKER_DEFAULT_CAPS, MODE_KINDS, PluginConfig, TaskDockerConfig
from drivers.docker.labels import LABEL_ALLOC_ID, LABEL_TASK_ID
from driversdk.errors import ConfigError
from driversdk.model import NetworkIsolationMode, TaskConfig

EXTRA_LABEL_FIELDS = (
    "job_name",
    "job_id",
    "task_group_name",
    "task_name",
    "namespace",
    "node_name",
    "node_id",
)


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


def container_name(task: TaskConfig) -> str:
    return f"{task.name.replace('/', '_')}-{task.alloc_id}"


def _within(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


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


def _binds(task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig) -> list[str]:
    label = f":{plugin.selinux_label}" if plugin.selinux_label else ""
    ro_label = f":ro,{plugin.selinux_label}" if plugin.selinux_label else ":ro"
    binds = [
        f"{task.shared_alloc_dir}:/alloc{label}",
        f"{task.local_dir}:/local{label}",
        f"{task.secrets_dir}:/secrets{label}",
        f"{os.path.join(task.shared_alloc_dir, 'logs')}:/alloc/logs{ro_label}",
    ]
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
        if not cfg.volume_driver and not plugin.volumes_enabled and not _within(src, task.alloc_dir):
            raise ConfigError(
                f"task {task.name!r}: volumes are not enabled; cannot mount host path: {spec!r} "
                "(set volumes { enabled = true } in the docker plugin config, or mount from inside the alloc dir)"
            )
        mode = parts[2] if len(parts) > 2 else ""
        if plugin.selinux_label:
            mode = f"{mode},{plugin.selinux_label}" if mode else plugin.selinux_label
        binds.append(f"{src}:{parts[1]}" + (f":{mode}" if mode else ""))
    return binds


def _mounts(task: TaskConfig, cfg: TaskDockerConfig, plugin: PluginConfig) -> list[DockerMount]:
    out: list[DockerMount] = []
    for i, m in enumerate(cfg.mounts):
        if m.type == "bind":
            src = m.source if os.path.isabs(m.source) else os.path.normpath(os.path.join(task.task_dir, m.source))
            if not plugin.volumes_enabled and not _within(src, task.alloc_dir):
                raise ConfigError(
                    f"task {task.name!r}: mount[{i}]: volumes are not enabled; cannot mount host path: {src!r} "
                    "(set volumes { enabled = true } in the docker plugin config)"
                )
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
        hard = 0
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
            try:
                with open(value, "rb") as fh:
                    profile = json.load(fh)
            except OSError as err:
                raise ConfigError(
                    f"task {task.name!r}: security_opt {opt!r}: cannot read the seccomp profile: {err.strerror}"
                ) from None
            except ValueError:
                raise ConfigError(
                    f"task {task.name!r}: security_opt {opt!r}: the seccomp profile is not valid JSON"
                ) from None
            opt = "seccomp=" + json.dumps(profile, separators=(",", ":"))
        out.append(opt)
    return out or None


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
        "binds": _binds(task, cfg, plugin),
        "mounts": _mounts(task, cfg, plugin),
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
    )
