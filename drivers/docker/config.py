"""The docker driver's plugin and task config: hclspec schemas and typed views of them."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from driversdk import hclspec as hs
from driversdk.durations import parse_duration
from driversdk.errors import ConfigError

# Nomad's default allow_caps: Docker's defaults less NET_RAW.
DEFAULT_ALLOW_CAPS = [
    "audit_write", "chown", "dac_override", "fowner", "fsetid", "kill", "mknod",
    "net_bind_service", "setfcap", "setgid", "setpcap", "setuid", "sys_chroot",
]  # fmt: skip
# Docker's own default capability set (Nomad's defaults plus NET_RAW).
DOCKER_DEFAULT_CAPS = [*DEFAULT_ALLOW_CAPS, "net_raw"]
# Nomad's default engine-side log of a task container (the plugin config's logging block): a
# json-file log of at most two 2 MB files, so a task that floods its output cannot fill the
# engine's disk. Our copier reads the container's output live, not from this log.
DEFAULT_LOGGING_TYPE = "json-file"
DEFAULT_LOGGING_CONFIG = {"max-file": "2", "max-size": "2m"}
# The task's namespace modes that allowed_modes governs, and what the engine accepts for each.
MODE_KINDS = ("pid", "ipc", "userns", "uts")
VALID_MODES = {
    "pid": ("host", "container:<name|id>"),
    "ipc": ("none", "private", "shareable", "host", "container:<name|id>"),
    "userns": ("host",),
    "uts": ("host",),
}
DANGLING_DEFAULTS = '{enabled = true, period = "5m", creation_grace = "5m", dry_run = false}'


def plugin_spec() -> hs.Spec:
    return hs.obj(
        {
            "endpoint": hs.attr("string"),
            "disable_log_collection": hs.default(hs.attr("bool"), hs.literal("false")),
            "volumes": hs.default(
                hs.block(
                    hs.obj(
                        {
                            "enabled": hs.default(hs.attr("bool"), hs.literal("false")),
                            "selinuxlabel": hs.attr("string"),
                        }
                    )
                ),
                hs.literal('{enabled = false, selinuxlabel = ""}'),
            ),
            "allow_privileged": hs.default(hs.attr("bool"), hs.literal("false")),
            "allow_caps": hs.default(
                hs.attr("list(string)"), hs.literal("[" + ", ".join(f'"{c}"' for c in DEFAULT_ALLOW_CAPS) + "]")
            ),
            "gc": hs.default(
                hs.block(
                    hs.obj(
                        {
                            "image": hs.default(hs.attr("bool"), hs.literal("true")),
                            "image_delay": hs.default(hs.attr("string"), hs.literal('"3m"')),
                            "container": hs.default(hs.attr("bool"), hs.literal("true")),
                            # Nomad's names and defaults (drivers/docker/config.go).
                            "dangling_containers": hs.default(
                                hs.block(
                                    hs.obj(
                                        {
                                            "enabled": hs.default(hs.attr("bool"), hs.literal("true")),
                                            "period": hs.default(hs.attr("string"), hs.literal('"5m"')),
                                            "creation_grace": hs.default(hs.attr("string"), hs.literal('"5m"')),
                                            "dry_run": hs.default(hs.attr("bool"), hs.literal("false")),
                                        }
                                    )
                                ),
                                hs.literal(DANGLING_DEFAULTS),
                            ),
                        }
                    )
                ),
                hs.literal(
                    f'{{image = true, image_delay = "3m", container = true, dangling_containers = {DANGLING_DEFAULTS}}}'
                ),
            ),
            "pull_activity_timeout": hs.default(hs.attr("string"), hs.literal('"2m"')),
            "image_pull_timeout": hs.default(hs.attr("string"), hs.literal('"5m"')),
            "extra_labels": hs.default(hs.attr("list(string)"), hs.literal("[]")),
            "infra_image": hs.default(hs.attr("string"), hs.literal('"registry.k8s.io/pause-amd64:3.3"')),
            "logging": hs.default(
                hs.block(hs.obj({"type": hs.attr("string"), "config": hs.block_attrs("string")})),
                hs.literal('{type = "json-file", config = {max-file = "2", max-size = "2m"}}'),
            ),
            "auth": hs.block(hs.obj({"config": hs.attr("string"), "helper": hs.attr("string")})),
            "tls": hs.block(hs.obj({"cert": hs.attr("string"), "key": hs.attr("string"), "ca": hs.attr("string")})),
            "nvidia_runtime": hs.default(hs.attr("string"), hs.literal('"nvidia"')),
            "allow_runtimes": hs.default(hs.attr("list(string)"), hs.literal('["runc", "nvidia"]')),
            "infra_image_pull_timeout": hs.default(hs.attr("string"), hs.literal('"5m"')),
            "pids_limit": hs.attr("number"),
            "oom_score_adj": hs.attr("number"),
            "container_exists_attempts": hs.default(hs.attr("number"), hs.literal("5")),
            "windows_allow_insecure_container_admin": hs.default(hs.attr("bool"), hs.literal("false")),
            "allowed_modes": hs.block(
                hs.obj({mode: hs.attr("list(string)") for mode in ("pid", "ipc", "userns", "uts")})
            ),
        }
    )


def _mount_spec() -> hs.Spec:
    return hs.obj(
        {
            "type": hs.default(hs.attr("string"), hs.literal('"volume"')),
            "target": hs.attr("string", required=True),
            "source": hs.attr("string"),
            "readonly": hs.default(hs.attr("bool"), hs.literal("false")),
            "bind_options": hs.block(hs.obj({"propagation": hs.attr("string")})),
            "tmpfs_options": hs.block(hs.obj({"size": hs.attr("number"), "mode": hs.attr("number")})),
            "volume_options": hs.block(
                hs.obj(
                    {
                        "no_copy": hs.attr("bool"),
                        "labels": hs.attr("list(map(string))"),
                        "driver_config": hs.block(
                            hs.obj({"name": hs.attr("string"), "options": hs.attr("list(map(string))")})
                        ),
                    }
                )
            ),
        }
    )


def task_spec() -> hs.Spec:
    return hs.obj(
        {
            "image": hs.attr("string", required=True),
            "command": hs.attr("string"),
            "args": hs.attr("list(string)"),
            "entrypoint": hs.attr("list(string)"),
            "work_dir": hs.attr("string"),
            "hostname": hs.attr("string"),
            "labels": hs.attr("map(string)"),
            "privileged": hs.default(hs.attr("bool"), hs.literal("false")),
            "cap_add": hs.attr("list(string)"),
            "cap_drop": hs.attr("list(string)"),
            "network_mode": hs.attr("string"),
            "tty": hs.default(hs.attr("bool"), hs.literal("false")),
            "mount": hs.block_list(_mount_spec()),
            # The pre-1.0 `mounts = [{...}]` spelling of the same blocks.
            "mounts": hs.block_list(_mount_spec()),
            "volumes": hs.attr("list(string)"),
            "force_pull": hs.default(hs.attr("bool"), hs.literal("false")),
            "image_pull_timeout": hs.attr("string"),
            "load": hs.attr("string"),
            "logging": hs.block(
                hs.obj({"type": hs.attr("string"), "driver": hs.attr("string"), "config": hs.attr("list(map(string))")})
            ),
            "auth": hs.block(
                hs.obj(
                    {
                        "username": hs.attr("string"),
                        "password": hs.attr("string"),
                        "email": hs.attr("string"),
                        "server_address": hs.attr("string"),
                    }
                )
            ),
            "memory_hard_limit": hs.attr("number"),
            "cpu_hard_limit": hs.default(hs.attr("bool"), hs.literal("false")),
            "cpu_cfs_period": hs.default(hs.attr("number"), hs.literal("100000")),
            "auth_soft_fail": hs.default(hs.attr("bool"), hs.literal("false")),
            "advertise_ipv6_address": hs.default(hs.attr("bool"), hs.literal("false")),
            "cpuset_cpus": hs.attr("string"),
            "devices": hs.block_list(
                hs.obj(
                    {
                        "host_path": hs.attr("string"),
                        "container_path": hs.attr("string"),
                        "cgroup_permissions": hs.attr("string"),
                    }
                )
            ),
            "dns_search_domains": hs.attr("list(string)"),
            "dns_options": hs.attr("list(string)"),
            "dns_servers": hs.attr("list(string)"),
            "extra_hosts": hs.attr("list(string)"),
            "group_add": hs.attr("list(string)"),
            "healthchecks": hs.block(hs.obj({"disable": hs.attr("bool")})),
            "init": hs.default(hs.attr("bool"), hs.literal("false")),
            "interactive": hs.default(hs.attr("bool"), hs.literal("false")),
            "ipc_mode": hs.attr("string"),
            "ipv4_address": hs.attr("string"),
            "ipv6_address": hs.attr("string"),
            "isolation": hs.attr("string"),
            "mac_address": hs.attr("string"),
            "network_aliases": hs.attr("list(string)"),
            "runtime": hs.attr("string"),
            "pids_limit": hs.attr("number"),
            "pid_mode": hs.attr("string"),
            "ports": hs.attr("list(string)"),
            # Nomad types port_map, sysctl and ulimit (like labels) list(map(...)), one map per block.
            # Here they are one map: the SDK's converter takes both spellings jobs use for a map
            # type (`sysctl = { "net.core.somaxconn" = "512" }` and `ulimit { nofile = "..." }`),
            # but not the `= { }` one for a list(map) type, and sysctl keys cannot be block labels.
            "port_map": hs.attr("map(number)"),
            "readonly_rootfs": hs.default(hs.attr("bool"), hs.literal("false")),
            "security_opt": hs.attr("list(string)"),
            "shm_size": hs.attr("number"),
            "storage_opt": hs.block_attrs("string"),
            "sysctl": hs.attr("map(string)"),
            "ulimit": hs.attr("map(string)"),
            "uts_mode": hs.attr("string"),
            "userns_mode": hs.attr("string"),
            "cgroupns": hs.attr("string"),
            "oom_score_adj": hs.attr("number"),
            "container_exists_attempts": hs.attr("number"),
            "volume_driver": hs.attr("string"),
        }
    )


@dataclass(frozen=True)
class DanglingContainers:
    """gc.dangling_containers: the reconciler of containers no live plugin owns (reconcile.py)."""

    enabled: bool = True
    dry_run: bool = False
    period: float = 300.0
    creation_grace: float = 300.0

    @classmethod
    def from_decoded(cls, cfg: dict[str, Any]) -> DanglingContainers:
        period = parse_duration(cfg.get("period") or "5m", "period")
        if period <= 0:
            raise ConfigError(f"gc.dangling_containers.period {cfg.get('period')!r} must be longer than zero")
        # Nomad refuses a creation_grace under 1m. We accept shorter ones (tests use seconds):
        # here the grace is not what keeps a live task safe; the owner check is (reconcile.py).
        grace = parse_duration(cfg.get("creation_grace") or "5m", "creation_grace")
        return cls(
            enabled=cfg.get("enabled", True) is not False,
            dry_run=bool(cfg.get("dry_run")),
            period=period,
            creation_grace=grace,
        )


@dataclass(frozen=True)
class PluginConfig:
    endpoint: str | None = None
    disable_log_collection: bool = False
    volumes_enabled: bool = False
    selinux_label: str = ""
    allow_privileged: bool = False
    allow_caps: tuple[str, ...] = tuple(DEFAULT_ALLOW_CAPS)
    gc_image: bool = True
    gc_image_delay: float = 180.0
    gc_container: bool = True
    dangling: DanglingContainers = DanglingContainers()
    pull_activity_timeout: float = 120.0
    image_pull_timeout: float = 300.0
    extra_labels: tuple[str, ...] = ()
    infra_image: str = "registry.k8s.io/pause-amd64:3.3"
    logging_type: str = DEFAULT_LOGGING_TYPE
    logging_config: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_LOGGING_CONFIG))
    auth_config: str = ""
    auth_helper: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    nvidia_runtime: str = "nvidia"
    allow_runtimes: tuple[str, ...] = ("runc", "nvidia")
    infra_image_pull_timeout: float = 300.0
    pids_limit: int = 0
    oom_score_adj: int = 0
    container_exists_attempts: int = 5
    # Glob allow-lists of task pid_mode / ipc_mode / userns_mode / uts_mode; empty refuses any mode.
    allowed_modes: dict[str, tuple[str, ...]] = field(default_factory=lambda: {m: () for m in MODE_KINDS})

    @classmethod
    def from_decoded(cls, cfg: dict[str, Any]) -> PluginConfig:
        if cfg.get("windows_allow_insecure_container_admin"):
            raise ConfigError(
                "windows_allow_insecure_container_admin applies only to Windows containers (the ContainerAdmin "
                "user); this driver runs Linux containers, so remove it from the docker plugin config"
            )
        auth = cfg.get("auth") or {}
        tls = cfg.get("tls") or {}
        modes = cfg.get("allowed_modes") or {}
        allowed_modes = {kind: tuple(modes.get(kind) or ()) for kind in MODE_KINDS}
        for kind, patterns in allowed_modes.items():
            for pattern in patterns:
                if not _valid_mode_pattern(kind, pattern):
                    raise ConfigError(
                        f"cannot apply allowed_modes configuration, {pattern!r} is not a valid {kind}_mode "
                        f"(use one of {', '.join(VALID_MODES[kind])}, a glob such as container:*, or *)"
                    )
        pids = int(cfg.get("pids_limit") or 0)
        if pids < 0:
            raise ConfigError(f"pids_limit {pids} must be zero (unlimited) or more")
        raw_attempts = cfg.get("container_exists_attempts")
        attempts = int(raw_attempts) if raw_attempts is not None else 5
        if attempts < 1:
            raise ConfigError(f"container_exists_attempts {attempts} must be at least 1")
        volumes = cfg.get("volumes") or {}
        gc = cfg.get("gc") or {}
        logging = cfg.get("logging")
        activity = parse_duration(cfg.get("pull_activity_timeout") or "2m", "pull_activity_timeout")
        if activity < 60:
            raise ConfigError("pull_activity_timeout is less than minimum, 1m0s")
        return cls(
            endpoint=cfg.get("endpoint") or None,
            disable_log_collection=bool(cfg.get("disable_log_collection")),
            volumes_enabled=bool(volumes.get("enabled")),
            selinux_label=volumes.get("selinuxlabel") or "",
            allow_privileged=bool(cfg.get("allow_privileged")),
            allow_caps=tuple(_cap(c) for c in (cfg.get("allow_caps") or DEFAULT_ALLOW_CAPS)),
            gc_image=gc.get("image", True) is not False,
            gc_image_delay=parse_duration(gc.get("image_delay") or "3m", "image_delay"),
            gc_container=gc.get("container", True) is not False,
            dangling=DanglingContainers.from_decoded(gc.get("dangling_containers") or {}),
            pull_activity_timeout=activity,
            image_pull_timeout=parse_duration(cfg.get("image_pull_timeout") or "5m", "image_pull_timeout"),
            extra_labels=tuple(cfg.get("extra_labels") or ()),
            infra_image=(cfg.get("infra_image") or "registry.k8s.io/pause-amd64:3.3").removeprefix("https://"),
            # An absent block gets Nomad's default; a block given without one of its fields
            # leaves that field empty, as Nomad does.
            logging_type=str(logging.get("type") or "") if logging is not None else DEFAULT_LOGGING_TYPE,
            logging_config=(
                {str(k): str(v) for k, v in (logging.get("config") or {}).items()}
                if logging is not None
                else dict(DEFAULT_LOGGING_CONFIG)
            ),
            auth_config=auth.get("config") or "",
            auth_helper=auth.get("helper") or "",
            tls_cert=tls.get("cert") or "",
            tls_key=tls.get("key") or "",
            tls_ca=tls.get("ca") or "",
            nvidia_runtime=cfg.get("nvidia_runtime") or "nvidia",
            allow_runtimes=tuple(
                cfg["allow_runtimes"] if cfg.get("allow_runtimes") is not None else ("runc", "nvidia")
            ),
            infra_image_pull_timeout=parse_duration(
                cfg.get("infra_image_pull_timeout") or "5m", "infra_image_pull_timeout"
            ),
            pids_limit=pids,
            oom_score_adj=int(cfg.get("oom_score_adj") or 0),
            container_exists_attempts=attempts,
            allowed_modes=allowed_modes,
        )


def _valid_mode_pattern(kind: str, pattern: str) -> bool:
    """A mode the engine accepts for this kind, or a glob that matches at least one."""
    examples = [m.replace("<name|id>", "x") for m in VALID_MODES[kind]]
    if any(c in pattern for c in "*?["):
        return any(fnmatch.fnmatchcase(e, pattern) for e in examples)
    if pattern.startswith("container:"):
        return "container:x" in examples and len(pattern) > len("container:")
    return pattern in VALID_MODES[kind]


def _cap(name: str) -> str:
    return name.strip().lower().removeprefix("cap_")


@dataclass(frozen=True)
class MountBlock:
    type: str
    target: str
    source: str = ""
    readonly: bool = False
    propagation: str = ""
    tmpfs_size: int | None = None
    tmpfs_mode: int | None = None
    no_copy: bool = False
    volume_labels: dict[str, str] | None = None
    volume_driver: str = ""
    volume_driver_options: dict[str, str] | None = None


@dataclass(frozen=True)
class DeviceBlock:
    host_path: str
    container_path: str
    permissions: str


def merged_maps(value: Any) -> dict[str, Any]:
    """A list(map(...)) value (one map per `sysctl { }` block, say) as one map; later keys win."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        return dict(value)
    for entry in value or ():
        out.update(entry or {})
    return out


@dataclass(frozen=True)
class TaskDockerConfig:
    image: str
    command: str | None = None
    args: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] | None = None
    work_dir: str | None = None
    hostname: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    privileged: bool = False
    cap_add: tuple[str, ...] = ()
    cap_drop: tuple[str, ...] = ()
    network_mode: str | None = None
    tty: bool = False
    mounts: tuple[MountBlock, ...] = ()
    volumes: tuple[str, ...] = ()
    force_pull: bool = False
    image_pull_timeout: float | None = None
    load: str | None = None
    auth: dict[str, str] | None = None
    memory_hard_limit: int = 0
    cpu_hard_limit: bool = False
    cpu_cfs_period: int = 100000
    # The task's logging block; both empty means "use the plugin config's logging".
    logging_type: str = ""
    logging_config: dict[str, str] | None = None
    auth_soft_fail: bool = False
    advertise_ipv6_address: bool = False
    cpuset_cpus: str = ""
    devices: tuple[DeviceBlock, ...] = ()
    dns_servers: tuple[str, ...] = ()
    dns_search_domains: tuple[str, ...] = ()
    dns_options: tuple[str, ...] = ()
    extra_hosts: tuple[str, ...] = ()
    group_add: tuple[str, ...] = ()
    healthchecks_disable: bool = False
    init: bool = False
    interactive: bool = False
    ipc_mode: str = ""
    pid_mode: str = ""
    uts_mode: str = ""
    userns_mode: str = ""
    ipv4_address: str = ""
    ipv6_address: str = ""
    mac_address: str = ""
    network_aliases: tuple[str, ...] = ()
    isolation: str = ""
    runtime: str = ""
    pids_limit: int = 0
    ports: tuple[str, ...] = ()
    port_map: dict[str, int] = field(default_factory=dict)
    readonly_rootfs: bool = False
    security_opt: tuple[str, ...] = ()
    shm_size: int = 0
    storage_opt: dict[str, str] = field(default_factory=dict)
    sysctl: dict[str, str] = field(default_factory=dict)
    ulimit: dict[str, str] = field(default_factory=dict)
    cgroupns: str = ""
    oom_score_adj: int | None = None
    container_exists_attempts: int = 0
    volume_driver: str = ""

    @classmethod
    def from_decoded(cls, cfg: dict[str, Any], task: str) -> TaskDockerConfig:
        image = (cfg.get("image") or "").removeprefix("https://")
        if not image:
            raise ConfigError(f"task {task!r}: image name required for docker driver")
        command = cfg.get("command")
        if command is not None:
            if not command:
                raise ConfigError(f"task {task!r}: command empty: {command!r}")
            if command != command.strip():
                raise ConfigError(f"task {task!r}: command contains extra white space: {command!r}")
        period = int(cfg.get("cpu_cfs_period") or 100000)
        if not 0 <= period <= 1_000_000:
            raise ConfigError(f"task {task!r}: invalid value for cpu_cfs_period {period}; use 0 to 1000000")
        mounts = []
        for i, m in enumerate([*(cfg.get("mount") or []), *(cfg.get("mounts") or [])]):
            kind = m.get("type") or "volume"
            if kind not in ("bind", "volume", "tmpfs"):
                raise ConfigError(
                    f'task {task!r}: mount[{i}]: invalid mount type, must be "bind", "volume", "tmpfs": {kind!r}'
                )
            if kind == "tmpfs" and m.get("source"):
                raise ConfigError(f'task {task!r}: mount[{i}]: invalid source, must be "" for tmpfs')
            tmpfs = m.get("tmpfs_options") or {}
            vol = m.get("volume_options") or {}
            vdriver = vol.get("driver_config") or {}
            mounts.append(
                MountBlock(
                    type=kind,
                    target=m["target"],
                    source=m.get("source") or "",
                    readonly=bool(m.get("readonly")),
                    propagation=(m.get("bind_options") or {}).get("propagation") or "",
                    tmpfs_size=int(tmpfs["size"]) if tmpfs.get("size") is not None else None,
                    tmpfs_mode=int(tmpfs["mode"]) if tmpfs.get("mode") is not None else None,
                    no_copy=bool(vol.get("no_copy")),
                    volume_labels={str(k): str(v) for k, v in merged_maps(vol.get("labels")).items()} or None,
                    volume_driver=vdriver.get("name") or "",
                    volume_driver_options={str(k): str(v) for k, v in merged_maps(vdriver.get("options")).items()}
                    or None,
                )
            )
        devices = []
        for i, d in enumerate(cfg.get("devices") or []):
            host_path = d.get("host_path") or ""
            if not host_path:
                raise ConfigError(f"task {task!r}: devices[{i}]: host path must be set in configuration for devices")
            perms = d.get("cgroup_permissions") or "rwm"
            if not perms or any(c not in "rwm" for c in perms) or len(set(perms)) != len(perms):
                raise ConfigError(
                    f"task {task!r}: devices[{i}]: invalid cgroup permission string: {perms!r} "
                    "(use a combination of r, w and m)"
                )
            devices.append(DeviceBlock(host_path, d.get("container_path") or host_path, perms))
        isolation = cfg.get("isolation") or ""
        if isolation:
            raise ConfigError(
                f"task {task!r}: Failed to create container configuration, cannot use isolation mode "
                f"{isolation!r} on linux (isolation is a Windows containers option; remove it)"
            )
        ulimits = {str(k): str(v) for k, v in merged_maps(cfg.get("ulimit")).items()}
        for name, value in ulimits.items():
            if not _ulimit_ok(value):
                raise ConfigError(
                    f"task {task!r}: Malformed ulimit specification {name}: {value!r}; "
                    'write "soft" or "soft:hard" with whole numbers, soft not above hard'
                )
        cgroupns = cfg.get("cgroupns") or ""
        if cgroupns not in ("", "host", "private"):
            raise ConfigError(f'task {task!r}: invalid cgroup namespace mode {cgroupns!r}; use "host" or "private"')
        port_map = {str(k): int(v) for k, v in merged_maps(cfg.get("port_map")).items()}
        pull_timeout = cfg.get("image_pull_timeout")
        logging = cfg.get("logging") or {}
        log_options: dict[str, str] | None = None
        if logging.get("config"):
            # list(map(string)): each `config { ... }` block is one map; later keys win.
            log_options = {}
            for entry in logging["config"]:
                log_options.update({str(k): str(v) for k, v in (entry or {}).items()})
        return cls(
            image=image,
            command=command,
            args=tuple(cfg.get("args") or ()),
            entrypoint=tuple(cfg["entrypoint"]) if cfg.get("entrypoint") is not None else None,
            work_dir=cfg.get("work_dir") or None,
            hostname=cfg.get("hostname") or None,
            labels=dict(cfg.get("labels") or {}),
            privileged=bool(cfg.get("privileged")),
            cap_add=tuple(_cap(c) for c in cfg.get("cap_add") or ()),
            cap_drop=tuple(_cap(c) for c in cfg.get("cap_drop") or ()),
            network_mode=cfg.get("network_mode") or None,
            tty=bool(cfg.get("tty")),
            mounts=tuple(mounts),
            volumes=tuple(cfg.get("volumes") or ()),
            force_pull=bool(cfg.get("force_pull")),
            image_pull_timeout=parse_duration(pull_timeout, "image_pull_timeout") if pull_timeout else None,
            load=cfg.get("load") or None,
            auth={k: v for k, v in (cfg.get("auth") or {}).items() if v} or None,
            memory_hard_limit=int(cfg.get("memory_hard_limit") or 0),
            cpu_hard_limit=bool(cfg.get("cpu_hard_limit")),
            cpu_cfs_period=period,
            logging_type=str(logging.get("type") or logging.get("driver") or ""),
            logging_config=log_options,
            auth_soft_fail=bool(cfg.get("auth_soft_fail")),
            advertise_ipv6_address=bool(cfg.get("advertise_ipv6_address")),
            cpuset_cpus=cfg.get("cpuset_cpus") or "",
            devices=tuple(devices),
            dns_servers=tuple(cfg.get("dns_servers") or ()),
            dns_search_domains=tuple(cfg.get("dns_search_domains") or ()),
            dns_options=tuple(cfg.get("dns_options") or ()),
            extra_hosts=tuple(cfg.get("extra_hosts") or ()),
            group_add=tuple(cfg.get("group_add") or ()),
            healthchecks_disable=bool((cfg.get("healthchecks") or {}).get("disable")),
            init=bool(cfg.get("init")),
            interactive=bool(cfg.get("interactive")),
            ipc_mode=cfg.get("ipc_mode") or "",
            pid_mode=cfg.get("pid_mode") or "",
            uts_mode=cfg.get("uts_mode") or "",
            userns_mode=cfg.get("userns_mode") or "",
            ipv4_address=cfg.get("ipv4_address") or "",
            ipv6_address=cfg.get("ipv6_address") or "",
            mac_address=cfg.get("mac_address") or "",
            network_aliases=tuple(cfg.get("network_aliases") or ()),
            isolation=isolation,
            runtime=cfg.get("runtime") or "",
            pids_limit=int(cfg.get("pids_limit") or 0),
            ports=tuple(cfg.get("ports") or ()),
            port_map=port_map,
            readonly_rootfs=bool(cfg.get("readonly_rootfs")),
            security_opt=tuple(cfg.get("security_opt") or ()),
            shm_size=int(cfg.get("shm_size") or 0),
            storage_opt={str(k): str(v) for k, v in (cfg.get("storage_opt") or {}).items()},
            sysctl={str(k): str(v) for k, v in merged_maps(cfg.get("sysctl")).items()},
            ulimit=ulimits,
            cgroupns=cgroupns,
            oom_score_adj=int(cfg["oom_score_adj"]) if cfg.get("oom_score_adj") is not None else None,
            container_exists_attempts=int(cfg.get("container_exists_attempts") or 0),
            volume_driver=cfg.get("volume_driver") or "",
        )


def _ulimit_ok(value: str) -> bool:
    soft, _, hard = value.partition(":")
    if not soft.isdigit() or (hard and not hard.isdigit()):
        return False
    return not hard or int(soft) <= int(hard)
