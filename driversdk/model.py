"""The driver data model: plain dataclasses and enums, independent of protobuf.

Enum values are the wire values of Nomad's driver protocol so conversion is a cast; the
conversion itself lives in :mod:`driversdk.convert` and nowhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from driversdk.plugin.handshake import DRIVER_API_VERSION as DRIVER_API_VERSION  # part of the model's API

if TYPE_CHECKING:
    # An annotation here; the mount rules (and /proc/self/mountinfo parsing) load with their first use.
    from driversdk.mounts import Mount

# Go's zero time, which Nomad's client expects for "not completed yet".
GO_ZERO_TIME_SECONDS = -62135596800


class HealthState(IntEnum):
    UNDETECTED = 0
    UNHEALTHY = 1
    HEALTHY = 2


class FSIsolation(IntEnum):
    NONE = 0
    CHROOT = 1
    IMAGE = 2
    UNVEIL = 3


class MountConfigSupport(IntEnum):
    """Whether the driver accepts host and CSI volume mounts. ALL is the wire zero value."""

    ALL = 0
    NONE = 1


class NetworkIsolationMode(IntEnum):
    HOST = 0
    GROUP = 1
    TASK = 2
    NONE = 3


class TaskState(IntEnum):
    UNKNOWN = 0
    RUNNING = 1
    EXITED = 2


class CpuField(IntEnum):
    SYSTEM_MODE = 0
    USER_MODE = 1
    TOTAL_TICKS = 2
    THROTTLED_PERIODS = 3
    THROTTLED_TIME = 4
    PERCENT = 5


class MemoryField(IntEnum):
    RSS = 0
    CACHE = 1
    MAX_USAGE = 2
    KERNEL_USAGE = 3
    KERNEL_MAX_USAGE = 4
    USAGE = 5
    SWAP = 6


@dataclass(frozen=True)
class Capabilities:
    """What the driver can do; the host checks a job against it before starting a task."""

    send_signals: bool = False
    exec: bool = False
    fs_isolation: FSIsolation = FSIsolation.NONE
    # Nomad rejects bridge-mode tasks when this is empty, so HOST is listed explicitly.
    network_isolation_modes: tuple[NetworkIsolationMode, ...] = (NetworkIsolationMode.HOST,)
    must_create_network: bool = False
    # NONE unless the driver says it mounts: a claim it did not make cannot be a lie.
    mount_configs: MountConfigSupport = MountConfigSupport.NONE
    disable_log_collection: bool = False
    dynamic_workload_users: bool = False


AttributeValue = str | int | float | bool


@dataclass(frozen=True)
class Attribute:
    """A node attribute value with an optional unit (``MiB``, ``MHz``)."""

    value: AttributeValue
    unit: str = ""

    @classmethod
    def of(cls, value: Attribute | AttributeValue) -> Attribute:
        """``value`` as the wire carries it: an Attribute whose value is a bool, a whole or a real
        number, or else its text (a fingerprint may give plain values, or values of other types)."""
        attr = value if isinstance(value, Attribute) else cls(value)
        if isinstance(attr.value, bool | int | float | str):
            return attr
        return cls(str(attr.value), attr.unit)


@dataclass(frozen=True)
class Fingerprint:
    """One reading of the driver's health and the node attributes it contributes."""

    health: HealthState
    health_description: str
    attributes: dict[str, Attribute | AttributeValue] = field(default_factory=dict)
    err: str = ""


@dataclass(frozen=True)
class AgentConfig:
    """The part of the Nomad agent's config that SetConfig carries (absent when validating)."""

    client_min_port: int = 0
    client_max_port: int = 0


@dataclass(frozen=True)
class Device:
    """A host device made available inside the task."""

    task_path: str
    host_path: str
    cgroup_permissions: str = "rwm"


@dataclass(frozen=True)
class PortMapping:
    """A reserved port: its label, the host port, and the port inside the task."""

    label: str
    value: int
    to: int = 0
    host_ip: str = ""


@dataclass(frozen=True)
class LinuxResources:
    """The Linux view of a task's limits (cgroup values computed by the host)."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_cgroup: str = ""
    percent_ticks: float = 0.0


@dataclass(frozen=True)
class Resources:
    """What the scheduler reserved for the task."""

    cpu_shares: int = 0
    """Allocated CPU in MHz."""
    memory_mb: int = 0
    memory_max_mb: int = 0
    linux: LinuxResources = field(default_factory=LinuxResources)
    ports: tuple[PortMapping, ...] = ()


@dataclass(frozen=True)
class HostsConfig:
    """The hostname and address the task's /etc/hosts should name."""

    hostname: str = ""
    address: str = ""


@dataclass(frozen=True)
class NetworkIsolationSpec:
    """The network namespace a task joins (group mode) or the host network."""

    mode: NetworkIsolationMode = NetworkIsolationMode.HOST
    path: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    hosts: HostsConfig | None = None


@dataclass(frozen=True)
class DNSConfig:
    """The task's resolv.conf: nameservers, search domains, options."""

    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass
class TaskConfig:
    """Everything a driver is told about one start of one task."""

    id: str
    name: str
    alloc_id: str = ""
    job_name: str = ""
    job_id: str = ""
    task_group_name: str = ""
    namespace: str = "default"
    node_name: str = ""
    node_id: str = ""
    env: dict[str, str] = field(default_factory=dict)
    device_env: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    user: str = ""
    alloc_dir: str = ""
    stdout_path: str = ""
    stderr_path: str = ""
    network_isolation_spec: NetworkIsolationSpec | None = None
    dns: DNSConfig | None = None
    msgpack_driver_config: bytes = b""
    """The task ``config {}`` block, msgpack-encoded as Nomad sends it."""
    driver_config: dict[str, Any] = field(default_factory=dict)
    """``msgpack_driver_config`` decoded and validated against the driver's task schema.

    Filled in by the SDK before start_task / recover_task are called. After a Nomad agent
    restart the raw bytes are gone (Nomad does not persist them), so recovery must rely on
    ``TaskHandle.driver_state`` instead.
    """

    @property
    def task_dir(self) -> str:
        return os.path.join(self.alloc_dir, self.name)

    @property
    def shared_alloc_dir(self) -> str:
        """``<alloc_dir>/alloc``: shared by every task of the allocation, mounted at /alloc."""
        return os.path.join(self.alloc_dir, "alloc")

    @property
    def local_dir(self) -> str:
        return os.path.join(self.task_dir, "local")

    @property
    def secrets_dir(self) -> str:
        return os.path.join(self.task_dir, "secrets")


@dataclass(frozen=True)
class NetworkOverride:
    """The address and port map a driver-created network gives the task."""

    port_map: dict[str, int] = field(default_factory=dict)
    addr: str = ""
    auto_advertise: bool = False


@dataclass
class TaskHandle:
    """What the host persists so a restarted plugin can recover the task.

    ``version`` versions ``driver_state``; 0 is reserved by Nomad and never used.
    """

    config: TaskConfig
    driver_state: bytes = b""
    version: int = 1
    state: TaskState = TaskState.UNKNOWN
    network_override: NetworkOverride | None = None
    """Sent beside the handle in StartTask's answer; not part of the persisted handle."""


@dataclass(frozen=True)
class ExitResult:
    """How a task ended: exit code, killing signal, OOM kill."""

    exit_code: int = 0
    signal: int = 0
    oom_killed: bool = False

    @property
    def successful(self) -> bool:
        return self.exit_code == 0 and self.signal == 0


@dataclass(frozen=True)
class TaskStatus:
    """What InspectTask reports about one task."""

    id: str
    name: str
    state: TaskState
    started_at: datetime | None = None
    completed_at: datetime | None = None
    result: ExitResult | None = None
    driver_attributes: dict[str, str] = field(default_factory=dict)
    network_override: NetworkOverride | None = None


@dataclass(frozen=True)
class CpuUsage:
    """CPU usage of a task; ``measured_fields`` says which values are real."""

    system_mode: float = 0.0
    user_mode: float = 0.0
    total_ticks: float = 0.0
    throttled_periods: int = 0
    throttled_time: int = 0
    percent: float = 0.0
    measured_fields: tuple[CpuField, ...] = ()


@dataclass(frozen=True)
class MemoryUsage:
    """Memory usage of a task, in bytes; ``measured_fields`` says which values are real."""

    rss: int = 0
    cache: int = 0
    max_usage: int = 0
    kernel_usage: int = 0
    kernel_max_usage: int = 0
    usage: int = 0
    swap: int = 0
    measured_fields: tuple[MemoryField, ...] = ()


@dataclass(frozen=True)
class ResourceUsage:
    """CPU and memory usage, for a task or one of its processes."""

    cpu: CpuUsage = field(default_factory=CpuUsage)
    memory: MemoryUsage = field(default_factory=MemoryUsage)


@dataclass(frozen=True)
class TaskStats:
    """One resource-usage sample of a task (TaskStats stream)."""

    timestamp: datetime
    usage: ResourceUsage
    by_pid: dict[str, ResourceUsage] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class TaskEvent:
    """A message about a task for the host's event log (TaskEvents stream)."""

    task_id: str
    alloc_id: str
    task_name: str
    message: str
    timestamp: datetime
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecResult:
    """The output and exit of a command run in a task (ExecTask)."""

    stdout: bytes
    stderr: bytes
    result: ExitResult


def __getattr__(name: str) -> type[Mount]:
    # Mount is part of the model (TaskConfig.mounts holds them); its module, with the mountinfo
    # parser, loads on first use.
    if name == "Mount":
        from driversdk.mounts import Mount

        return Mount
    raise AttributeError(f"module 'driversdk.model' has no attribute {name!r}")
