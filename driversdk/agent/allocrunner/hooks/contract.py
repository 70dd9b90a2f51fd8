"""What a hook is given and what it gives back, per phase (Nomad's ``client/allocrunner/interfaces``).

A hook never sees a runner. Each phase gets a frozen request: the allocation (or task) it serves,
what earlier hooks of the list produced so far (the runner applied their responses in order), the
record of a killed run when it is being recovered, and the services it may call, named one by
one. A phase that produces something returns a typed response; the runner applies it before the
next hook's request is built (env merged in list order, mounts and ports replaced, failures
counted). What a hook made and must undo later (a supervisor, a CSI claim, a network) is the
hook's own state, kept on the hook between its phases.

Events are reported while a phase runs, through the request's ``event`` (so they keep their order
among the hook's own steps); writes to the run state go through the request's ``state`` with the
allocation's id: both are services, not runner fields.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from driversdk.agent.csi.pluginsupervisor import PluginSupervisor
from driversdk.agent.csi.registry import PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.agent.csi.volumes import VolumeStore
from driversdk.agent.events import Emit
from driversdk.agent.logmon.tasklogs import Logmon
from driversdk.agent.pluginmanager.drivermanager import DriverManager
from driversdk.agent.state.runstate import AllocRecord, RunState, TaskRecord
from driversdk.jobspec.clientconfig import ClientConfig
from driversdk.jobspec.job import Group, Job, Task
from driversdk.jobspec.taskenv import Node, PortValue, TaskEnv
from driversdk.model import Capabilities, NetworkIsolationSpec
from driversdk.mounts import Mount, MountRequest


class AllocEventSink(Protocol):
    """An event of the allocation (job, group and alloc id filled in by the runner)."""

    def __call__(self, kind: str, message: str, *, task: str = "", name: str = "", type: str = "") -> None: ...


class TaskEventSink(Protocol):
    """An event of the task, kept for ``driversdk status`` and shown (fields: :class:`RunEvent`'s)."""

    def __call__(self, message: str, kind: str = "task", *, type: str = "", **fields: Any) -> None: ...


@dataclass(frozen=True)
class AllocServices:
    """The run's shared services an allocation's hooks may call, passed explicitly."""

    state: RunState  # the run's records (state.db)
    drivers: DriverManager  # dispenses each driver's plugin
    volumes: VolumeStore  # registered CSI volumes
    csi_state: StateStore  # CSI claims and plugin records
    registry: PluginRegistry  # live CSI plugins
    plugin_failure: Callable[[str], str | None]  # why every instance of a plugin this run started failed
    node: Callable[[], Node]  # this node as taskenv sees it (fingerprints the group's drivers once per run)
    emit: Emit  # a run event as it is
    event: AllocEventSink  # an event of this allocation


@dataclass(frozen=True)
class AllocInfo:
    """Which allocation: its id, job, group, index and dirs, and the client's config."""

    alloc_id: str
    index: int
    job: Job
    group: Group
    alloc_dir: str
    client: ClientConfig
    services: AllocServices


# --- alloc hooks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocPrerunRequest:
    alloc: AllocInfo
    restoring: AllocRecord | None  # the killed run's record: take over what it made
    ports: tuple[PortValue, ...] = ()  # the group's ports, once the ports hook gave them
    network: NetworkIsolationSpec | None = None  # the group network, once the network hook made it


@dataclass(frozen=True)
class AllocPrerunResponse:
    """What an alloc hook's prerun hands the runner; None: unchanged."""

    ports: tuple[PortValue, ...] | None = None
    network: NetworkIsolationSpec | None = None
    csi_sources: Mapping[str, str] | None = None  # CSI volume name -> the host path its tasks mount


@dataclass(frozen=True)
class AllocStopRequest:
    alloc: AllocInfo


@dataclass(frozen=True)
class AllocPostrunRequest:
    alloc: AllocInfo
    ports: tuple[PortValue, ...] = ()


@dataclass(frozen=True)
class AllocPostrunResponse:
    teardown_failed: bool = False  # something could not be undone: the allocation ends failed


@dataclass(frozen=True)
class AllocDestroyRequest:
    alloc: AllocInfo


@dataclass(frozen=True)
class AllocUpdateRequest:
    alloc: AllocInfo


# --- task hooks ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskInfo:
    """Which task of which allocation, what its driver can do, and where its events go."""

    alloc: AllocInfo
    task: Task
    caps: Capabilities
    event: TaskEventSink


@dataclass(frozen=True)
class TaskPrerunRequest:
    task: TaskInfo
    restoring: TaskRecord | None  # the killed run's record: the task is recovered, not started
    ports: tuple[PortValue, ...] = ()  # the allocation's
    csi_sources: Mapping[str, str] = field(default_factory=dict)  # the allocation's published CSI volumes
    env: Mapping[str, str] = field(default_factory=dict)  # the environment earlier hooks built
    node_facts: Mapping[str, str] = field(default_factory=dict)  # ${attr.*}, ${node.*}, ${meta.*}
    mount_requests: tuple[MountRequest, ...] = ()  # mounts earlier hooks asked for

    def interpolate(self, value: Any) -> Any:
        """``${…}`` in a string (or in the strings of a config) replaced as Nomad's client does."""
        return TaskEnv(dict(self.env), dict(self.node_facts)).interpolate(value)


@dataclass(frozen=True)
class TaskPrerunResponse:
    """What a task hook's prerun hands the runner: env merged over what came before, the rest
    added (mount requests, template env) or set (mounts, logmon, node facts) when given."""

    env: Mapping[str, str] = field(default_factory=dict)
    node_facts: Mapping[str, str] | None = None
    mount_requests: tuple[MountRequest, ...] = ()
    mounts: tuple[Mount, ...] | None = None  # the driver mounts StartTask gets
    logmon: Logmon | None = None  # the log collector serving the task's fifos
    template_env: Mapping[str, str] = field(default_factory=dict)  # env = true templates, over the task's env


@dataclass(frozen=True)
class TaskPoststartRequest:
    task: TaskInfo
    logmon: Logmon | None
    fail: Callable[[str], None]  # the task failed (a hook's verdict): stop it
    done: threading.Event  # set once the task is over


@dataclass(frozen=True)
class TaskPoststartResponse:
    csi_supervisor: PluginSupervisor | None = None  # a plugin supervisor the run's volumes may wait on


@dataclass(frozen=True)
class TaskStopRequest:
    task: TaskInfo


@dataclass(frozen=True)
class TaskPostrunRequest:
    task: TaskInfo
    logmon: Logmon | None


@dataclass(frozen=True)
class TaskDestroyRequest:
    task: TaskInfo


@dataclass(frozen=True)
class TaskUpdateRequest:
    task: TaskInfo
