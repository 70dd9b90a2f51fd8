"""The raw_exec task's cgroups: the exec driver's per-task cgroup (limits, OOM counter, usage,
removal; v1 including hybrid, and v2) with the task itself in a leaf below it, and the job's
``cgroup_v1_override`` / ``cgroup_v2_override`` taking the place of ours where given.

The task joins ``<parent>/<id>/task`` (in every v1 hierarchy we manage, or the unified one): the
limits sit on ``<parent>/<id>``, and the leaf keeps v2's no-internal-processes rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from driversdk.errors import ConfigError, DriverError
from driversdk.model import Resources
from driversdk.taskkit.cgroups import RUNC_CHILD, TaskCgroup, cgroup_mounts

V1_CONTROLLERS = ("memory", "cpu", "cpuacct")
LEAF = RUNC_CHILD  # "task": the leaf the process joins, the name exec's OOM check already looks at


@dataclass(frozen=True)
class RawCgroup(TaskCgroup):
    """The task's cgroup; reading (stats, OOM) follows an override for the controllers it names."""

    v1_override: dict[str, str] = field(default_factory=dict)
    v2_override: str = ""

    def _dir(self, controller: str) -> str | None:
        mounts = cgroup_mounts()
        if self.v2 and self.v2_override:
            base = mounts.get("")
            return os.path.join(base, self.v2_override.strip("/")) if base else None
        if not self.v2 and controller in self.v1_override:
            base = mounts.get(controller)
            return os.path.join(base, self.v1_override[controller].strip("/")) if base else None
        return super()._dir(controller)

    @property
    def plain(self) -> TaskCgroup:
        return TaskCgroup(self.container_id, self.v2, self.parent)

    def check_overrides(self, *, task: str) -> None:
        """Refuse an override this host cannot honour, before anything is created."""
        mounts = cgroup_mounts()
        if self.v2_override and not self.v2:
            raise ConfigError(
                f"task {task!r} config: cgroup_v2_override is set but this client runs cgroup v1; "
                "use cgroup_v1_override (a map of controller to path)"
            )
        if self.v1_override and self.v2:
            raise ConfigError(
                f"task {task!r} config: cgroup_v1_override is set but this client runs cgroup v2; "
                "use cgroup_v2_override (a path below the unified hierarchy)"
            )
        wanted = (
            [("unified", "", self.v2_override)]
            if self.v2_override
            else [(c, c, p) for c, p in self.v1_override.items()]
        )
        for name, key, path in wanted:
            base = mounts.get(key)
            if base is None:
                raise ConfigError(
                    f"task {task!r} config: cgroup override for {name!r}: no such cgroup controller is mounted "
                    "on this client"
                )
            full = os.path.join(base, path.strip("/"))
            if not os.path.isfile(os.path.join(full, "cgroup.procs")):
                raise ConfigError(
                    f"task {task!r} config: cgroup override {name} = {path!r}: {full!r} is not an existing "
                    "cgroup; create it first (the driver never creates or removes an override cgroup)"
                )

    def create(self, resources: Resources) -> None:
        """Our cgroup with the task's limits, and the leaf the task joins."""
        self.plain.create(resources)
        try:
            for path in self._own_leaves():
                os.makedirs(path, exist_ok=True)
        except OSError as err:
            self.plain.remove()
            raise DriverError(
                f"failed to create cgroup {self.relative}/{LEAF}: {err.strerror}; check that the cgroup "
                "hierarchies are mounted read-write and the plugin runs as root",
                recoverable=True,
            ) from None

    def _own_leaves(self) -> list[str]:
        mounts = cgroup_mounts()
        if self.v2:
            if self.v2_override:
                return []
            return [os.path.join(mounts[""], self.relative, LEAF)] if "" in mounts else []
        return [
            os.path.join(mounts[c], self.relative, LEAF)
            for c in V1_CONTROLLERS
            if c in mounts and c not in self.v1_override
        ]

    def procs_files(self) -> list[str]:
        """The cgroup.procs files the task writes itself into: our leaves, then the overrides."""
        mounts = cgroup_mounts()
        files = [os.path.join(p, "cgroup.procs") for p in self._own_leaves()]
        if self.v2 and self.v2_override:
            files.append(os.path.join(mounts[""], self.v2_override.strip("/"), "cgroup.procs"))
        elif not self.v2:
            for controller, path in sorted(self.v1_override.items()):
                files.append(os.path.join(mounts[controller], path.strip("/"), "cgroup.procs"))
        # One file per hierarchy: co-mounted controllers (cpu,cpuacct) share a directory.
        return sorted(set(files), key=files.index)
