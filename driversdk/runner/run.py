"""``driversdk run``: run a job's allocations on this machine through their driver plugins.

Per allocation, in Nomad's hook order: alloc dir; group network (created by the driver that
must create it); CSI hook (claim, wait for the node plugin, controller publish, stage, publish);
per task: log monitor, CSI plugin supervisor mounts for ``csi_plugin`` tasks, volume hook (host
and CSI mounts checked against the driver's MountConfigs and the host), StartTask, wait. Every
step is recorded in ``<data_dir>/state.db``; a run that was killed and started again recovers
its allocations (reattach or relaunch the plugins, RecoverTask, adopt the log monitors, keep the
mounts) instead of starting duplicates. On the way out everything is undone in reverse.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from driversdk import convert
from driversdk.client import DriverClient, launch, reattach
from driversdk.csi.registry import PluginRegistry
from driversdk.csi.state import StateStore
from driversdk.durations import parse_duration
from driversdk.errors import ConfigError, DriverSDKError
from driversdk.model import (
    AgentConfig,
    Capabilities,
    ExitResult,
    FSIsolation,
    LinuxResources,
    NetworkIsolationMode,
    NetworkIsolationSpec,
    Resources,
    TaskConfig,
    TaskHandle,
)
from driversdk.mounts import MountRequest, check_mounts
from driversdk.paths import UnsafePathError, check_name, resolve_under
from driversdk.plugin.host import ReattachConfig, pid_alive
from driversdk.runner import logcollect
from driversdk.runner.clientconfig import ClientConfig
from driversdk.runner.csihook import CSIHook
from driversdk.runner.jobspec import Group, Job, Task
from driversdk.runner.logcollect import MIB
from driversdk.runner.runstate import AllocRecord, RunState, TaskRecord
from driversdk.runner.supervisor import PluginSupervisor, csi_dir, release_shared
from driversdk.runner.validate import validate_job
from driversdk.runner.volumes import VolumeStore

Say = Callable[[str], None]

# How often a driver plugin may die under one running task before the task counts as lost.
MAX_PLUGIN_RELAUNCHES = 3
SECRETS_DIR_MODE = 0o700


class RunRefused(ConfigError):
    """The job asks for something ``driversdk run`` does not do."""


class AlreadyRunning(ConfigError):
    """Another live ``driversdk run`` process owns the job's allocations."""


def log_files(alloc_dir: str, task: str, kind: str) -> list[str]:
    """A task's rotated log files of one kind, oldest first."""
    logs = os.path.join(alloc_dir, "alloc", "logs")
    prefix = f"{task}.{kind}."
    if os.path.islink(logs):  # the task may swap its logs dir, or a log file, for a link to a host path
        return []
    try:
        names = [n for n in os.listdir(logs) if n.startswith(prefix) and n[len(prefix) :].isdigit()]
    except FileNotFoundError:
        return []
    paths = [os.path.join(logs, n) for n in sorted(names, key=lambda n: int(n[len(prefix) :]))]
    return [p for p in paths if logcollect.is_log_file(p)]


@dataclass
class RunningTask:
    task: Task
    config: TaskConfig
    client: DriverClient
    logmon: logcollect.Logmon | None = None
    supervisor: PluginSupervisor | None = None
    handle: TaskHandle | None = None
    result: ExitResult | None = None
    started: bool = False
    failure: str = ""
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class NodeServices:
    """What every allocation of a run shares: the state files and the CSI plugin registry."""

    state: RunState
    volumes: VolumeStore
    csi_state: StateStore
    registry: PluginRegistry
    # Supervisors of this run's plugin tasks: a volume waiting for one of them stops waiting when it failed.
    supervisors: list[PluginSupervisor] = field(default_factory=list)

    def plugin_failure(self, plugin_id: str) -> str | None:
        """Why this run's own instance of a plugin failed, when every one of them did."""
        mine = [s for s in self.supervisors if s.plugin.id == plugin_id]
        if mine and all(s.failure for s in mine):
            return mine[-1].failure
        return None

    @classmethod
    def open(cls, data_dir: str) -> NodeServices:
        db = os.path.join(data_dir, "state.db")
        state = RunState(data_dir)
        csi_state = StateStore(db)
        return cls(state, VolumeStore(db), csi_state, PluginRegistry(csi_state))

    def close(self) -> None:
        self.volumes.close()
        self.csi_state.close()
        self.state.close()


class AllocRun:
    def __init__(
        self,
        job: Job,
        group: Group,
        index: int,
        client: ClientConfig,
        say: Say,
        node: NodeServices,
        alloc_id: str | None = None,
        spare_plugins: dict[str, DriverClient] | None = None,
    ) -> None:
        self.job = job
        self.group = group
        self.index = index
        self.client = client
        self.say = say
        self.node = node
        self.state = node.state
        self.alloc_id = alloc_id or str(uuid.uuid4())
        # The alloc id is ours (a UUID) or read back from state.db; resolved all the same.
        self.alloc_dir = resolve_under(client.data_dir, "allocs", self.alloc_id, what="the alloc dir")
        self.plugins: dict[str, DriverClient] = {}
        # Held while a dead plugin is replaced, so tasks that lost it together relaunch it once.
        self._plugin_lock = threading.Lock()
        # Plugins validation already launched (and configured): taken instead of launching anew.
        self.spare_plugins = spare_plugins if spare_plugins is not None else {}
        self.tasks: list[RunningTask] = []
        self.network: NetworkIsolationSpec | None = None
        self.network_owner = ""
        self.csi: CSIHook | None = None
        self.csi_sources: dict[str, str] = {}
        self._closed = False

    @property
    def provides_plugins(self) -> bool:
        return any(t.csi_plugin is not None for t in self.group.tasks)

    def _say_task(self, task: str, text: str) -> None:
        self.say(f'==> task "{task}" {text}')

    # --- plugins -------------------------------------------------------------------------------

    def _plugin(self, driver: str) -> DriverClient:
        if driver not in self.plugins:
            command = self.client.driver_command(driver)
            if command is None:
                raise RunRefused(f'no plugin is configured for driver "{driver}"')
            plugin = self.spare_plugins.pop(driver, None) or launch(command, name=driver)
            try:
                plugin.set_config(self.client.plugin_config(driver), AgentConfig(14000, 14512))
                plugin.init()
            except BaseException:
                plugin.kill()
                raise
            self.plugins[driver] = plugin
            self.state.plugin_started(self.alloc_id, driver, plugin.process.reattach_config.to_json())
            self._relay_events(plugin)
        return self.plugins[driver]

    def _relay_events(self, plugin: DriverClient) -> None:
        """Print the driver's task events for this allocation (image pulls, OOM kills, …)."""

        def relay() -> None:
            try:
                for event in plugin.task_events():
                    if event.alloc_id == self.alloc_id:
                        self._say_task(event.task_name, f"event: {event.message}")
            except DriverSDKError:
                pass  # the plugin went away: the stream ends with it

        threading.Thread(target=relay, daemon=True, name="task-events").start()

    def _reattach_plugins(self) -> None:
        for driver, saved in self.state.plugins(self.alloc_id).items():
            try:
                self.plugins[driver] = reattach(ReattachConfig.from_json(saved), name=driver)
                self._relay_events(self.plugins[driver])
                self.say(f'==> driver "{driver}": reattached to its running plugin')
            except DriverSDKError:
                pass  # the plugin died with the run: _plugin launches a new one and RecoverTask finds the task

    # --- network -------------------------------------------------------------------------------

    def _create_network(self) -> None:
        if (self.group.network_mode or "host") == "host":
            return
        for task in self.group.tasks:
            caps = self._plugin(task.driver).capabilities()
            if caps.must_create_network and NetworkIsolationMode.GROUP in caps.network_isolation_modes:
                spec, _ = self._plugin(task.driver).create_network(self.alloc_id, f"{self.group.name}-{self.index}")
                self.network, self.network_owner = spec, task.driver
                self.state.alloc_update(self.alloc_id, network=json.dumps(self._network_json()))
                self.say(f'==> group "{self.group.name}": network created by the {task.driver} driver')
                return
        drivers = ", ".join(sorted({t.driver for t in self.group.tasks}))
        raise RunRefused(
            f'group "{self.group.name}": network mode "bridge" needs a task driver that creates group networks, and '
            f'none of {drivers} does; use docker or exec, or mode = "host"'
        )

    def _network_json(self) -> dict[str, Any]:
        assert self.network is not None
        return {"owner": self.network_owner, "mode": self.network.mode.value, "path": self.network.path,
                "labels": self.network.labels}  # fmt: skip

    def _restore_network(self, saved: str | None) -> None:
        if not saved:
            return
        data = json.loads(saved)
        self.network_owner = data["owner"]
        self.network = NetworkIsolationSpec(NetworkIsolationMode(data["mode"]), data["path"], dict(data["labels"]))

    def _destroy_network(self) -> None:
        if self.network is None:
            return
        try:
            self._plugin(self.network_owner).destroy_network(self.alloc_id, self.network)
            self.network = None
        except DriverSDKError as err:
            self.say(f'==> group "{self.group.name}": network removal failed: {err}')

    # --- tasks ---------------------------------------------------------------------------------

    def _volume_requests(self, task: Task) -> list[MountRequest]:
        requests = []
        for mount in task.volume_mounts:
            req = self.group.volumes[mount.volume]
            if req.type == "csi":
                host_path, kind, read_only = self.csi_sources[req.name], "csi", req.read_only or mount.read_only
            else:
                volume = self.client.host_volumes[req.source]
                host_path, kind = volume.host_path, "host"
                read_only = volume.read_only or req.read_only or mount.read_only
            requests.append(
                MountRequest(
                    volume=req.name,
                    destination=mount.destination,
                    host_path=host_path,
                    kind=kind,
                    propagation=mount.propagation_mode,
                    read_only=read_only,
                    selinux_label=mount.selinux_label,
                )
            )
        return requests

    def _task_config(
        self,
        task: Task,
        caps: Capabilities,
        logmon: logcollect.Logmon | None,
        extra_mounts: list[MountRequest],
        extra_env: dict[str, str],
        task_id: str | None = None,
    ) -> TaskConfig:
        task_dir = resolve_under(self.alloc_dir, task.name, what=f'the task dir of task "{task.name}"')
        for sub in ("local", "private", "tmp"):
            os.makedirs(os.path.join(task_dir, sub), exist_ok=True)
        make_secrets_dir(os.path.join(task_dir, "secrets"), task_owner(task.user, caps.fs_isolation))
        mounts = check_mounts(
            self._volume_requests(task) + extra_mounts,
            task=task.name,
            driver=task.driver,
            mount_configs=int(caps.mount_configs),
        )
        env = {
            "NOMAD_ALLOC_ID": self.alloc_id,
            "NOMAD_ALLOC_INDEX": str(self.index),
            "NOMAD_JOB_NAME": self.job.name,
            "NOMAD_GROUP_NAME": self.group.name,
            "NOMAD_TASK_NAME": task.name,
            "NOMAD_ALLOC_DIR": "/alloc",
            "NOMAD_TASK_DIR": "/local",
            "NOMAD_SECRETS_DIR": "/secrets",
            **extra_env,
            **task.env,
        }
        stdout = stderr = os.devnull
        if logmon is not None:
            stdout, stderr = logmon.stdout_fifo, logmon.stderr_fifo
        return TaskConfig(
            id=task_id or f"{self.alloc_id}/{task.name}/{secrets.token_hex(4)}",
            name=task.name,
            alloc_id=self.alloc_id,
            job_name=self.job.name,
            job_id=self.job.name,
            task_group_name=self.group.name,
            namespace=self.job.namespace,
            env=env,
            resources=Resources(
                cpu_shares=task.cpu,
                memory_mb=task.memory,
                memory_max_mb=task.memory_max,
                linux=LinuxResources(cpu_shares=task.cpu, memory_limit_bytes=max(task.memory, task.memory_max) * MIB),
            ),
            mounts=mounts,
            user=task.user,
            alloc_dir=self.alloc_dir,
            stdout_path=stdout,
            stderr_path=stderr,
            driver_config=dict(task.config),
            network_isolation_spec=self.network,
        )

    def _logmon(self, task: Task, caps: Capabilities) -> logcollect.Logmon | None:
        if task.logs_disabled or caps.disable_log_collection:
            return None
        logs = os.path.join(self.alloc_dir, "alloc", "logs")
        problem = check_name(task.name, "task name")
        if problem is not None:  # the collector's file names start with the task name
            raise UnsafePathError(f'task "{task.name}": {problem}')
        return logcollect.spawn(logs, task.name, task.logs_max_files, task.logs_max_file_size * MIB)

    def _supervisor(self, task: Task, caps: Capabilities) -> PluginSupervisor | None:
        if task.csi_plugin is None:
            return None
        return PluginSupervisor(
            task=task,
            alloc_id=self.alloc_id,
            data_dir=self.client.data_dir,
            registry=self.node.registry,
            say=self.say,
            fs_isolated=caps.fs_isolation != FSIsolation.NONE,
        )

    def _start_task(self, task: Task, task_id: str | None = None) -> None:
        plugin = self._plugin(task.driver)
        caps = plugin.capabilities()
        supervisor = self._supervisor(task, caps)
        extra_mounts, extra_env = supervisor.prestart() if supervisor else ([], {})
        logmon = self._logmon(task, caps)
        running: RunningTask | None = None
        recorded = False
        try:
            config = self._task_config(task, caps, logmon, extra_mounts, extra_env, task_id)
            running = RunningTask(task, config, plugin, logmon, supervisor)
            self.state.starting(self.alloc_id, self.job.name, self.group.name, task.name, task.driver, config.id,
                                self.alloc_dir, logmon.pid if logmon else 0)  # fmt: skip
            recorded = True
            handle = plugin.start_task(config)
        except BaseException:
            if recorded:
                self.state.start_failed(self.alloc_id, task.name)
            if logmon is not None:
                logcollect.stop(logmon)
            if supervisor is not None:
                supervisor.cleanup()
            raise
        running.started = True
        running.handle = handle
        self.tasks.append(running)
        self.state.started(
            self.alloc_id, self.job.name, self.group.name, task.name, task.driver, config.id,
            convert.task_handle_to_proto(handle).SerializeToString(), self.alloc_dir, logmon.pid if logmon else 0,
        )  # fmt: skip
        self._say_task(task.name, f"started ({task.driver}, alloc {self.alloc_id[:8]})")
        self._watch(running)

    def _watch(self, running: RunningTask) -> None:
        threading.Thread(target=self._wait, args=(running,), daemon=True).start()
        threading.Thread(target=self._log_events, args=(running, running.done), daemon=True).start()
        if running.supervisor is not None:
            running.supervisor.start(lambda why, r=running: self._plugin_failed(r, why), running.done)  # type: ignore[misc]
            self.node.supervisors.append(running.supervisor)

    def _log_events(self, running: RunningTask, until: threading.Event | None = None) -> None:
        """Print what the log collector refused (a log file the task swapped for a symlink, say) as
        task events. The collector outlives this process, so it reports through a file in the
        task's private dir; with ``until``, keep polling it until that is set."""
        while running.logmon is not None:
            for sentence in logcollect.new_events(running.logmon):
                self._say_task(running.task.name, f"event: {sentence}")
            if until is None or until.wait(0.5):
                return

    def _plugin_failed(self, running: RunningTask, why: str) -> None:
        running.failure = why
        self._say_task(running.task.name, f"failed: {why}")
        self._stop_task(running)

    def _wait(self, running: RunningTask) -> None:
        running.result = self._wait_through_plugin_deaths(running)
        r = running.result
        if running.failure and r.successful:
            r = running.result = ExitResult(exit_code=1, signal=r.signal)
        self.state.finished(self.alloc_id, running.task.name, r.exit_code, r.signal, r.oom_killed)
        how = f"signal {r.signal}" if r.signal else f"exit code {r.exit_code}"
        oom = " (killed: out of memory)" if r.oom_killed else ""
        self._say_task(running.task.name, f"finished with {how}{oom}")
        running.done.set()

    def _wait_through_plugin_deaths(self, running: RunningTask) -> ExitResult:
        """WaitTask; when the driver plugin dies meanwhile, relaunch it and RecoverTask, as Nomad's
        driver manager does, so the task's real exit code is recorded and nothing is left behind."""
        relaunches = 0
        while True:
            client = running.client
            try:
                return client.wait_task(running.config.id)
            except DriverSDKError as err:
                if self._closed or running.handle is None or not client.process.exited_within(1.0):
                    self._say_task(running.task.name, f"wait failed: {err}")
                    return ExitResult(exit_code=1)
                if relaunches >= MAX_PLUGIN_RELAUNCHES:
                    why = f"the {running.task.driver} driver plugin died {relaunches + 1} times while the task ran"
                    self._say_task(running.task.name, f"lost: {why}")
                    running.failure = why
                    return ExitResult(exit_code=1)
            relaunches += 1
            self._say_task(running.task.name, f"driver plugin {running.task.driver!r} exited; relaunching it and "
                           "recovering the task")  # fmt: skip
            try:
                running.client = self._replace_plugin(running.task.driver, client)
                running.client.recover_task(running.handle)
            except DriverSDKError as err:
                why = f"could not be recovered after its driver plugin exited: {err}"
                self._say_task(running.task.name, why)
                running.failure = why
                return ExitResult(exit_code=1)
            self._say_task(running.task.name, f"recovered ({running.task.driver}, alloc {self.alloc_id[:8]})")

    def _replace_plugin(self, driver: str, dead: DriverClient) -> DriverClient:
        """A fresh plugin in place of one that died; tasks that lost the same plugin share it."""
        with self._plugin_lock:
            if self.plugins.get(driver) is dead:
                del self.plugins[driver]
                dead.kill()  # reaps the process and removes its socket
            return self._plugin(driver)

    # --- start / recover -----------------------------------------------------------------------

    def _refuse_unsupported(self) -> None:
        mode = self.group.network_mode or "host"
        if mode not in ("host", "bridge"):
            raise RunRefused(
                f'group "{self.group.name}": network mode {mode!r} is not run by driversdk run; use mode = "host" or '
                '"bridge"'
            )

    def start(self) -> None:
        self._refuse_unsupported()
        self.state.alloc_started(self.alloc_id, self.job.name, self.group.name, self.index, self.alloc_dir)
        for sub in ("alloc/logs", "alloc/tmp", "alloc/data"):
            os.makedirs(os.path.join(self.alloc_dir, sub), exist_ok=True)
        self._create_network()
        if any(r.type == "csi" for r in self.group.volumes.values()):
            self.csi = self._csi_hook()
            self.csi_sources = self.csi.prerun()
        for task in self.group.tasks:
            self._start_task(task)

    def _csi_hook(self) -> CSIHook:
        return CSIHook(
            job=self.job,
            group=self.group,
            alloc_id=self.alloc_id,
            alloc_index=self.index,
            volumes=self.node.volumes,
            registry=self.node.registry,
            store=self.node.csi_state,
            say=self.say,
            persist=lambda text: self.state.alloc_update(self.alloc_id, csi=text),
            plugin_failure=self.node.plugin_failure,
        )

    def recover(self, record: AllocRecord) -> None:
        """Take over an allocation a killed run left: no task is started twice."""
        self.state.alloc_update(self.alloc_id, run_pid=os.getpid())
        self.say(f'==> group "{self.group.name}": recovering alloc {self.alloc_id[:8]} from a previous run')
        self._reattach_plugins()
        self._restore_network(record.network)
        if any(r.type == "csi" for r in self.group.volumes.values()):
            self.csi = self._csi_hook()
            self.csi_sources = self.csi.restore(record.csi)
        records = {r.task: r for r in self.state.tasks(self.alloc_id)}
        for task in self.group.tasks:
            found = records.get(task.name)
            if found is None:
                self._start_task(task)  # the killed run had not got to it
            elif found.state == "starting":
                self._finish_interrupted_start(task, found)
            else:
                self._recover_task(task, found)

    def _finish_interrupted_start(self, task: Task, record: TaskRecord) -> None:
        """The killed run was inside StartTask: the task may exist without a handle we could recover.
        A plugin that survived and knows it removes it; then the task starts again under the same id,
        which lets a driver adopt (docker: a running container labelled with that id) or replace what
        a plugin that died with the run left, instead of starting a second copy next to it."""
        if record.logmon_pid:  # the interrupted start's collector: one collector per fifo pair
            logs = os.path.join(self.alloc_dir, "alloc", "logs")
            logcollect.stop(logcollect.Logmon(record.logmon_pid, *logcollect.fifo_paths(logs, task.name)))
        plugin = self._plugin(task.driver)
        try:
            plugin.inspect_task(record.task_id)
        except DriverSDKError:
            pass  # the plugin does not know it: the driver finds it by its id at StartTask, if it exists
        else:
            self._say_task(task.name, "was being started when the previous run was killed; replacing it")
            try:
                plugin.destroy_task(record.task_id, force=True)
            except DriverSDKError as err:
                raise RunRefused(
                    f'task "{task.name}": the previous run was killed while starting it, and the half-started task '
                    f"could not be removed: {err}; remove it by hand, then run the job again"
                ) from None
        self._start_task(task, task_id=record.task_id)

    def _recover_task(self, task: Task, record: TaskRecord) -> None:
        handle = convert.task_handle_from_proto(_handle_proto(record.handle or b""))
        plugin = self._plugin(task.driver)
        logs = os.path.join(self.alloc_dir, "alloc", "logs")
        stdout_fifo, stderr_fifo = logcollect.fifo_paths(logs, task.name)
        logmon = logcollect.Logmon(record.logmon_pid, stdout_fifo, stderr_fifo) if record.logmon_pid else None
        running = RunningTask(task, handle.config, plugin, logmon, started=True, handle=handle)
        self.tasks.append(running)
        if record.state != "running":
            running.result = ExitResult(record.exit_code or 0, record.signal or 0, record.oom)
            running.done.set()
            return
        if logmon is not None and not logcollect.alive(logmon):
            logmon = running.logmon = logcollect.spawn(logs, task.name, task.logs_max_files,
                                                       task.logs_max_file_size * MIB)  # fmt: skip
            self.state.set_logmon(self.alloc_id, task.name, logmon.pid)
        try:
            plugin.recover_task(handle)
        except DriverSDKError as err:
            self._say_task(task.name, f"could not be recovered: {err}")
            running.result = ExitResult(exit_code=1)
            self.state.finished(self.alloc_id, task.name, 1, 0, False)
            running.done.set()
            return
        self._say_task(task.name, f"recovered ({task.driver}, alloc {self.alloc_id[:8]})")
        running.supervisor = self._supervisor(task, plugin.capabilities())
        if running.supervisor is not None:
            running.supervisor.prestart()
        self._watch(running)

    # --- stop / close --------------------------------------------------------------------------

    def _stop_task(self, running: RunningTask) -> None:
        if running.started and not running.done.is_set():
            self._say_task(running.task.name, "stopping")
            try:
                timeout = parse_duration(running.task.kill_timeout, "kill_timeout")
                running.client.stop_task(running.config.id, timeout, running.task.kill_signal)
            except DriverSDKError as err:
                self._say_task(running.task.name, f"stop failed: {err}")

    def stop(self, wait: float = 60.0) -> None:
        for running in self.tasks:
            if running.supervisor is not None:
                running.supervisor.stop()
            self._stop_task(running)
        for running in self.tasks:
            running.done.wait(wait)

    def close(self) -> None:
        """Release everything this allocation holds, in reverse: tasks, log monitors, CSI
        volumes, plugin sockets, network, driver plugins. Failures are reported, not raised, so
        one stuck step does not leave the rest behind."""
        if self._closed:
            return
        self._closed = True
        for running in self.tasks:
            if running.supervisor is not None:
                running.supervisor.stop()
            if running.started:
                self.state.stopped(self.alloc_id, running.task.name)
                try:
                    running.client.destroy_task(running.config.id, force=True)
                except DriverSDKError as err:
                    self._say_task(running.task.name, f"destroy failed: {err}")
            if running.logmon is not None:
                logcollect.stop(running.logmon)
                self._log_events(running)  # what the collector reported while draining
            if running.supervisor is not None:
                running.supervisor.cleanup()
        failures = self.csi.postrun() if self.csi is not None else []
        for failure in failures:
            self.say(f'==> group "{self.group.name}": {failure}; the claim is kept until it is unmounted')
        self._destroy_network()
        for plugin in self.plugins.values():
            plugin.kill()
        self.state.plugins_gone(self.alloc_id)
        self.state.alloc_update(self.alloc_id, state="failed" if failures else "stopped")
        if self.provides_plugins:
            release_shared(csi_dir(self.client.data_dir))


def task_owner(user: str, isolation: FSIsolation) -> tuple[int, int] | None:
    """The host uid/gid a task's user maps to, where that can be known: a numeric ``uid[:gid]``
    always; a name only for drivers that run tasks as host users (their root file system is the
    host's). A name inside a container image (docker) has no host meaning: None."""
    name, _, group = user.partition(":")
    if not name:
        return (0, 0)
    if name.isdigit():
        uid = int(name)
        gid = int(group) if group.isdigit() else uid
        return (uid, gid)
    if isolation == FSIsolation.IMAGE:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return (entry.pw_uid, entry.pw_gid)


def make_secrets_dir(path: str, owner: tuple[int, int] | None) -> None:
    """``secrets/`` is 0700 and belongs to the task's user: no other local user reads a task's
    secrets. Created without following a symlink a task may have planted there."""
    try:
        os.mkdir(path, SECRETS_DIR_MODE)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, SECRETS_DIR_MODE)
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def _handle_proto(data: bytes) -> Any:
    from driversdk.pb import driver_pb2

    proto = driver_pb2.TaskHandle()
    proto.ParseFromString(data)
    return proto


def _order(job: Job) -> list[tuple[Group, int]]:
    """Groups that provide CSI plugins start first (and stop last): the others may mount through them."""
    groups = sorted(job.groups, key=lambda g: not any(t.csi_plugin is not None for t in g.tasks))
    return [(g, i) for g in groups for i in range(g.count)]


def _plan(
    job: Job, client: ClientConfig, say: Say, node: NodeServices, spare: dict[str, DriverClient]
) -> list[tuple[AllocRun, AllocRecord | None]]:
    """One AllocRun per (group, index): recovered when a previous run left it running."""
    previous = {(r.group, r.index): r for r in node.state.running_allocs(job.name)}
    for earlier in previous.values():
        if earlier.run_pid != os.getpid() and pid_alive(earlier.run_pid):
            raise AlreadyRunning(
                f'job "{job.name}" is already being run by driversdk run (pid {earlier.run_pid}); stop that run '
                "(Ctrl-C) before running the job again, or check it with `driversdk status`"
            )
    plan: list[tuple[AllocRun, AllocRecord | None]] = []
    for group, index in _order(job):
        record = previous.get((group.name, index))
        alloc = AllocRun(job, group, index, client, say, node, record.alloc_id if record else None, spare)
        plan.append((alloc, record))
    return plan


def run_job(path: str, client: ClientConfig, say: Say = print, stop: threading.Event | None = None) -> int:
    spare: dict[str, DriverClient] = {}
    report = validate_job(path, client, keep_plugins=spare)
    if not report.valid or report.parsed is None:
        for problem in report.problems:
            say(f"error {problem}")
        for plugin in spare.values():
            plugin.kill()
        return 1
    job = report.parsed
    stop = stop or threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    node = NodeServices.open(client.data_dir)
    allocs: list[AllocRun] = []
    try:
        for alloc, record in _plan(job, client, say, node, spare):
            allocs.append(alloc)
            if record is not None:
                alloc.recover(record)
            else:
                alloc.start()
            if stop.is_set():
                break
        tasks = [t for a in allocs for t in a.tasks]
        # CSI plugin tasks serve the others: the run ends when every other task has finished.
        main = [t for t in tasks if t.task.csi_plugin is None] or tasks
        while not stop.is_set() and not all(t.done.is_set() for t in main):
            stop.wait(0.2)
        if stop.is_set():
            say("==> interrupted: stopping tasks")
        results = [t.result for t in main]
        ok = all(r is not None and r.successful for r in results) and not any(t.failure for t in tasks)
        return 0 if ok and not stop.is_set() else 1
    finally:
        for alloc in reversed(allocs):
            alloc.stop()
            alloc.close()
        for plugin in spare.values():  # validation launched them; no allocation needed them
            plugin.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        node.close()
