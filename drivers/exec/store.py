"""One task as the exec driver tracks it, the versioned state saved to recover it, and the store."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime

from driversdk.errors import ConfigError
from driversdk.exits import ExitSlot
from driversdk.model import ExitResult, TaskConfig
from driversdk.taskkit.cgroups import CGROUP_PARENT, CgroupSample, CounterFiles, TaskCgroup

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
        return f"{self.task_dir}/exit_status"

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


@dataclass
class ExecTask:
    task: TaskConfig
    state: DriverState
    started_at: datetime
    exit: ExitSlot = field(default_factory=ExitSlot)
    """Set once by the process watcher when the supervisor is gone; wait_task and watch_exit wait on it."""
    completed_at: datetime | None = None
    last_sample: CgroupSample | None = None
    counter_files: CounterFiles = field(default_factory=CounterFiles)
    """The cgroup counter files its stats stream reads, open while the task runs."""

    @functools.cached_property
    def cgroup(self) -> TaskCgroup:
        # Made once: a stats sample asks for it every second, and it keeps its paths joined.
        return TaskCgroup(self.state.container_id, self.state.cgroup_v2, self.state.cgroup_parent)

    def finish(self, result: ExitResult, completed_at: datetime) -> None:
        # completed_at first: whoever sees the slot set may read it at once.
        self.completed_at = completed_at
        self.exit.set(result)
