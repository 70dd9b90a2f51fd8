"""The alloc runner: one allocation (a group at one index) through its hooks and task runners.

It sequences :data:`ALLOC_HOOKS` (prerun in order before the tasks start, postrun in reverse
after they are gone), runs a :class:`TaskRunner` per task, records the allocation in the run
state and reports events. A recovered allocation (``restoring``) goes through the same hooks,
which take over what the killed run made instead of making it again.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from driversdk.agent import nodeattrs
from driversdk.agent.allocrunner.hooks import AllocHook
from driversdk.agent.allocrunner.hooks.alloc_dir import AllocDirHook
from driversdk.agent.allocrunner.hooks.contract import (
    AllocDestroyRequest,
    AllocInfo,
    AllocPostrunRequest,
    AllocPrerunRequest,
    AllocPrerunResponse,
    AllocServices,
    AllocStopRequest,
)
from driversdk.agent.allocrunner.hooks.csi_plugin import CSIPluginDirHook
from driversdk.agent.allocrunner.hooks.csi_volumes import CSIVolumesHook
from driversdk.agent.allocrunner.hooks.network import NetworkHook
from driversdk.agent.allocrunner.hooks.port_forward import PortForwardHook
from driversdk.agent.allocrunner.hooks.ports import PortsHook
from driversdk.agent.allocrunner.lifecycle import Coordinator, has_hooks
from driversdk.agent.allocrunner.taskrunner import TaskRunner, end_left_by_killed_run
from driversdk.agent.csi.pluginsupervisor import PluginSupervisor
from driversdk.agent.csi.registry import PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.agent.csi.volumes import VolumeStore
from driversdk.agent.events import Emit, EventType, RunEvent
from driversdk.agent.pluginmanager.drivermanager import DriverManager
from driversdk.agent.state.runstate import AllocRecord, RunState
from driversdk.agent.state.store import Store, store_of
from driversdk.errors import DriverSDKError, StateWriteError
from driversdk.jobspec import restarts
from driversdk.jobspec.clientconfig import ClientConfig
from driversdk.jobspec.job import Group, Job
from driversdk.jobspec.taskenv import Node, PortValue
from driversdk.model import NetworkIsolationSpec, TaskEvent
from driversdk.paths import resolve_under

# The order of start; teardown runs it backwards. A new hook is a new file and a line here.
ALLOC_HOOKS: list[Callable[[], AllocHook]] = [
    AllocDirHook,  # alloc/{logs,tmp,data}
    CSIPluginDirHook,  # postrun: release the shared mount plugin tasks needed (after the volumes)
    PortsHook,  # group network ports: static checked free, dynamic from the client's range
    NetworkHook,  # group network from the first driver that creates one
    PortForwardHook,  # bridge mode: host ports forwarded into the group namespace (iptables)
    CSIVolumesHook,  # claim, controller publish, stage, publish
]


@dataclass
class NodeServices:
    """What every allocation of a run shares: the state stores, the CSI plugin registry and the
    driver manager."""

    state: RunState
    volumes: VolumeStore
    csi_state: StateStore
    registry: PluginRegistry
    drivers: DriverManager | None = None
    # Supervisors of this run's plugin tasks: a volume waiting for one of them stops waiting when it failed.
    supervisors: list[PluginSupervisor] = field(default_factory=list)
    # driver.<name>.* attributes of each driver's plugin, fingerprinted once per run (nodeattrs).
    driver_attributes: dict[str, dict[str, str]] = field(default_factory=dict)
    # Set when the run is told to stop (Ctrl-C): a task waiting out a restart delay gives up.
    stopping: threading.Event = field(default_factory=threading.Event)
    # The first write of state.db that failed: the run ends with it (see state_failed).
    state_failure: StateWriteError | None = None

    def state_failed(self, err: StateWriteError) -> None:
        """A state write failed in some thread: the run stops everything and ends with the
        first such failure (what follows from a full disk is the same cause)."""
        if self.state_failure is None:
            self.state_failure = err
        self.stopping.set()

    def plugin_failure(self, plugin_id: str) -> str | None:
        """Why this run's own instance of a plugin failed, when every one of them did."""
        mine = [s for s in self.supervisors if s.plugin.id == plugin_id]
        if mine and all(s.failure for s in mine):
            return mine[-1].failure
        return None

    @classmethod
    def open(cls, data_dir: str | Store) -> NodeServices:
        """The node's tables, all on one store: the data dir's, or ``data_dir`` when it is one."""
        store = store_of(data_dir, file=False)
        try:
            csi_state = StateStore(store)  # each table holds the store until it is closed
            return cls(RunState(store, writer=True), VolumeStore(store), csi_state, PluginRegistry(csi_state))
        finally:
            store.close()

    def close(self) -> None:
        """Shut down the plugins, then close the stores, whatever the shutdown could not record."""
        try:
            if self.drivers is not None:
                self.drivers.close()
        finally:
            self.volumes.close()
            self.csi_state.close()
            self.state.close()


class AllocRunner:
    def __init__(
        self,
        job: Job,
        group: Group,
        index: int,
        client: ClientConfig,
        emit: Emit,
        node: NodeServices,
        drivers: DriverManager,
        restoring: AllocRecord | None = None,
    ) -> None:
        self.job = job
        self.group = group
        self.index = index
        self.client = client
        self.emit = emit
        self.node = node
        self.state = node.state
        self.drivers = drivers
        self.restoring = restoring
        self.alloc_id = restoring.alloc_id if restoring is not None else str(uuid.uuid4())
        # The alloc id is ours (a UUID) or read back from state.db; resolved all the same.
        self.alloc_dir = resolve_under(client.data_dir, "allocs", self.alloc_id, what="the alloc dir")
        self.hooks = [make() for make in ALLOC_HOOKS]
        # What every hook of this allocation (and of its tasks) is given: no hook sees the runner.
        services = AllocServices(
            state=node.state,
            drivers=drivers,
            volumes=node.volumes,
            csi_state=node.csi_state,
            registry=node.registry,
            plugin_failure=node.plugin_failure,
            node=self._node_facts,
            emit=emit,
            event=self.event,
        )
        self.info = AllocInfo(self.alloc_id, index, job, group, self.alloc_dir, client, services)
        self._ran: list[AllocHook] = []
        self.tasks: list[TaskRunner] = []
        self._acquired: list[str] = []
        # What the prerun hooks hand the task runners (their responses, applied in list order).
        self.network: NetworkIsolationSpec | None = None
        self.ports: list[PortValue] = []
        self.csi_sources: dict[str, str] = {}
        self.teardown_failed = False
        self.prerun_failed = False
        self._closed = False
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.lifecycle = Coordinator(self, self._stopping)
        self._deadline: threading.Timer | None = None  # the group's max_run_duration

    @property
    def failure(self) -> str:
        """Why the allocation failed as a whole (a prestart task failed), else ""."""
        return self.lifecycle.failure

    def stop_requested(self) -> bool:
        """Whether this allocation, or the whole run, is being stopped."""
        return self._stopping.is_set() or self.node.stopping.is_set()

    @property
    def provides_plugins(self) -> bool:
        return any(t.csi_plugin is not None for t in self.group.tasks)

    def _node_facts(self) -> Node:
        return nodeattrs.for_alloc(self.client, (t.driver for t in self.group.tasks), self.drivers.dispense,
                                   self.node.driver_attributes)  # fmt: skip

    def prerun_request(self) -> AllocPrerunRequest:
        """What a prerun hook is given: the allocation, and what the hooks before it produced."""
        return AllocPrerunRequest(self.info, self.restoring, tuple(self.ports), self.network)

    def postrun_request(self) -> AllocPostrunRequest:
        return AllocPostrunRequest(self.info, tuple(self.ports))

    def _apply(self, response: AllocPrerunResponse) -> None:
        """What a prerun hook hands the tasks, kept for the next hooks and the task runners."""
        if response.ports is not None:
            self.ports = list(response.ports)
        if response.network is not None:
            self.network = response.network
        if response.csi_sources is not None:
            self.csi_sources = dict(response.csi_sources)

    def event(self, kind: str, message: str, *, task: str = "", name: str = "", type: str = "") -> None:
        self.emit(RunEvent(kind, message, job=self.job.name, group=self.group.name, alloc_id=self.alloc_id,
                           task=task, name=name, type=type))  # fmt: skip

    def _driver_event(self, event: TaskEvent) -> None:
        """A driver's own event about a task (Nomad's "Driver" type), kept with the task's events."""
        runner = next((r for r in self.tasks if r.task.name == event.task_name), None)
        if runner is None:
            self.event("task", event.message, task=event.task_name, type=EventType.DRIVER_MESSAGE)
        else:
            runner.event(event.message, type=EventType.DRIVER_MESSAGE,
                         details={"driver_message": event.message})  # fmt: skip

    # --- run -----------------------------------------------------------------------------------

    def run(self) -> None:
        """Prerun hooks, then every task (started, or recovered from a killed run's records)."""
        if self.restoring is not None:
            self.state.alloc_update(self.alloc_id, run_pid=os.getpid())
            self.event("group", f"recovering alloc {self.alloc_id[:8]} from a previous run")
        else:
            self.state.alloc_started(self.alloc_id, self.job.name, self.group.name, self.index, self.alloc_dir)
        self.drivers.subscribe(self.alloc_id, self._driver_event)
        for driver in sorted({t.driver for t in self.group.tasks}):
            self.drivers.acquire(driver)
            self._acquired.append(driver)
        for hook in self.hooks:
            self._ran.append(hook)
            try:
                self._apply(hook.prerun(self.prerun_request()))
            except BaseException:
                self.prerun_failed = True  # recorded as failed: `status` lists it though no task ran
                raise
        records = {r.task: r for r in self.state.tasks(self.alloc_id)} if self.restoring is not None else {}
        if self.group.max_run_duration > 0:
            # Nomad's max_run_duration hook: counted from before the tasks start, the start included;
            # a recovered allocation keeps the time it already ran (from its tasks' records).
            ran = time.time() - min((r.updated for r in records.values()), default=time.time())
            left = max(0.0, self.group.max_run_duration - ran)
            self._deadline = threading.Timer(left, self._max_run_duration_expired)
            self._deadline.daemon = True
            self._deadline.start()
        # Every runner exists before any starts: close() undoes whatever part of them ran.
        self.tasks = [TaskRunner(self, task, records.get(task.name)) for task in self.group.tasks]
        self.lifecycle.start()  # Nomad's lifecycle order; a group without hooks starts all at once

    def _max_run_duration_expired(self) -> None:
        """The allocation ran for its group's max_run_duration: stopped, as Nomad stops it."""
        if self.stop_requested() or (self.tasks and all(r.done.is_set() for r in self.tasks)):
            return
        limit = restarts.go_duration(self.group.max_run_duration)
        self.event("group", f"allocation exceeded max_run_duration ({limit}); stopping its tasks")
        self.stop()

    # --- stop / close --------------------------------------------------------------------------

    def stop(self, wait: float = 60.0) -> None:
        self._stopping.set()
        if self._deadline is not None:
            self._deadline.cancel()
        self.lifecycle.join(wait)  # a stage being started finishes starting first
        for hook in self.hooks:
            hook.stop(AllocStopRequest(self.info))
        if len(self.tasks) > 1 and not has_hooks(self.tasks):
            # Tasks that started together stop together: each stop waits up to its kill_timeout.
            stoppers = [threading.Thread(target=r.stop, name=f"stop-{r.task.name}") for r in self.tasks]
            for thread in stoppers:
                thread.start()
            for thread in stoppers:
                thread.join()
        else:
            for runner in self.tasks:
                runner.stop()
        for runner in self.tasks:
            if runner.started:
                runner.done.wait(wait)

    def close(self) -> None:
        """Release everything this allocation holds, in reverse: tasks (and their hooks), then the
        alloc hooks (CSI volumes, network, plugin dirs), then its share of the driver plugins.
        Failures are reported, not raised, so one stuck step does not leave the rest behind; what
        the run state could not record is raised once everything is released."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._deadline is not None:
            self._deadline.cancel()
        unrecorded: list[StateWriteError] = []
        for runner in self.tasks:
            try:
                runner.destroy()
            except StateWriteError as err:
                unrecorded.append(err)
        if self.restoring is not None and not self.tasks:  # its setup failed before the task runners took over
            for record in self.state.tasks(self.alloc_id):
                try:
                    end_left_by_killed_run(self, record)
                except StateWriteError as err:
                    unrecorded.append(err)
        for hook in reversed(self._ran):
            try:
                if hook.postrun(self.postrun_request()).teardown_failed:
                    self.teardown_failed = True
            except DriverSDKError as err:
                self.event("group", f"{hook.name}: cleanup failed: {err}")
        self._ran.clear()
        self.drivers.unsubscribe(self.alloc_id)
        for driver in self._acquired:
            try:
                self.drivers.release(driver)  # the plugin is shut down before its record is removed
            except StateWriteError as err:
                unrecorded.append(err)
        self._acquired.clear()
        try:
            failed = self.teardown_failed or self.prerun_failed
            self.state.alloc_update(self.alloc_id, state="failed" if failed else "stopped")
        except StateWriteError as err:
            unrecorded.append(err)
        for hook in self.hooks:
            hook.destroy(AllocDestroyRequest(self.info))
        if unrecorded:
            raise unrecorded[0]
