"""The exec driver's plugin and task config: hclspec schemas, typed views, capability gates."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

from driversdk import hclspec as hs
from driversdk.errors import ConfigError
from driversdk.taskkit.hostcfg import HostDefaults, HostPluginConfig, host_options, host_options_spec
from driversdk.taskkit.ids import IdRanges

# Nomad's default allow_caps for exec (Docker's defaults less NET_RAW).
DEFAULT_ALLOW_CAPS = (
    "audit_write", "chown", "dac_override", "fowner", "fsetid", "kill", "mknod",
    "net_bind_service", "setfcap", "setgid", "setpcap", "setuid", "sys_chroot",
)  # fmt: skip

# Host dirs exposed read-only in every task's root, like Nomad's default chroot_env.
DEFAULT_CHROOT_ENV = ("/bin", "/etc", "/lib", "/lib32", "/lib64", "/run/resolvconf", "/sbin", "/usr")

DEFAULT_STATE_DIR = "/var/lib/driversdk-exec"
DEFAULT_BRIDGE = "dsxbr0"
DEFAULT_SUBNET = "10.231.0.0/24"
DEFAULT_CGROUP_PARENT = "driversdk-exec"
MODES = ("private", "host")
# Who a task may run as when the plugin config does not say: never root (uid 0 or gid 0). An
# operator who wants root tasks sets both options to "", which denies no id.
DEFAULT_DENIED_HOST_IDS = "0"
HOST_DEFAULTS = HostDefaults(DEFAULT_STATE_DIR, DEFAULT_CGROUP_PARENT, denied_ids=DEFAULT_DENIED_HOST_IDS)
# Who a task runs as when it names no user, as Nomad's exec driver does.
DEFAULT_TASK_USER = "nobody"


def _list_literal(items: tuple[str, ...]) -> hs.Spec:
    return hs.literal("[" + ", ".join(f'"{i}"' for i in items) + "]")


def plugin_spec() -> hs.Spec:
    return hs.obj(
        {
            "runtime_path": hs.default(hs.attr("string"), hs.literal('"runc"')),
            "no_pivot_root": hs.default(hs.attr("bool"), hs.literal("false")),
            "default_pid_mode": hs.default(hs.attr("string"), hs.literal('"private"')),
            "default_ipc_mode": hs.default(hs.attr("string"), hs.literal('"private"')),
            "allow_caps": hs.default(hs.attr("list(string)"), _list_literal(DEFAULT_ALLOW_CAPS)),
            "chroot_env": hs.default(hs.attr("list(string)"), _list_literal(DEFAULT_CHROOT_ENV)),
            "disable_log_collection": hs.default(hs.attr("bool"), hs.literal("false")),
            "bridge_name": hs.default(hs.attr("string"), hs.literal(f'"{DEFAULT_BRIDGE}"')),
            "bridge_subnet": hs.default(hs.attr("string"), hs.literal(f'"{DEFAULT_SUBNET}"')),
            **host_options_spec(HOST_DEFAULTS),
        }
    )


def task_spec() -> hs.Spec:
    return hs.obj(
        {
            "command": hs.attr("string", required=True),
            "args": hs.attr("list(string)"),
            "work_dir": hs.attr("string"),
            "pid_mode": hs.attr("string"),
            "ipc_mode": hs.attr("string"),
            "cap_add": hs.attr("list(string)"),
            "cap_drop": hs.attr("list(string)"),
        }
    )


def normalize_cap(name: str) -> str:
    return name.strip().lower().removeprefix("cap_")


def _mode(value: str, field: str) -> str:
    if value not in MODES:
        raise ConfigError(f'{field} {value!r} is not valid: use "private" or "host"')
    return value


def _denied(name: str) -> IdRanges:
    return IdRanges.parse(DEFAULT_DENIED_HOST_IDS, name)


@dataclass(frozen=True)
class PluginConfig(HostPluginConfig):
    state_dir: str = DEFAULT_STATE_DIR
    cgroup_parent: str = DEFAULT_CGROUP_PARENT
    denied_uids: IdRanges = field(default_factory=lambda: _denied("denied_host_uids"))
    denied_gids: IdRanges = field(default_factory=lambda: _denied("denied_host_gids"))
    runtime_path: str = "runc"
    default_pid_mode: str = "private"
    default_ipc_mode: str = "private"
    allow_caps: tuple[str, ...] = DEFAULT_ALLOW_CAPS
    chroot_env: tuple[str, ...] = DEFAULT_CHROOT_ENV
    disable_log_collection: bool = False
    bridge_name: str = DEFAULT_BRIDGE
    bridge_subnet: str = DEFAULT_SUBNET
    no_pivot_root: bool = False

    @classmethod
    def from_decoded(cls, cfg: dict[str, Any]) -> PluginConfig:
        host = host_options(cfg, HOST_DEFAULTS)
        chroot = tuple(cfg.get("chroot_env") or DEFAULT_CHROOT_ENV)
        for path in chroot:
            if not os.path.isabs(path) or os.path.normpath(path) == "/":
                raise ConfigError(
                    f"plugin config chroot_env entry {path!r} must be an absolute host directory other than '/'"
                )
        subnet = cfg.get("bridge_subnet") or DEFAULT_SUBNET
        try:
            net = ipaddress.IPv4Network(subnet)
        except ValueError:
            raise ConfigError(
                f'plugin config bridge_subnet {subnet!r} is not an IPv4 network; use a form such as "{DEFAULT_SUBNET}"'
            ) from None
        if net.num_addresses < 4:
            raise ConfigError(f"plugin config bridge_subnet {subnet!r} is too small; use a /30 or larger network")
        bridge = cfg.get("bridge_name") or DEFAULT_BRIDGE
        if len(bridge) > 15:
            raise ConfigError(f"plugin config bridge_name {bridge!r} is longer than 15 characters; use a shorter name")
        return cls(
            **host,
            runtime_path=cfg.get("runtime_path") or "runc",
            default_pid_mode=_mode(cfg.get("default_pid_mode") or "private", "plugin config default_pid_mode"),
            default_ipc_mode=_mode(cfg.get("default_ipc_mode") or "private", "plugin config default_ipc_mode"),
            allow_caps=tuple(normalize_cap(c) for c in (cfg.get("allow_caps") or DEFAULT_ALLOW_CAPS)),
            chroot_env=tuple(os.path.normpath(p) for p in chroot),
            disable_log_collection=bool(cfg.get("disable_log_collection")),
            bridge_name=bridge,
            bridge_subnet=str(net),
            no_pivot_root=bool(cfg.get("no_pivot_root")),
        )


@dataclass(frozen=True)
class TaskExecConfig:
    command: str
    args: tuple[str, ...] = ()
    work_dir: str = "/"
    pid_mode: str = "private"
    ipc_mode: str = "private"
    capabilities: tuple[str, ...] = ()
    added_capabilities: tuple[str, ...] = ()
    """The capabilities cap_add names (within ``capabilities``): a task user other than root gets
    these, and only these, as ambient capabilities."""

    @classmethod
    def from_decoded(cls, cfg: dict[str, Any], plugin: PluginConfig, *, task: str) -> TaskExecConfig:
        command = cfg.get("command") or ""
        if not command or command != command.strip():
            raise ConfigError(
                f"task {task!r} config: command {command!r} must be a non-empty program path without surrounding spaces"
            )
        work_dir = cfg.get("work_dir") or "/"
        if not work_dir.startswith("/"):
            raise ConfigError(f"task {task!r} config: work_dir {work_dir!r} must be an absolute path inside the task")
        capabilities = task_capabilities(
            cfg.get("cap_add") or (), cfg.get("cap_drop") or (), plugin.allow_caps, task=task
        )
        added = {normalize_cap(c) for c in cfg.get("cap_add") or ()}
        return cls(
            command=command,
            args=tuple(cfg.get("args") or ()),
            work_dir=work_dir,
            pid_mode=_mode(cfg.get("pid_mode") or plugin.default_pid_mode, f"task {task!r} config: pid_mode"),
            ipc_mode=_mode(cfg.get("ipc_mode") or plugin.default_ipc_mode, f"task {task!r} config: ipc_mode"),
            capabilities=capabilities,
            added_capabilities=tuple(c for c in capabilities if c in added or "all" in added),
        )


def task_capabilities(
    cap_add: list[str] | tuple[str, ...], cap_drop: list[str] | tuple[str, ...], allow: tuple[str, ...], *, task: str
) -> tuple[str, ...]:
    """The task's capability set: Nomad's defaults within allow_caps, plus cap_add, minus cap_drop.

    Every cap_add entry must be allowed by the plugin's allow_caps ("all" allows anything).
    """
    allow_all = "all" in allow
    add = [normalize_cap(c) for c in cap_add]
    drop = [normalize_cap(c) for c in cap_drop]
    refused = sorted({c for c in add if c != "all" and not allow_all and c not in allow})
    if "all" in add and not allow_all:
        refused.append("all")
    if refused:
        raise ConfigError(
            f"task {task!r}: driver does not allow the following capabilities: {', '.join(refused)}; "
            "add them to the plugin's allow_caps or remove them from cap_add"
        )
    base = set(DEFAULT_ALLOW_CAPS) if allow_all else set(DEFAULT_ALLOW_CAPS) & set(allow)
    caps = base | set(add)
    if "all" in add:
        caps = set(ALL_CAPS)
    if "all" in drop:
        caps = set()
    caps -= set(drop)
    unknown = sorted(c for c in caps if c not in ALL_CAPS)
    if unknown:
        raise ConfigError(f"task {task!r}: unknown capabilities {', '.join(unknown)}; use names such as 'net_raw'")
    return tuple(sorted(caps))


ALL_CAPS = (
    "audit_control", "audit_read", "audit_write", "block_suspend", "bpf", "checkpoint_restore", "chown",
    "dac_override", "dac_read_search", "fowner", "fsetid", "ipc_lock", "ipc_owner", "kill", "lease",
    "linux_immutable", "mac_admin", "mac_override", "mknod", "net_admin", "net_bind_service", "net_broadcast",
    "net_raw", "perfmon", "setfcap", "setgid", "setpcap", "setuid", "sys_admin", "sys_boot", "sys_chroot",
    "sys_module", "sys_nice", "sys_pacct", "sys_ptrace", "sys_rawio", "sys_resource", "sys_time",
    "sys_tty_config", "syslog", "wake_alarm",
)  # fmt: skip
