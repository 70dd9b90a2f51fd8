"""One task as the exec driver tracks it, the versioned state saved to recover it, and the store."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from driversdk.errors import ConfigError
from driversdk.taskkit.cgroups import CGROUP_PARENT
from driversdk.taskkit.supervisor import SPEC_FILE, STATUS_FILE

# Version of the driver_state layout below; bump it and keep reading older ones.
STATE_VERSION = 1


@dataclass(frozen=True)
class DriverState:
    """Everything a relaunched plugin needs to find the task again (TaskHandle.driver_state)."""

    container_id: str
    task_dir: str
    """The task's state dir: bundle (config.json, rootfs) and the supervisor's status file."""
    supervisor_pid: int
    cgroup_v2: bool
    started_at: float
    runc_path: str
    runc_root: str = ""
    host_pid_mode: bool = False
    cgroup_parent: str = CGROUP_PARENT

    @property
    def status_file(self) -> str:
        return os.path.join(self.task_dir, STATUS_FILE)

    @property
    def spec_file(self) -> str:
        """The supervisor's launch spec (absent for a task started before the kit's supervisor)."""
        return os.path.join(self.task_dir, SPEC_FILE)

    def encode(self) -> bytes:
        return json.dumps({"version": STATE_VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, version: int) -> DriverState:
        try:
            raw = json.loads(data)
            if version != STATE_VERSION or raw.get("version") != STATE_VERSION:
                raise ValueError(f"unknown state version {raw.get('version')} (handle version {version})")
            return cls(
                container_id=str(raw["container_id"]),
                task_dir=str(raw["task_dir"]),
                supervisor_pid=int(raw["supervisor_pid"]),
                cgroup_v2=bool(raw["cgroup_v2"]),
                started_at=float(raw["started_at"]),
                runc_path=str(raw["runc_path"]),
                runc_root=str(raw.get("runc_root", "")),
                host_pid_mode=bool(raw.get("host_pid_mode", False)),
                cgroup_parent=str(raw.get("cgroup_parent", CGROUP_PARENT)),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"failed to decode the exec driver's task state: {err}") from None
