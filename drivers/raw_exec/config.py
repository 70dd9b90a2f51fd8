"""The raw_exec driver's plugin and task config: Nomad's schemas, plus two driversdk additions
(``state_dir``, ``cgroup_parent``) for where task state and cgroups live."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from driversdk import hclspec as hs
from driversdk.errors import ConfigError
from driversdk.taskkit.hostcfg import HostDefaults, HostPluginConfig, host_options, host_options_spec

DEFAULT_STATE_DIR = "/var/lib/driversdk-raw-exec"
DEFAULT_CGROUP_PARENT = "driversdk-raw-exec"
# As Nomad's raw_exec: no host id is denied unless the operator names it.
HOST_DEFAULTS = HostDefaults(DEFAULT_STATE_DIR, DEFAULT_CGROUP_PARENT)
# Linux accepts -1000..1000; Nomad's raw_exec refuses negative values (lowering a score needs
# CAP_SYS_RESOURCE and would shield the task from the OOM killer).
MAX_OOM_SCORE_ADJ = 1000


def plugin_spec() -> hs.Spec:
    return hs.obj(
        {
            "enabled": hs.default(hs.attr("bool"), hs.literal("false")),
            "denied_envvars": hs.attr("list(string)"),
            **host_options_spec(HOST_DEFAULTS),
        }
    )


def task_spec() -> hs.Spec:
    return hs.obj(
        {
            "command": hs.attr("string", required=True),
            "args": hs.attr("list(string)"),
            "work_dir": hs.attr("string"),
            "oom_score_adj": hs.attr("number"),
            "cgroup_v1_override": hs.attr("map(string)"),
            "cgroup_v2_override": hs.attr("string"),
            "denied_envvars": hs.attr("list(string)"),
        }
    )


def glob_match(pattern: str, name: str) -> bool:
    """Nomad's denied_envvars matching (go-glob): ``*`` matches any run of characters, nothing else is special."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, name, re.DOTALL) is not None


@dataclass(frozen=True)
class PluginConfig(HostPluginConfig):
    state_dir: str = DEFAULT_STATE_DIR
    cgroup_parent: str = DEFAULT_CGROUP_PARENT
    enabled: bool = False
    denied_envvars: tuple[str, ...] = ()

    @classmethod
    def from_decoded(cls, cfg: dict[str, Any]) -> PluginConfig:
        return cls(
            **host_options(cfg, HOST_DEFAULTS),
            enabled=bool(cfg.get("enabled")),
            denied_envvars=tuple(cfg.get("denied_envvars") or ()),
        )


@dataclass(frozen=True)
class TaskRawConfig:
    command: str
    args: tuple[str, ...] = ()
    work_dir: str = ""
    oom_score_adj: int = 0
    cgroup_v1_override: dict[str, str] = field(default_factory=dict)
    cgroup_v2_override: str = ""
    denied_envvars: tuple[str, ...] = ()

    @classmethod
    def from_decoded(cls, cfg: dict[str, Any], *, task: str) -> TaskRawConfig:
        where = f"task {task!r} config"
        command = cfg.get("command") or ""
        if not command or command != command.strip():
            raise ConfigError(f"{where}: command {command!r} must be a non-empty program without surrounding spaces")
        work_dir = cfg.get("work_dir") or ""
        if work_dir and not os.path.isabs(work_dir):
            raise ConfigError(f"{where}: work_dir {work_dir!r} must be an absolute path on the host")
        raw_adj = cfg.get("oom_score_adj")
        adj = 0 if raw_adj is None else raw_adj
        if isinstance(adj, float) and adj.is_integer():
            adj = int(adj)
        if not isinstance(adj, int) or isinstance(adj, bool):
            raise ConfigError(
                f"{where}: oom_score_adj {raw_adj!r} must be a whole number from 0 to {MAX_OOM_SCORE_ADJ}"
            )
        if adj < 0:
            raise ConfigError(
                f"{where}: oom_score_adj {adj} must not be negative (a negative score would shield the task "
                "from the OOM killer); use 0 to 1000"
            )
        if adj > MAX_OOM_SCORE_ADJ:
            raise ConfigError(f"{where}: oom_score_adj {adj} is above the kernel's maximum of {MAX_OOM_SCORE_ADJ}")
        v1 = {str(k): str(v) for k, v in (cfg.get("cgroup_v1_override") or {}).items()}
        v2 = cfg.get("cgroup_v2_override") or ""
        if v1 and v2:
            raise ConfigError(f"{where}: only one of cgroup_v1_override and cgroup_v2_override may be set")
        for controller, path in [*v1.items(), *([("unified", v2)] if v2 else [])]:
            if not path or ".." in path.split("/") or not re.fullmatch(r"[\w.,:@/-]+", path):
                raise ConfigError(
                    f"{where}: the {controller} cgroup override {path!r} must be a cgroup path such as "
                    '"custom/group" (no "..")'
                )
        return cls(
            command=command,
            args=tuple(cfg.get("args") or ()),
            work_dir=work_dir,
            oom_score_adj=adj,
            cgroup_v1_override=v1,
            cgroup_v2_override=v2,
            denied_envvars=tuple(cfg.get("denied_envvars") or ()),
        )


def task_env(env: dict[str, str], plugin_denied: tuple[str, ...], task_denied: tuple[str, ...]) -> dict[str, str]:
    """The task's environment less every variable a denied_envvars glob (plugin's or task's) matches."""
    denied = (*plugin_denied, *task_denied)
    return {k: v for k, v in env.items() if not any(glob_match(p, k) for p in denied)}
