"""One raw_exec task as the driver tracks it, the versioned state that recovers it, and the store."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from drivers.raw_exec.cgroups import RawCgroup
from driversdk.errors import ConfigError

# Version of the driver_state layout below; bump it and keep reading older ones.
STATE_VERSION = 1


@dataclass(frozen=True)
class RawState:
    """Everything a relaunched plugin needs to find the task again (TaskHandle.driver_state)."""

    task_key: str
    """The task's name on this host: its cgroup and state dir are named after it."""
    state_dir: str
    """``<plugin state_dir>/tasks/<task_key>``: the launch spec and the supervisor's status file."""
    supervisor_pid: int
    task_pid: int
    """The task's main process, also its process group id."""
    started_at: float
    cgroup_v2: bool
    cgroup_parent: str
    cgroup_v1_override: dict[str, str] = field(default_factory=dict)
    cgroup_v2_override: str = ""

    @property
    def status_file(self) -> str:
        return os.path.join(self.state_dir, "exit_status")

    @property
    def spec_file(self) -> str:
        return os.path.join(self.state_dir, "launch.json")

    @property
    def cgroup(self) -> RawCgroup:
        return RawCgroup(
            self.task_key, self.cgroup_v2, self.cgroup_parent, dict(self.cgroup_v1_override), self.cgroup_v2_override
        )

    def encode(self) -> bytes:
        return json.dumps({"version": STATE_VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, version: int) -> RawState:
        try:
            raw = json.loads(data)
            if version != STATE_VERSION or raw.get("version") != STATE_VERSION:
                raise ValueError(f"unknown state version {raw.get('version')} (handle version {version})")
            return cls(
                task_key=str(raw["task_key"]),
                state_dir=str(raw["state_dir"]),
                supervisor_pid=int(raw["supervisor_pid"]),
                task_pid=int(raw["task_pid"]),
                started_at=float(raw["started_at"]),
                cgroup_v2=bool(raw["cgroup_v2"]),
                cgroup_parent=str(raw["cgroup_parent"]),
                cgroup_v1_override={str(k): str(v) for k, v in (raw.get("cgroup_v1_override") or {}).items()},
                cgroup_v2_override=str(raw.get("cgroup_v2_override") or ""),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"failed to decode the raw_exec driver's task state: {err}") from None
