"""The plugin options every kit driver running tasks as root on the host shares: where task
state and cgroups live, which host ids a task may not run as, and the ``reconcile`` block.

A driver's ``PluginConfig`` extends :class:`HostPluginConfig` (re-declaring a field to change
its default) and its schema takes :func:`host_options_spec`'s entries, so both drivers read,
check and refuse these options with the same words.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from driversdk import hclspec as hs
from driversdk.errors import ConfigError
from driversdk.taskkit.ids import IdRanges
from driversdk.taskkit.reconcilecfg import ReconcileConfig, reconcile_spec


@dataclass(frozen=True)
class HostDefaults:
    """A driver's defaults for the shared options."""

    state_dir: str
    cgroup_parent: str
    denied_ids: str | None = None
    """denied_host_uids and denied_host_gids when not set; None: no default, nothing denied."""


def host_options_spec(defaults: HostDefaults) -> dict[str, hs.Spec]:
    def ids() -> hs.Spec:
        # A default, not a missing value: "" (deny nothing) must reach the plugin as written.
        if defaults.denied_ids is None:
            return hs.attr("string")
        return hs.default(hs.attr("string"), hs.literal(f'"{defaults.denied_ids}"'))

    return {
        "denied_host_uids": ids(),
        "denied_host_gids": ids(),
        "state_dir": hs.default(hs.attr("string"), hs.literal(f'"{defaults.state_dir}"')),
        "cgroup_parent": hs.default(hs.attr("string"), hs.literal(f'"{defaults.cgroup_parent}"')),
        "reconcile": reconcile_spec(),
    }


@dataclass(frozen=True)
class HostPluginConfig:
    state_dir: str
    cgroup_parent: str
    denied_uids: IdRanges = field(default_factory=lambda: IdRanges("", ()))
    denied_gids: IdRanges = field(default_factory=lambda: IdRanges("", ()))
    reconcile_enabled: bool = True
    reconcile_period: float = 300.0
    reconcile_creation_grace: float = 300.0

    @property
    def reconcile(self) -> ReconcileConfig:
        return ReconcileConfig(self.reconcile_enabled, self.reconcile_period, self.reconcile_creation_grace)


def host_options(cfg: dict[str, Any], defaults: HostDefaults) -> dict[str, Any]:
    """The shared options of a decoded plugin config, checked: HostPluginConfig's fields."""
    state_dir = cfg.get("state_dir") or defaults.state_dir
    if not os.path.isabs(state_dir):
        raise ConfigError(f"plugin config state_dir {state_dir!r} must be an absolute path")
    parent = (cfg.get("cgroup_parent") or defaults.cgroup_parent).strip("/")
    if not parent or ".." in parent.split("/"):
        raise ConfigError(
            f"plugin config cgroup_parent {cfg.get('cgroup_parent')!r} must name a cgroup below the root, "
            f'such as "{defaults.cgroup_parent}"'
        )

    def ids(name: str) -> IdRanges:
        value = cfg.get(name)  # the option as written ("" included); the default only when missing
        return IdRanges.parse(defaults.denied_ids if value is None else str(value), name)

    reconcile = ReconcileConfig.from_decoded(cfg.get("reconcile"))
    return {
        "state_dir": state_dir,
        "cgroup_parent": parent,
        "denied_uids": ids("denied_host_uids"),
        "denied_gids": ids("denied_host_gids"),
        "reconcile_enabled": reconcile.enabled,
        "reconcile_period": reconcile.period,
        "reconcile_creation_grace": reconcile.creation_grace,
    }
