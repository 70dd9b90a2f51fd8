"""The exec task driver: one OCI bundle per task, run by runc under a supervisor that outlives us."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import signal as signals
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from drivers.exec import owner, reconcile, supervisor
from drivers.exec import rootfs as task_root
from drivers.exec.bundle import Bundle, build_spec, check_mount_destinations, resolv_conf
from drivers.exec.config import DEFAULT_TASK_USER, PluginConfig, TaskExecConfig, plugin_spec, task_spec
from drivers.exec.fingerprint import fingerprint as read_fingerprint
from drivers.exec.network import NetworkManager
from drivers.exec.owner import ProcessIdentity, TaskRecord
from drivers.exec.reconcile import Reconciler, ReconcileSettings, claim
from drivers.exec.runc import Runc
from drivers.exec.store import DriverState, ExecTask
from driversdk import procwatch
from driversdk.driver import DriverPlugin, ExecSession
from driversdk.errors import DriverError, TaskStillRunningError
from driversdk.exits import supervised_exit
from driversdk.model import (
    AgentConfig,
    Capabilities,
    ExecResult,
    ExitResult,
    Fingerprint,
    FSIsolation,
    HealthState,
    MountConfigSupport,
    NetworkIsolationMode,
    NetworkIsolationSpec,
    TaskConfig,
    TaskHandle,
    TaskState,
    TaskStats,
    TaskStatus,
)
from driversdk.mounts import ensure_mounts_usable
from driversdk.signals import signal_name
from driversdk.taskkit.cgroups import TaskCgroup
from driversdk.taskkit.ids import check_user_allowed, lookup_user
from driversdk.taskkit.logs import open_logs
from driversdk.taskkit.stats import task_stats
from driversdk.taskkit.streaming import run_session
from driversdk.taskkit.taskdirs import grant_task_dirs
from driversdk.taskkit.taskmap import TaskMap

if TYPE_CHECKING:
    from driversdk.hclspec import Spec  # the schema classes load when the host first asks for one

log = logging.getLogger("driversdk.exec")

DEFAULT_STOP_SIGNAL = "SIGINT"  # what Nomad's executor-based drivers send by default
KILL_WAIT = 10.0


def container_id_for(task_id: str) -> str:
    """runc ids allow only [\\w+-.]; Nomad task ids contain '/', so derive a stable one."""
    return "dsx-" + hashlib.sha256(task_id.encode()).hexdigest()[:24]


class ExecDriver(DriverPlugin):
    name = "exec"
    version = "0.1.0"

    def __init__(self) -> None:
        super().__init__()
        self.config = PluginConfig()
        self._tasks: TaskMap[ExecTask] = TaskMap()
        self._detected = False
        self._reconciler = Reconciler(self._reconcile_settings, self._tracked_keys)

    # --- configuration ---------------------------------------------------------------------

    def _tracked_keys(self) -> set[str]:
        """What the reconciler must leave alone: every task this plugin tracks."""
        return {t.state.container_id for t in self._tasks.records()}

    def config_schema(self) -> Spec:
        return plugin_spec()

    def set_config(self, config: dict[str, Any], agent: AgentConfig | None) -> None:
        self.config = PluginConfig.from_decoded(config)
        # Not in Nomad's config-validation launch (no agent config): that process lives for a
        # moment and runs no tasks. The thread reads self.config on each pass, so a later
        # SetConfig changes its period and grace.
        if agent is not None and self.config.reconcile_enabled:
            self._reconciler.start()

    def _reconcile_settings(self) -> ReconcileSettings:
        c = self.config
        return ReconcileSettings(
            state_dir=c.state_dir,
            runtime_path=c.runtime_path,
            period=c.reconcile_period,
            creation_grace=c.reconcile_creation_grace,
            bridge_name=c.bridge_name,
            bridge_subnet=c.bridge_subnet,
        )

    def shutdown(self) -> None:
        self._reconciler.stop()

    def task_config_schema(self) -> Spec:
        return task_spec()

    def capabilities(self) -> Capabilities:
        return Capabilities(
            send_signals=True,
            exec=True,
            fs_isolation=FSIsolation.CHROOT,
            network_isolation_modes=(NetworkIsolationMode.HOST, NetworkIsolationMode.GROUP),
            must_create_network=True,
            mount_configs=MountConfigSupport.ALL,
            disable_log_collection=self.config.disable_log_collection,
        )

    @property
    def runc(self) -> Runc:
        return Runc(self.config.runtime_path)

    @property
    def networks(self) -> NetworkManager:
        return NetworkManager(self.config.state_dir, self.config.bridge_name, self.config.bridge_subnet)

    def fingerprint(self) -> Fingerprint:
        fp = read_fingerprint(self.runc, detected_before=self._detected)
        self._detected = self._detected or fp.health is HealthState.HEALTHY
        return fp

    # --- start -----------------------------------------------------------------------------

    def start_task(self, task: TaskConfig) -> TaskHandle:
        if self._tasks.has(task.id):
            raise DriverError(f"task with ID {task.id!r} already started")
        # Everything that can be refused is checked before anything is created.
        cfg = TaskExecConfig.from_decoded(task.driver_config, self.config, task=task.name)
        # The user the task runs as (nobody when it names none, as Nomad's exec driver) against
        # denied_host_uids/gids, which deny root unless the operator opened them.
        user = lookup_user(task.user, task=task.name, default=DEFAULT_TASK_USER)
        check_user_allowed(user, self.config.denied_uids, self.config.denied_gids, task=task.name, plugin="exec")
        check_mount_destinations(task.mounts, task=task.name)
        ensure_mounts_usable(task.mounts, task=task.name)
        for path, what in ((task.shared_alloc_dir, "alloc"), (task.local_dir, "local"), (task.secrets_dir, "secrets")):
            if not os.path.isdir(path):
                raise DriverError(
                    f"task {task.name!r}: its {what} dir {path!r} does not exist; create the task dir first"
                )
        # A task user can write its own local/, secrets/ and tmp/, and the shared alloc/data.
        grant_task_dirs(task, user.uid, user.gid)
        cid = container_id_for(task.id)
        task_dir = os.path.join(self.config.state_dir, "tasks", cid)
        cgroup = TaskCgroup.for_container(cid, self.config.cgroup_parent)
        spec, links = build_spec(task, cfg, self.config, user, cgroups_path=cgroup.runc_path, bundle_dir=task_dir)
        runc = self.runc

        fds: tuple[int, int] | None = None
        created_dir = False
        record = TaskRecord(
            container_id=cid,
            task_dir=task_dir,
            phase="starting",
            owner_pid=0,
            owner_start_time=0,
            since=0.0,
            cgroup_v2=cgroup.v2,
            cgroup_parent=cgroup.parent,
            runc_path=runc.path,
            runc_root=runc.root,
        ).moved_to("starting", ProcessIdentity.current())
        pid = 0
        os.makedirs(os.path.dirname(task_dir), mode=0o700, exist_ok=True)
        # The record comes first and goes last: whatever a kill mid-start leaves hangs off it
        # (reconcile.py). The container id derives from the (unique per start) task id: an
        # existing record or dir means a task with this id was started before and not destroyed.
        if not owner.create(record) and not reconcile.replace_abandoned(record, self.config.state_dir):
            raise DriverError(
                f"task {task.name!r}: state of task id {task.id!r} already exists at {record.path!r}; "
                "destroy the earlier task with this id first"
            )
        try:
            try:
                os.makedirs(task_dir, mode=0o700)
            except FileExistsError:
                raise DriverError(
                    f"task {task.name!r}: state dir {task_dir!r} of task id {task.id!r} already exists; "
                    "destroy the earlier task with this id first"
                ) from None
            created_dir = True
            bundle = Bundle(task_dir)
            bundle.write(spec, links, resolv_conf=resolv_conf(task.dns))
            if spec["linux"]["rootfsPropagation"] == "rshared":
                task_root.bind_self(bundle.rootfs)
            cgroup.create(task.resources)
            fds = open_logs(
                task.stdout_path, task.stderr_path, task=task.name, disabled=self.config.disable_log_collection
            )
            started = time.time()
            state = DriverState(
                container_id=cid,
                task_dir=task_dir,
                supervisor_pid=0,
                cgroup_v2=cgroup.v2,
                started_at=started,
                runc_path=runc.path,
                host_pid_mode=cfg.pid_mode == "host",
                cgroup_parent=cgroup.parent,
            )
            pid = supervisor.spawn(
                runc.command(), task_dir, cid, state.status_file, fds[0], fds[1], no_pivot=self.config.no_pivot_root
            )
            # From here the host gets the handle, and with it the duty to recover or destroy the task.
            owner.save(record.moved_to("started", ProcessIdentity.current()))
        except BaseException:
            if pid:
                # Only the phase change failed: take the just-spawned task down again.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signals.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                cgroup.kill_all()
                with contextlib.suppress(DriverError):
                    runc.delete_force(cid)
            if created_dir:
                with contextlib.suppress(DriverError):
                    cgroup.remove()
                task_root.unmount(Bundle(task_dir).rootfs)
                task_root.remove_task_dir(task_dir)
            owner.remove(task_dir)
            raise
        finally:
            if fds is not None:
                for fd in fds:
                    os.close(fd)

        state = dataclasses.replace(state, supervisor_pid=pid)
        tracked = ExecTask(task=task, state=state, started_at=datetime.fromtimestamp(started, UTC))
        self._tasks.put(tracked)
        self._watch(tracked, own_child=True)
        log.info("started task %s as runc container %s (supervisor pid %d)", task.id, cid, pid)
        return TaskHandle(config=task, driver_state=state.encode(), state=TaskState.RUNNING)

    def _watch(self, record: ExecTask, *, own_child: bool) -> None:
        """Have the process-wide watcher report the supervisor's exit: no thread per task.

        A supervisor we spawned is our child, reaped once it exits. One a predecessor spawned is
        not: its pid may have been reused by the time we look, so the watcher checks it is still
        this container's supervisor before and after pinning it with a pidfd."""
        state = record.state
        pid = state.supervisor_pid

        def exited(_returncode: int | None) -> None:
            # The shell's own status says nothing: runc's exit code is in the status file.
            self._exited(record)

        identity = None if own_child else lambda: supervisor.is_supervisor(pid, state.container_id)
        procwatch.watch(pid, exited, reap=own_child, identity=identity)

    def _exited(self, record: ExecTask) -> None:
        """The supervisor is gone: record the task's exit. Runs on the watcher thread, which
        serves every task of this plugin, so it only reads two small files."""
        record.counter_files.close()  # no more samples: the stats stream ends with the task
        state = record.state
        ended = supervised_exit(record.task, supervisor.read_status(state.status_file), record.cgroup.oom_killed)
        record.finish(ended.result, ended.completed_at)
        if ended.event is not None:
            self.emit_event(ended.event)

    # --- recovery --------------------------------------------------------------------------

    def recover_task(self, handle: TaskHandle) -> None:
        task = handle.config
        if self._tasks.has(task.id):
            return
        state = DriverState.decode(handle.driver_state, handle.version)
        # The host holds a handle, so the task is "started" and ours from now on. A task started
        # by an older plugin version has no record yet: it gets one.
        tasks_dir = os.path.dirname(state.task_dir)
        if os.path.isdir(tasks_dir):
            claim(_record_of(state), os.path.dirname(tasks_dir))
        finished = supervisor.read_status(state.status_file) is not None
        alive = supervisor.is_supervisor(state.supervisor_pid, state.container_id)
        if not finished and not alive:
            # The supervisor is gone without a status: nobody can report this task's exit.
            # Release what is left so the host's follow-up start does not trip over it.
            self._release(state)
            raise DriverError(
                f"task {task.name!r} cannot be recovered: its supervisor (pid {state.supervisor_pid}) is gone "
                "without recording an exit status; the task will be restarted",
                recoverable=True,
            )
        record = ExecTask(task=task, state=state, started_at=datetime.fromtimestamp(state.started_at, UTC))
        self._tasks.put(record)
        self._watch(record, own_child=False)
        log.info("recovered task %s (runc container %s)", task.id, state.container_id)

    # --- wait / stop / destroy -------------------------------------------------------------

    def wait_task(self, task_id: str) -> ExitResult:
        result = self._tasks.get(task_id).exit.wait()
        assert result is not None  # no timeout: wait returns only once the exit is set
        return result

    def watch_exit(self, task_id: str, callback: Callable[[ExitResult], None]) -> bool:
        self._tasks.get(task_id).exit.add_callback(callback)
        return True

    def stop_task(self, task_id: str, timeout: float, signal: str) -> None:
        record = self._tasks.get(task_id)
        if record.exit.done:
            return
        sig = signal_name(signal or DEFAULT_STOP_SIGNAL)
        cid = record.state.container_id
        self.runc.kill(cid, sig, all_processes=record.state.host_pid_mode)
        if record.exit.wait(timeout) is not None:
            return
        log.info("task %s did not stop within %.1fs after %s; killing it", task_id, timeout, sig)
        self.runc.kill(cid, "SIGKILL", all_processes=True)
        if record.exit.wait(KILL_WAIT) is None:
            raise DriverError(
                f"task {record.task.name!r} did not exit within {KILL_WAIT:.0f}s of SIGKILL; retry stopping it",
                recoverable=True,
            )

    def destroy_task(self, task_id: str, force: bool) -> None:
        record = self._tasks.get(task_id)
        if not record.exit.done:
            if not force:
                raise TaskStillRunningError(
                    f"task {record.task.name!r} is still running; stop it first or destroy it with force"
                )
            self.runc.kill(record.state.container_id, "SIGKILL", all_processes=True)
            if record.exit.wait(KILL_WAIT) is None:
                raise DriverError(
                    f"task {record.task.name!r} did not exit within {KILL_WAIT:.0f}s of SIGKILL; retry destroying it",
                    recoverable=True,
                )
        record.counter_files.close()
        self._release(record.state)
        self._tasks.remove(task_id)

    def _release(self, state: DriverState) -> None:
        """Remove the container, the task's cgroups, its bundle and its record; safe to repeat."""
        record = owner.load(owner.record_path(state.task_dir))
        if record is not None:
            # Should this plugin die half-way, the next one's reconciler finishes the removal.
            owner.save(record.moved_to("destroying", ProcessIdentity.current()))
        runc = Runc(state.runc_path, state.runc_root)
        runc.delete_force(state.container_id)
        TaskCgroup(state.container_id, state.cgroup_v2, state.cgroup_parent).remove()
        task_root.unmount(Bundle(state.task_dir).rootfs)
        task_root.remove_task_dir(state.task_dir)
        owner.remove(state.task_dir)

    # --- inspect / signal / exec / stats ----------------------------------------------------

    def inspect_task(self, task_id: str) -> TaskStatus:
        record = self._tasks.get(task_id)
        done = record.exit.done
        return TaskStatus(
            id=record.task.id,
            name=record.task.name,
            state=TaskState.EXITED if done else TaskState.RUNNING,
            started_at=record.started_at,
            completed_at=record.completed_at if done else None,
            result=record.exit.result or ExitResult(),
            driver_attributes={"container_id": record.state.container_id},
        )

    def signal_task(self, task_id: str, signal: str) -> None:
        record = self._tasks.get(task_id)
        if record.exit.done:
            raise DriverError(f"task {record.task.name!r} has already exited; it cannot be signalled")
        sig = signal_name(signal)
        if not self.runc.kill(record.state.container_id, sig, all_processes=record.state.host_pid_mode):
            raise DriverError(f"failed to send {sig} to task {record.task.name!r}: its container is not running")

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        record = self._tasks.get(task_id)
        if not command:
            raise DriverError(f"exec in task {record.task.name!r}: the command is empty; give a program to run")
        if record.exit.done:
            raise DriverError(f"exec in task {record.task.name!r}: the task has exited")
        pid_file = os.path.join(record.state.task_dir, f"exec-{uuid.uuid4().hex}.pid")
        argv = self.runc.exec_command(record.state.container_id, command, pid_file=pid_file)
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                # Killing `runc exec` would orphan the process inside the task: kill that process.
                with contextlib.suppress(OSError, ValueError), open(pid_file) as fh:
                    os.kill(int(fh.read().strip()), signals.SIGKILL)
                try:
                    stdout, stderr = proc.communicate(timeout=KILL_WAIT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    stdout, stderr = proc.communicate()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(pid_file)
        code = proc.returncode
        sig = code - 128 if 128 < code <= 192 else (-code if code < 0 else 0)
        return ExecResult(stdout=stdout, stderr=stderr, result=ExitResult(exit_code=code, signal=sig))

    def exec_task_streaming(self, session: ExecSession) -> ExitResult:
        record = self._tasks.get(session.task_id)
        if session.tty:
            raise DriverError(f"exec in task {record.task.name!r}: tty sessions are not supported; run without -t")
        if not session.command:
            raise DriverError(f"exec in task {record.task.name!r}: the command is empty; give a program to run")
        return run_session(self.runc.exec_command(record.state.container_id, session.command), session)

    def task_stats(self, task_id: str) -> TaskStats | None:
        record = self._tasks.get(task_id)
        if record.exit.done:
            return None
        stats, record.last_sample = task_stats(record.cgroup, record.last_sample, record.counter_files)
        return stats

    # --- networking --------------------------------------------------------------------------

    def create_network(self, alloc_id: str, hostname: str) -> tuple[NetworkIsolationSpec, bool]:
        return self.networks.create(alloc_id, hostname)

    def destroy_network(self, alloc_id: str, spec: NetworkIsolationSpec) -> None:
        self.networks.destroy(alloc_id)


def _record_of(state: DriverState) -> TaskRecord:
    """The record a task started by an older plugin version (without one) is given on recovery."""
    return TaskRecord(
        container_id=state.container_id,
        task_dir=state.task_dir,
        phase="started",
        owner_pid=0,
        owner_start_time=0,
        since=state.started_at,
        cgroup_v2=state.cgroup_v2,
        cgroup_parent=state.cgroup_parent,
        runc_path=state.runc_path,
        runc_root=state.runc_root,
    )
