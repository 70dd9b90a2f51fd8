"""The versioned state that recovers an exec task (TaskHandle.driver_state)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from driversdk.taskkit.cgroups import CGROUP_PARENT
from driversdk.taskkit.fields import decode_state, encode_state
from driversdk.taskkit.shared import SharedRunState
from driversdk.taskkit.supervisor import SPEC_FILE, STATUS_FILE

# Version of the driver_state layout below; bump it and keep reading older ones.
STATE_VERSION = 1


@dataclass(frozen=True)
class DriverState(SharedRunState):
    """Everything a relaunched plugin needs to find the task again (TaskHandle.driver_state).

    ``task_pid`` (from SharedRunState) is the container's init on the host; a state without it
    (0) names a task under a supervisor of its own, followed by ``supervisor_pid``."""

    container_id: str
    task_dir: str
    """The task's state dir: bundle (config.json, rootfs), launch spec, pid file and status file."""
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
        """The supervisor's launch spec; absent when the supervisor is the ``/bin/sh`` running
        ``runc run`` (see driver.is_supervisor), which has none."""
        return os.path.join(self.task_dir, SPEC_FILE)

    def encode(self) -> bytes:
        return encode_state(self, STATE_VERSION)

    @classmethod
    def decode(cls, data: bytes, version: int) -> DriverState:
        return decode_state(cls, data, version, expected=STATE_VERSION, driver="exec")
