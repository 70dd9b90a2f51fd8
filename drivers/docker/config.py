"""The docker driver's plugin and task config: hclspec schemas and typed views of them."""

from __future__ import annotations

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
            "mount": hs.block_list(
                hs.obj(
                    {
                        "type": hs.default(hs.attr("string"), hs.literal('"volume"')),
                        "target": hs.attr("string", required=True),
                        "source": hs.attr("string"),
                        "readonly": hs.default(hs.attr("bool"), hs.literal("false")),
                        "bind_options": hs.block(hs.obj({"propagation": hs.attr("string")})),
                        "tmpfs_options": hs.block(hs.obj({"size": hs.attr("number"), "mode": hs.attr("number")})),
                    }
                )
            ),
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

    @classmethod
    def from_decoded(cls, cfg: dict[str, Any]) -> PluginConfig:
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
        )


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
        for i, m in enumerate(cfg.get("mount") or []):
            kind = m.get("type") or "volume"
            if kind not in ("bind", "volume", "tmpfs"):
                raise ConfigError(
                    f'task {task!r}: mount[{i}]: invalid mount type, must be "bind", "volume", "tmpfs": {kind!r}'
                )
            if kind == "tmpfs" and m.get("source"):
                raise ConfigError(f'task {task!r}: mount[{i}]: invalid source, must be "" for tmpfs')
            tmpfs = m.get("tmpfs_options") or {}
            mounts.append(
                MountBlock(
                    type=kind,
                    target=m["target"],
                    source=m.get("source") or "",
                    readonly=bool(m.get("readonly")),
                    propagation=(m.get("bind_options") or {}).get("propagation") or "",
                    tmpfs_size=int(tmpfs["size"]) if tmpfs.get("size") is not None else None,
                    tmpfs_mode=int(tmpfs["mode"]) if tmpfs.get("mode") is not None else None,
                )
            )
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
        )
