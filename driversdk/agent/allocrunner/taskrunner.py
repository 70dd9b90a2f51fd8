"""The task runner: one task of an allocation through its hooks and its driver plugin.

It sequences :data:`TASK_HOOKS` (prerun in order, postrun in reverse), records each step in the
run state (a ``starting`` row before StartTask, so a run killed inside the call is finished by
the next one), starts or recovers the task on a plugin the driver manager dispenses, waits for it
and reports events. Its lifecycle is one state machine (:mod:`.taskstate`) moved by events: the
start returned, the wait settled (an exit, the plugin's death, the agent's shutdown), a kill was
asked for. A plugin that dies under the task is this runner's to handle, as Nomad's task runner
does: it asks the manager for the driver's plugin again and recovers its own task on it. What a
task needs (its dir, logs, mounts, CSI plugin supervision) is in the hooks.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from driversdk import convert
from driversdk.agent.allocrunner.hooks import TaskHook
from driversdk.agent.allocrunner.hooks.artifact import ArtifactHook
from driversdk.agent.allocrunner.hooks.contract import (
    AllocInfo,
    TaskDestroyRequest,
    TaskInfo,
    TaskPostrunRequest,
    TaskPoststartRequest,
    TaskPrerunRequest,
    TaskPrerunResponse,
    TaskStopRequest,
)
from driversdk.agent.allocrunner.hooks.csi_plugin import CSIPluginSupervisorHook
from driversdk.agent.allocrunner.hooks.logs import LogCollectionHook
from driversdk.agent.allocrunner.hooks.task_dir import TaskDirHook
from driversdk.agent.allocrunner.hooks.template import TemplateHook
from driversdk.agent.allocrunner.hooks.volume_mounts import VolumeMountsHook
from driversdk.agent.allocrunner.lifecycle import Coordinator
from driversdk.agent.allocrunner.taskstate import TaskState, TaskStateMachine
from driversdk.agent.csi.pluginsupervisor import PluginSupervisor
from driversdk.agent.events import Emit, EventType, RunEvent, RunEventType, split_type
from driversdk.agent.logmon import tasklogs as logcollect
from driversdk.agent.logmon.tasklogs import MIB
from driversdk.agent.pluginmanager.drivermanager import AgentShutdown, DriverManager, PluginExited
from driversdk.agent.state.runstate import RunState, TaskRecord, TaskStart
from driversdk.client import DriverClient
from driversdk.durations import parse_duration
from driversdk.errors import DriverSDKError, PluginCallError, StateWriteError
from driversdk.jobspec import restarts, taskenv
from driversdk.jobspec.job import Group, Job, Task
from driversdk.jobspec.taskenv import PortValue
from driversdk.model import (
    Capabilities,
    ExitResult,
    LinuxResources,
    NetworkIsolationSpec,
    PortMapping,
    Resources,
    TaskConfig,
    TaskHandle,
)
from driversdk.mounts import Mount, MountRequest

# The order of start; teardown runs it backwards. A new hook is a new file and a line here.
TASK_HOOKS: list[Callable[[], TaskHook]] = [
    TaskDirHook,  # task dir, secrets dir, NOMAD_* environment
    LogCollectionHook,  # fifos and the detached log collector
    CSIPluginSupervisorHook,  # csi_plugin tasks: socket and staging dirs, probe, register
    VolumeMountsHook,  # host and CSI volume mounts (and the plugin's), checked against the driver
    ArtifactHook,  # artifacts fetched into the task dir (before templates, which may read them)
    TemplateHook,  # templates rendered into the task dir; env = true ones into the environment
]

# No wait follows the task in these states: nothing but the runner itself ends it.
_NOT_FOLLOWED = frozenset({TaskState.PENDING, TaskState.PRESTART, TaskState.STARTING, TaskState.RESTARTING})

# How often a driver plugin may die under one running task before the task counts as lost.
MAX_PLUGIN_RELAUNCHES = 3

# How long a DestroyTask the driver calls recoverable is tried again, and how often.
DESTROY_RETRY_WINDOW = 30.0
DESTROY_RETRY_EVERY = 0.5


class RunNode(Protocol):
    """What a task runner uses of the run's shared services."""

    @property
    def stopping(self) -> threading.Event: ...
    @property
    def supervisors(self) -> list[PluginSupervisor]: ...
    def state_failed(self, err: StateWriteError) -> None: ...


class TaskAlloc(Protocol):
    """What a task runner uses of its allocation (an alloc runner): who it is, the run's state and
    drivers, what the alloc hooks produced, and its lifecycle. Typed here, so the alloc runner
    imports the task runner and not the other way round."""

    @property
    def alloc_id(self) -> str: ...
    @property
    def alloc_dir(self) -> str: ...
    @property
    def job(self) -> Job: ...
    @property
    def group(self) -> Group: ...
    @property
    def info(self) -> AllocInfo: ...
    @property
    def state(self) -> RunState: ...
    @property
    def drivers(self) -> DriverManager: ...
    @property
    def emit(self) -> Emit: ...
    @property
    def node(self) -> RunNode: ...
    @property
    def lifecycle(self) -> Coordinator: ...
    @property
    def ports(self) -> Sequence[PortValue]: ...
    @property
    def network(self) -> NetworkIsolationSpec | None: ...
    @property
    def csi_sources(self) -> dict[str, str]: ...
    def event(self, kind: str, message: str, *, task: str = "", name: str = "", type: str = "") -> None: ...
    def stop_requested(self) -> bool: ...


class InterruptedStartError(DriverSDKError):
    """A half-started task a killed run left could not be removed."""


class TaskRunner:
    def __init__(self, alloc: TaskAlloc, task: Task, restoring: TaskRecord | None = None) -> None:
        self.alloc = alloc
        self.task = task
        self.restoring = restoring
        self.hooks = [make() for make in TASK_HOOKS]
        self._ran: list[TaskHook] = []
        self.caps = Capabilities()
        # What the prerun hooks hand StartTask (their responses, applied in list order).
        self.env: dict[str, str] = {}  # the task environment (task_dir hook), then what later hooks add
        self.node_facts: dict[str, str] = {}  # ${attr.*}, ${node.*}, ${meta.*} of this node
        self.mount_requests: list[MountRequest] = []
        self.mounts: list[Mount] = []
        self.logmon: logcollect.Logmon | None = None
        self.config: TaskConfig | None = None
        self.handle: TaskHandle | None = None
        self.result: ExitResult | None = None
        self.failure = ""
        # The task's lifecycle: every change of it goes through self._to (see taskstate.ALLOWED).
        self.machine = TaskStateMachine(task.name)
        self._plugin: DriverClient | None = None  # the plugin instance the task runs on now
        self._relaunches = 0  # how often its plugin died under it
        self.done = threading.Event()
        self._event_lock = threading.RLock()
        # What the template hook renders with env = true; over the task's env, as Nomad's.
        self.template_env: dict[str, str] = {}
        # Every task has a restart policy, as in Nomad: the job type's default, with the fields of
        # the group's and the task's restart blocks over it (docs/run.md "Run a job").
        policy = restarts.policy_for(alloc.job.type, alloc.group.restart, task.restart)
        count = restoring.restarts if restoring is not None else 0
        self.tracker = restarts.RestartTracker(
            policy, alloc.job.type, task.lifecycle_hook, task.lifecycle_sidecar, count=count
        )
        self.tracker.restarts = count
        self._stopping = threading.Event()  # the kill event: stop() was called, no more restarts
        self._destroyed: set[str] = set()  # task ids already removed from their driver
        self._unrecovered = False  # RecoverTask failed: the driver does not track the task

    # --- events --------------------------------------------------------------------------------

    def event(self, message: str, kind: str = "task", *, type: str = "", show: bool = True, **fields: Any) -> None:
        """Report (and keep, for ``driversdk status``) one of the task's events. A message that
        starts with one of Nomad's event types ("Sibling Task Failed: …") is of that type; the
        other fields are :class:`RunEvent`'s (exit_code, signal, fails_task, details, …).
        ``show`` False keeps it without a line (the run's error line says the same)."""
        if not type:
            type, rest = split_type(message)
            if kind == "task":
                message = rest
        a = self.alloc
        # One event at a time per task, stamped, kept and shown in one order: a driver's event
        # (relayed on its own thread) and the runner's own would otherwise be kept in the order
        # their writes got the store, not the order of their times.
        with self._event_lock:
            event = RunEvent(kind, message, job=a.job.name, group=a.group.name, alloc_id=a.alloc_id,
                             task=self.task.name, type=type, **fields)  # fmt: skip
            try:
                a.state.task_event(a.alloc_id, self.task.name, event.to_json())
            except StateWriteError as err:
                a.node.state_failed(err)  # the run ends with it, as with any other state write
            if show:
                a.emit(event)

    @property
    def label(self) -> str:
        """The driver, as the started and recovered lines name it (they name the allocation too)."""
        return self.task.driver

    @property
    def client(self) -> DriverClient:
        """The plugin instance that runs the task now (a new one after its plugin died)."""
        return self._plugin if self._plugin is not None else self.alloc.drivers.dispense(self.task.driver)

    @property
    def state(self) -> TaskState:
        return self.machine.state

    @property
    def started(self) -> bool:
        """StartTask returned (or the task was taken over from a killed run): there is a task to
        stop and to remove."""
        return self.handle is not None

    def _to(self, after: TaskState, why: str) -> None:
        """The one place the task's state changes (the machine refuses a move its table does not allow)."""
        self.machine.transition(after, why)

    def _end(self, why: str) -> None:
        """Dead, from whatever state the task is in (once)."""
        self.machine.transition_if(set(TaskState) - {TaskState.DEAD}, TaskState.DEAD, why)

    def _end_unless_followed(self, why: str) -> None:
        """Dead, unless a wait follows the task: then its outcome ends it (see :meth:`_wait`)."""
        self.machine.transition_if(_NOT_FOLLOWED, TaskState.DEAD, why)

    # --- hooks ---------------------------------------------------------------------------------

    @property
    def info(self) -> TaskInfo:
        """The task as its hooks see it (with the driver's capabilities, once known)."""
        return TaskInfo(self.alloc.info, self.task, self.caps, self.event)

    def prerun_request(self) -> TaskPrerunRequest:
        """What a prerun hook is given: the task, and what the hooks before it produced."""
        a = self.alloc
        return TaskPrerunRequest(self.info, self.restoring, ports=tuple(a.ports), csi_sources=dict(a.csi_sources),
                                 env=dict(self.env), node_facts=dict(self.node_facts),
                                 mount_requests=tuple(self.mount_requests))  # fmt: skip

    def _apply(self, response: TaskPrerunResponse) -> None:
        """A prerun hook's response, applied before the next hook: env merged over what came
        before, mount requests and template env added, the rest set when given."""
        self.env.update(response.env)
        if response.node_facts is not None:
            self.node_facts = dict(response.node_facts)
        self.mount_requests += response.mount_requests
        if response.mounts is not None:
            self.mounts = list(response.mounts)
        if response.logmon is not None:
            self.logmon = response.logmon
        self.template_env.update(response.template_env)

    def _prerun(self) -> None:
        for hook in self.hooks:
            self._ran.append(hook)
            self._apply(hook.prerun(self.prerun_request()))

    def _poststart(self) -> None:
        for hook in self.hooks:
            response = hook.poststart(TaskPoststartRequest(self.info, self.logmon, self.fail, self.done))
            if response.csi_supervisor is not None:  # a volume waiting for the plugin stops when it failed
                self.alloc.node.supervisors.append(response.csi_supervisor)

    def _stop_hooks(self) -> None:
        for hook in self.hooks:
            hook.stop(TaskStopRequest(self.info))

    def _postrun(self) -> None:
        for hook in reversed(self._ran):
            try:
                hook.postrun(TaskPostrunRequest(self.info, self.logmon))
            except DriverSDKError as err:
                self.event(f"{hook.name}: cleanup failed: {err}")
        self._ran.clear()

    # --- start ---------------------------------------------------------------------------------

    def run(self) -> None:
        """Start the task (or take over the one a killed run left) and follow it in a thread. A
        start the run state cannot record fails the task and ends the run (raised as well)."""
        try:
            self._run()
        except StateWriteError as err:
            self._state_failed(err)
            raise
        except BaseException:
            self._end_unless_followed("its start failed")
            raise

    def _state_failed(self, err: StateWriteError) -> None:
        """A write of this task's state failed: the task fails with that sentence and the run
        ends (the node stops every allocation, which tears this one down)."""
        self.failure = str(err)
        self._end_unless_followed("a write of its state failed")
        if self.result is None:
            self.result = ExitResult(exit_code=1)
        self.event(str(err), type=RunEventType.FAILED, fails_task=True)
        self.alloc.node.state_failed(err)

    def _run(self) -> None:
        self.caps = self.alloc.drivers.dispense(self.task.driver).capabilities()
        record = self.restoring
        if record is not None and record.state == "starting":
            self.restoring = None
            self._finish_interrupted_start(record)
            self._start(record.task_id)
        elif record is not None and record.state == "restarting":
            self._recover_restarting(record)
        elif record is not None:
            self._recover(record)
        else:
            self._first_start()

    def _first_start(self) -> None:
        """Start the task; a start that fails goes under the restart policy as an exit does, as in
        Nomad's task runner: one the driver calls recoverable (a registry down, an engine
        restarting) is tried again after the policy's delay; an unrecoverable one, or one past
        the policy's attempts, is the task's failure (raised). While the run is being stopped, the
        first failure is raised at once."""
        count = 0
        while True:
            try:
                self._start(None, count)
                return
            except StateWriteError:
                raise  # no restart can record more than this one did
            except DriverSDKError as err:
                # Nomad's event types: the driver's StartTask failed, or a hook before it did.
                driver = isinstance(err, PluginCallError)
                failure = EventType.DRIVER_FAILURE if driver else EventType.SETUP_FAILURE
                quiet = self.tracker is None or self.alloc.stop_requested() or self._stopping.is_set()
                # While the run stops, its error line reports it: kept for status only.
                self.event(str(err), type=failure, show=not quiet,
                           details={("driver_error" if driver else "setup_error"): str(err)})  # fmt: skip
                if self.tracker is None or quiet:
                    raise
                kind, delay = self.tracker.start_failed(getattr(err, "recoverable", False)).state()
                self._policy_event(kind, delay)
                if kind != restarts.RESTARTING:
                    raise
                self._to(TaskState.RESTARTING, "its start failed; the policy restarts it")
                if self._sleep_unless_stopped(delay):
                    self._killed_between()  # stopped on purpose: the run says "interrupted", not this error
                    raise
                count = self.tracker.restarts

    def _policy_event(self, kind: str, delay: float = 0.0) -> None:
        """The restart policy's verdict: Restarting (after ``delay``) or Not Restarting."""
        assert self.tracker is not None
        message = restarts.event_message(kind, reason=self.tracker.reason, delay=delay)
        reason = {"restart_reason": self.tracker.reason} if self.tracker.reason else {}
        if kind == restarts.RESTARTING:
            self.event(message, type=EventType.RESTARTING, start_delay=delay,
                       details={**reason, "start_delay": str(round(delay * 1e9))})  # fmt: skip
        else:
            self.event(message, type=kind, fails_task=kind == restarts.NOT_RESTARTING, details=reason)

    def _killed_between(self) -> None:
        """Stopped while waiting for a restart: the task is dead, stopped on purpose (Nomad's
        Killed), not failed."""
        self.event(restarts.event_message(restarts.KILLED), type=EventType.KILLED)
        if self.started or self.config is not None:
            self.alloc.state.killed(self.alloc.alloc_id, self.task.name)

    def _sleep_unless_stopped(self, delay: float) -> bool:
        """Wait ``delay`` seconds; True as soon as the task, its allocation or the run is stopped."""
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            if self._stopping.wait(min(left, 0.2)) or self.alloc.stop_requested():
                return True
        return False

    def _start(self, task_id: str | None, restarts_done: int = 0) -> None:
        state, a = self.alloc.state, self.alloc
        recorded = False
        self._to(TaskState.PRESTART, "start")
        try:
            self._prerun()
            self.config = self._task_config(task_id)
            self.config.env.update(self.template_env)
            start = TaskStart(a.alloc_id, a.job.name, a.group.name, self.task.name, self.task.driver, self.config.id,
                              a.alloc_dir, self.logmon.pid if self.logmon else 0, restarts_done)  # fmt: skip
            state.starting(start)
            recorded = True
            self._to(TaskState.STARTING, "its hooks ran")
            plugin = self.alloc.drivers.dispense(self.task.driver)
            handle = plugin.start_task(self.config)
        except BaseException:
            if recorded:
                state.start_failed(a.alloc_id, self.task.name)
            self._postrun()
            raise
        self.handle, self._plugin = handle, plugin
        self._to(TaskState.RUNNING, "StartTask returned")
        proto = convert.task_handle_to_proto(handle).SerializeToString()
        state.started(start, proto)
        self._started_event(restarts_done)
        self._watch()
        self._poststart()

    def _started_event(self, restarts_done: int) -> None:
        details = {"driver": self.task.driver} | ({"restarts": str(restarts_done)} if restarts_done else {})
        self.event("Task started by client", type=EventType.STARTED, details=details)

    def interpolate(self, value: Any) -> Any:
        """``${…}`` in a string (or in the strings of a config) replaced as Nomad's client does."""
        return taskenv.TaskEnv(self.env, self.node_facts).interpolate(value)

    def _task_config(self, task_id: str | None) -> TaskConfig:
        a, t = self.alloc, self.task
        stdout = stderr = os.devnull
        if self.logmon is not None:
            stdout, stderr = self.logmon.stdout_fifo, self.logmon.stderr_fifo
        return TaskConfig(
            id=task_id or f"{a.alloc_id}/{t.name}/{secrets.token_hex(4)}",
            name=t.name,
            alloc_id=a.alloc_id,
            job_name=a.job.name,
            job_id=a.job.name,
            task_group_name=a.group.name,
            namespace=a.job.namespace,
            env=dict(self.env),
            resources=Resources(
                cpu_shares=t.cpu,
                memory_mb=t.memory,
                memory_max_mb=t.memory_max,
                linux=LinuxResources(cpu_shares=t.cpu, memory_limit_bytes=max(t.memory, t.memory_max) * MIB),
                ports=tuple(PortMapping(p.label, p.value, p.to, p.host_ip) for p in a.ports),
            ),
            mounts=self.mounts,
            user=self.interpolate(t.user),
            alloc_dir=a.alloc_dir,
            stdout_path=stdout,
            stderr_path=stderr,
            driver_config=self.interpolate(dict(t.config)),
            network_isolation_spec=a.network,
        )

    def _finish_interrupted_start(self, record: TaskRecord) -> None:
        """The killed run was inside StartTask: the task may exist without a handle we could recover.
        A plugin that survived and knows it removes it; then the task starts again under the same id,
        which lets a driver adopt (docker: a running container labelled with that id) or replace what
        a plugin that died with the run left, instead of starting a second copy next to it."""
        if record.logmon_pid:  # the interrupted start's collector: one collector per fifo pair
            logs = os.path.join(self.alloc.alloc_dir, "alloc", "logs")
            logcollect.stop(logcollect.Logmon(record.logmon_pid, *logcollect.fifo_paths(logs, self.task.name)))
        plugin = self.alloc.drivers.dispense(self.task.driver)
        try:
            plugin.inspect_task(record.task_id)
        except DriverSDKError:
            return  # the plugin does not know it: the driver finds it by its id at StartTask, if it exists
        self.event("was being started when the previous run was killed; replacing it")
        try:
            plugin.destroy_task(record.task_id, force=True)
        except DriverSDKError as err:
            raise InterruptedStartError(
                f'task "{self.task.name}": the previous run was killed while starting it, and the half-started task '
                f"could not be removed: {err}; remove it by hand, then run the job again"
            ) from None

    def _recover(self, record: TaskRecord) -> None:
        handle = convert.task_handle_from_proto(_handle_proto(record.handle or b""))
        self.config, self.handle = handle.config, handle
        self._to(TaskState.PRESTART, "recover the task a killed run left")
        self._prerun()
        if record.state != "running":
            lost = record.state == "lost" and record.exit_code is None  # ended, how unknown: not a success
            self.result = ExitResult(1 if lost else record.exit_code or 0, record.signal or 0, record.oom)
            self._to(TaskState.DEAD, f"it had ended ({record.state}) before this run")
            self.done.set()
            return
        try:
            plugin = self.alloc.drivers.dispense(self.task.driver)
            plugin.recover_task(handle)
        except DriverSDKError as err:
            # The task ended (or went) while no run followed it, and the driver cannot say how: it
            # is lost, as Nomad's client marks a task it cannot restore. The driver does not track
            # it any more, so its removal finding nothing is no failure (see _destroy_task).
            self.event(f"it ended or went while no run followed it, and could not be recovered: {err}",
                       type=EventType.RESTORE_FAILED, fails_task=True)  # fmt: skip
            self._unrecovered = True
            self.result = ExitResult(exit_code=1)
            self._to(TaskState.DEAD, "RecoverTask failed")
            self.alloc.state.lost(self.alloc.alloc_id, self.task.name)
            self.done.set()
            return
        self._plugin = plugin
        self._to(TaskState.RUNNING, "recovered")
        self.event(f"recovered ({self.label})", type=RunEventType.RECOVERED)
        self._watch()
        self._poststart()

    # --- running -------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Follow the task: the driver manager hands the wait's outcome to :meth:`_wait`."""
        assert self.config is not None and self._plugin is not None
        self.alloc.drivers.watch(self._plugin, self.config.id, self._wait)

    def _wait(self, outcome: ExitResult | DriverSDKError) -> None:
        """The wait's outcome, on the short-lived thread the driver manager gives it (no thread
        waits while the task runs): its every failure reaches the run, never the thread's end alone."""
        if isinstance(outcome, AgentShutdown):
            # The agent lets its plugins go and the next one recovers the task: nothing is recorded
            # (the store is the next agent's), and the task is not over.
            self._end("the agent shut down; the task runs on for the next agent")
            return
        final = True
        try:
            final = self._wait_and_record(outcome)
        except StateWriteError as err:
            self._state_failed(err)
        except BaseException as err:  # a bug: the task must not stay "running" for ever
            self._failed_unexpectedly(err)
        finally:
            if final:
                self._end("its wait ended")
                self.done.set()
                # A failed task, or the leader, stops its siblings (Nomad's alloc runner does so).
                self.alloc.lifecycle.task_ended(self)

    def _failed_unexpectedly(self, err: BaseException) -> None:
        self.failure = f"following the task failed: {type(err).__name__}: {err}"
        self._end("following it failed")
        if self.result is None:
            self.result = ExitResult(exit_code=1)
        self.event(self.failure, type=RunEventType.FAILED, fails_task=True)
        self.alloc.node.stopping.set()

    def _wait_and_record(self, outcome: ExitResult | DriverSDKError) -> bool:
        """Record the task's end; False when it was started again (a new watch follows it)."""
        assert self.config is not None
        if isinstance(outcome, PluginExited):
            if self._recover_from_plugin_death(outcome.plugin):
                return False  # followed again on the new plugin
            result = ExitResult(exit_code=1)  # lost: self.failure says why
        elif isinstance(outcome, DriverSDKError):  # WaitFailed: the plugin lives, the call failed
            self.event(str(outcome))
            result = ExitResult(exit_code=1)
        else:
            result = outcome
        if self.failure and result.successful:
            result = ExitResult(exit_code=1, signal=result.signal)
        self._to(TaskState.EXITED, "its wait settled")
        oom_detail = {"oom_killed": "true"} if result.oom_killed else {}
        self.event(restarts.event_message(restarts.TERMINATED, result=result), type=EventType.TERMINATED,
                   exit_code=result.exit_code, signal=result.signal, details=oom_detail)  # fmt: skip
        final = self._restart_after(result)
        if final is None:
            return False  # started again: a new wait thread follows it
        result = final
        self.result = result
        how = f"signal {result.signal}" if result.signal else f"exit code {result.exit_code}"
        if self._stopping.is_set() and not self.failure:
            # Stopped on purpose (Ctrl-C, its main tasks done, a sibling failed): dead, not failed,
            # whatever the kill signal made of its exit code.
            self.event(restarts.event_message(restarts.KILLED), type=EventType.KILLED)
            self.alloc.state.killed(self.alloc.alloc_id, self.task.name)
            self.event(f"finished with {how} (stopped, not failed)", type=RunEventType.FINISHED,
                       exit_code=result.exit_code, signal=result.signal)  # fmt: skip
            return True
        self.alloc.state.finished(self.alloc.alloc_id, self.task.name, result.exit_code, result.signal,
                                  result.oom_killed)  # fmt: skip
        oom = " (killed: out of memory)" if result.oom_killed else ""
        self.event(f"finished with {how}{oom}", type=RunEventType.FINISHED, exit_code=result.exit_code,
                   signal=result.signal, fails_task=not result.successful or bool(self.failure))  # fmt: skip
        return True

    def _recover_from_plugin_death(self, dead: DriverClient) -> bool:
        """The plugin died under the task (which may run on): the driver's plugin is dispensed again
        (launched by the first of its tasks to ask, shared by the rest) and RecoverTask asked of it
        for this task, as Nomad's task runner handles a driver plugin's exit. False when the task is
        lost (``self.failure`` says why): its plugin died too often, or no new one takes it over."""
        driver = self.task.driver
        self._to(TaskState.RECOVERING, "its driver plugin exited")
        if self._relaunches >= MAX_PLUGIN_RELAUNCHES:
            self.failure = f"the {driver} driver plugin died {self._relaunches + 1} times while the task ran"
            self.event(f"lost: {self.failure}")
            return False
        self.event(f"driver plugin {driver!r} exited; relaunching it and recovering the task")
        assert self.handle is not None
        try:
            plugin = self.alloc.drivers.redispense(driver, dead)
            self._relaunches += 1
            plugin.recover_task(self.handle)
        except DriverSDKError as err:
            self.failure = f"could not be recovered after its driver plugin exited: {err}"
            self.event(self.failure)
            return False
        self._plugin = plugin
        self._to(TaskState.RUNNING, "recovered on the new plugin")
        self.event(f"recovered ({self.label})", type=RunEventType.RECOVERED,
                   details={"plugin_relaunches": str(self._relaunches)})  # fmt: skip
        self._watch()
        if self._stopping.is_set():
            self._stop_task()  # the kill came while the plugin was down: StopTask reached no one
        return True

    def skip(self, why: str) -> None:
        """The task will not start (its allocation failed or stopped before its lifecycle stage)."""
        self._end_unless_followed("not started")
        self.event(f"not started: {why}", type=RunEventType.NOT_STARTED)
        self.done.set()

    @property
    def stopped(self) -> bool:
        """stop() was called (a sidecar whose main tasks are done, or the whole run)."""
        return self._stopping.is_set()

    def fail(self, why: str) -> None:
        """A hook found the task failed (a CSI plugin that never became healthy): stop it."""
        self.failure = why
        self.event(why, type=RunEventType.FAILED, fails_task=True)
        self._stop_task()

    # --- stop ----------------------------------------------------------------------------------

    def _stop_task(self) -> None:
        """The kill event: StopTask for a running task (again for one being killed); nothing for one
        not started, between its restarts or ended."""
        if self.done.is_set() or self.config is None:
            return
        running = (TaskState.RUNNING, TaskState.KILLING)
        if self.machine.transition_if(running, TaskState.KILLING, "kill requested"):
            try:
                timeout = parse_duration(self.task.kill_timeout, "kill_timeout")
                # Nomad's words, whatever the kill_signal: "interrupt" is its name for the first signal.
                self.event(f"Sent interrupt. Waiting {restarts.go_duration(timeout)} before force killing",
                           type=EventType.KILLING, kill_timeout=timeout,
                           details={"kill_timeout": str(round(timeout * 1e9))})  # fmt: skip
                self.client.stop_task(self.config.id, timeout, self.task.kill_signal)
            except DriverSDKError as err:
                self.event(f"stop failed: {err}")

    def stop(self) -> None:
        self._stopping.set()
        self._stop_hooks()
        self._stop_task()

    def destroy(self) -> None:
        """The task is gone or must go: remove it from its driver, then undo the hooks. A stop
        the run state cannot record is raised once everything is undone."""
        unrecorded: StateWriteError | None = None
        self._stop_hooks()
        if self.started and self.config is not None:
            try:
                self.alloc.state.stopped(self.alloc.alloc_id, self.task.name)
            except StateWriteError as err:
                unrecorded = err
            if self.config.id not in self._destroyed:
                self._destroy_task(self.config.id)
        self._postrun()
        for hook in self.hooks:
            hook.destroy(TaskDestroyRequest(self.info))
        if unrecorded is not None:
            raise unrecorded

    # --- restarts (Nomad's restart policy) ------------------------------------------------------

    def _restart_after(self, result: ExitResult) -> ExitResult | None:
        """Apply the restart policy to an exit: None when the task was started again, else the
        result it ends with. Runs on the task-exit thread; a stop() during the delay ends the task
        with its last exit."""
        if self.tracker is None or self._stopping.is_set() or self.failure:
            return result
        self.tracker.exited(result)
        while True:
            kind, delay = self.tracker.state()
            if kind == restarts.NOT_RESTARTING:
                self._policy_event(kind)
                if result.successful:  # a service task that keeps exiting: failed by its policy
                    self.failure = self.tracker.reason
                return result
            if kind != restarts.RESTARTING:
                return result  # Terminated: done, successfully
            self._policy_event(kind, delay)
            if self.machine.is_(TaskState.EXITED):  # not after a failed restart: removed already
                self._to(TaskState.RESTARTING, "the policy restarts it")
                self.alloc.state.restarting(self.alloc.alloc_id, self.task.name, result.exit_code, result.signal,
                                            self.tracker.restarts)  # fmt: skip
                self._remove_exited()
            if self._stopping.wait(delay):
                return result
            try:
                self._start_again()
                return None
            except StateWriteError:
                raise
            except DriverSDKError as err:
                self.machine.transition_if((TaskState.STARTING,), TaskState.RESTARTING, "its restart failed")
                self.event(f"restart failed: {err}")
                self.tracker.start_failed(getattr(err, "recoverable", False))
                result = ExitResult(exit_code=1)

    def _remove_exited(self) -> None:
        """The exited task is removed from its driver before the new one starts (same task dir,
        same log collector)."""
        assert self.config is not None
        old = self.config.id
        self._destroy_task(old)
        self._destroyed.add(old)

    def _start_again(self) -> None:
        """StartTask under a new task id with the config of the first start (env, mounts, the
        same fifos), templates rendered again when the policy says render_templates."""
        assert self.config is not None and self.tracker is not None
        a, state = self.alloc, self.alloc.state
        if self.tracker.policy.render_templates:
            for hook in self.hooks:
                if isinstance(hook, TemplateHook):
                    self.template_env.update(hook.render(self.prerun_request()))
        config = dataclasses.replace(
            self.config,
            id=f"{a.alloc_id}/{self.task.name}/{secrets.token_hex(4)}",
            env={**self.config.env, **self.template_env},
        )
        count = self.tracker.restarts
        logmon = self.logmon.pid if self.logmon else 0
        start = TaskStart(a.alloc_id, a.job.name, a.group.name, self.task.name, self.task.driver, config.id,
                          a.alloc_dir, logmon, count)  # fmt: skip
        state.starting(start)
        self._to(TaskState.STARTING, "restart")
        try:
            plugin = a.drivers.dispense(self.task.driver)
            handle = plugin.start_task(config)
        except BaseException:
            state.start_failed(a.alloc_id, self.task.name)
            raise
        self.config, self.handle, self._plugin = config, handle, plugin
        self._to(TaskState.RUNNING, "StartTask returned")
        proto = convert.task_handle_to_proto(handle).SerializeToString()
        state.started(start, proto)
        self._started_event(count)
        self._watch()
        if self._stopping.is_set():
            self._stop_task()  # stop() came while StartTask ran

    def _recover_restarting(self, record: TaskRecord) -> None:
        """The killed run was waiting to restart the task: the exited task is removed if it is
        still there, and the task starts again at once (the rest of the delay is not waited)."""
        handle = convert.task_handle_from_proto(_handle_proto(record.handle or b""))
        self.config, self.handle = handle.config, handle
        self._to(TaskState.PRESTART, "recover the task a killed run was restarting")
        self._prerun()
        self.event(f"was waiting to restart (restart {record.restarts}) when the previous run was killed; starting it")
        try:
            self.alloc.drivers.dispense(self.task.driver).destroy_task(record.task_id, force=True)
        except DriverSDKError:
            pass  # removed before the run was killed, or gone with its plugin
        self._destroyed.add(record.task_id)
        if self.tracker is None:  # the job no longer has a restart block: start it once more all the same
            self.tracker = restarts.RestartTracker(restarts.policy_for(self.alloc.job.type, None, None),
                                                   self.alloc.job.type, count=record.restarts)  # fmt: skip
        self.tracker.restarts = record.restarts
        self._to(TaskState.RESTARTING, "the killed run was restarting it")
        self._start_again()
        self._poststart()

    def _destroy_task(self, task_id: str) -> None:
        """DestroyTask, tried again while the driver calls its failure recoverable (a Docker
        engine restarting under the task answers again within seconds; giving up at once would
        leave its container behind), for at most DESTROY_RETRY_WINDOW seconds."""
        deadline = time.monotonic() + DESTROY_RETRY_WINDOW
        said = False
        while True:
            try:
                self.client.destroy_task(task_id, force=True)
                return
            except PluginCallError as err:
                if err.code == "NOT_FOUND" and self._unrecovered:
                    return  # nothing left to remove: the task was lost before this run
                if not err.recoverable or time.monotonic() >= deadline:
                    self.event(f"destroy failed: {err}")
                    return
                if not said:
                    self.event(f"destroy failed for now, trying again for up to {DESTROY_RETRY_WINDOW:.0f}s: {err}")
                    said = True
            except DriverSDKError as err:
                self.event(f"destroy failed: {err}")
                return
            time.sleep(DESTROY_RETRY_EVERY)


def end_left_by_killed_run(alloc: TaskAlloc, record: TaskRecord) -> None:
    """A recovered allocation that ends before its task runners took over (its setup failed) is
    over: the task the killed run left is removed from its driver and its log collector stopped,
    or both would run on with no run to end them."""
    if record.task_id and record.state in ("running", "restarting", "starting"):
        why = ""
        try:
            plugin = alloc.drivers.dispense(record.driver)
        except DriverSDKError as err:
            plugin, why = None, str(err)
        recovered = False
        if plugin is not None and record.handle:
            try:  # the driver removes only a task it tracks
                plugin.recover_task(convert.task_handle_from_proto(_handle_proto(record.handle)))
                recovered = True
            except DriverSDKError:
                pass  # ended while no run followed it; removing it finds nothing, or what is left of it
        if plugin is not None:
            try:
                plugin.destroy_task(record.task_id, force=True)
            except DriverSDKError as err:
                why = str(err) if recovered else ""
        if why:
            alloc.event("task", f"the task the previous run left could not be removed: {why}", task=record.task)
        alloc.state.stopped(alloc.alloc_id, record.task)
    if record.logmon_pid:
        logs = os.path.join(alloc.alloc_dir, "alloc", "logs")
        logcollect.stop(logcollect.Logmon(record.logmon_pid, *logcollect.fifo_paths(logs, record.task)))


def _handle_proto(data: bytes) -> Any:
    from driversdk.pb import driver_pb2

    proto = driver_pb2.TaskHandle()
    proto.ParseFromString(data)
    return proto
