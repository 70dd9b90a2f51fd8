"""The versioned state that recovers a raw_exec task (TaskHandle.driver_state)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from drivers.raw_exec.cgroups import RawCgroup
from driversdk.taskkit.fields import decode_state, encode_state
from driversdk.taskkit.shared import SharedRunState
from driversdk.taskkit.supervisor import SPEC_FILE, STATUS_FILE

# Version of the driver_state layout below; bump it and keep reading older ones.
STATE_VERSION = 1


@dataclass(frozen=True)
class RawState(SharedRunState):
    """Everything a relaunched plugin needs to find the task again (TaskHandle.driver_state)."""

    task_key: str
    """The task's name on this host: its cgroup and state dir are named after it."""
    state_dir: str
    """``<plugin state_dir>/tasks/<task_key>``: the launch spec and the supervisor's status file."""
    task_pid: int = field(kw_only=True)
    """The task's main process, also its process group id, which stop signals go to: required, as
    0 would signal the plugin's own process group."""
    started_at: float
    cgroup_v2: bool
    cgroup_parent: str
    cgroup_v1_override: dict[str, str] = field(default_factory=dict)
    cgroup_v2_override: str = ""

    @property
    def status_file(self) -> str:
        return os.path.join(self.state_dir, STATUS_FILE)

    @property
    def spec_file(self) -> str:
        return os.path.join(self.state_dir, SPEC_FILE)

    @property
    def cgroup(self) -> RawCgroup:
        return RawCgroup(
            self.task_key, self.cgroup_v2, self.cgroup_parent, dict(self.cgroup_v1_override), self.cgroup_v2_override
        )

    def encode(self) -> bytes:
        return encode_state(self, STATE_VERSION)

    @classmethod
    def decode(cls, data: bytes, version: int) -> RawState:
        return decode_state(cls, data, version, expected=STATE_VERSION, driver="raw_exec")
