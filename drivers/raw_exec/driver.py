"""The raw_exec task driver: a host process per task, in its own process group and cgroup,
under a small supervisor that outlives the plugin (launch.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal as signals
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from drivers.raw_exec import reconcile, supervisor
from drivers.raw_exec.cgroups import RawCgroup
from drivers.raw_exec.config import PluginConfig, TaskRawConfig, plugin_spec, task_env, task_spec
from drivers.raw_exec.store import RawState, RawTask
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
    TaskConfig,
    TaskHandle,
    TaskState,
    TaskStats,
    TaskStatus,
)
from driversdk.signals import signal_name, signal_number
from driversdk.taskkit import owner as kit
from driversdk.taskkit.cgroups import unified_only
from driversdk.taskkit.ids import check_user_allowed, lookup_user
from driversdk.taskkit.logs import open_logs
from driversdk.taskkit.stats import task_stats
from driversdk.taskkit.streaming import exit_result, run_session
from driversdk.taskkit.taskdirs import grant_task_dirs
from driversdk.taskkit.taskmap import TaskMap

if TYPE_CHECKING:
    from driversdk.hclspec import Spec  # the schema classes load when the host first asks for one

log = logging.getLogger("driversdk.raw_exec")

DEFAULT_STOP_SIGNAL = "SIGINT"  # what Nomad's executor sends when the job names no kill_signal
KILL_WAIT = 10.0
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class DriverDisabledError(DriverError):
    """StartTask on a client whose plugin config leaves raw_exec disabled (Nomad's default)."""


def task_key_for(task_id: str) -> str:
    """Nomad task ids contain '/': a stable name for the task's cgroup and state dir."""
    return "dsr-" + hashlib.sha256(task_id.encode()).hexdigest()[:24]


def resolve_command(command: str, task: TaskConfig, env: dict[str, str]) -> str:
    """The program to run, found the way Nomad's executor finds it for a task without isolation:
    an absolute path as given; a relative path below the task dir; a bare name in ``local/``,
    then the task dir, then the task's PATH."""
    if os.path.isabs(command):
        candidates = [command]
    elif "/" in command:
        candidates = [os.path.join(task.task_dir, command)]
    else:
        candidates = [os.path.join(task.local_dir, command), os.path.join(task.task_dir, command)]
        candidates += [os.path.join(d, command) for d in (env.get("PATH") or DEFAULT_PATH).split(":") if d]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise DriverError(
        f"task {task.name!r} config: command {command!r} was not found as an executable file "
        f"(looked at {', '.join(candidates[:4])}{', …' if len(candidates) > 4 else ''}); "
        "give an absolute path or install the program"
    )


class RawExecDriver(DriverPlugin):
    name = "raw_exec"
    version = "0.1.0"

    def __init__(self) -> None:
        super().__init__()
        self.config = PluginConfig()
        self._tasks: TaskMap[RawTask] = TaskMap()
        self._reconciler = reconcile.Reconciler(
            lambda: (self.config.state_dir, self.config.reconcile_period, self.config.reconcile_creation_grace),
            self._tracked_keys,
        )

    # --- configuration ---------------------------------------------------------------------

    def _tracked_keys(self) -> set[str]:
        """What the reconciler must leave alone: every task this plugin tracks."""
        return {t.state.task_key for t in self._tasks.records()}

    def config_schema(self) -> Spec:
        return plugin_spec()

    def set_config(self, config: dict[str, Any], agent: AgentConfig | None) -> None:
        enabled_before = self.config.enabled
        self.config = PluginConfig.from_decoded(config)
        if self.config.enabled != enabled_before:
            self.notify_fingerprint_changed()
        # Not in Nomad's config-validation launch (no agent config), which runs no tasks.
        if agent is not None and self.config.enabled and self.config.reconcile_enabled:
            self._reconciler.start()

    def shutdown(self) -> None:
        self._reconciler.stop()

    def task_config_schema(self) -> Spec:
        return task_spec()

    def capabilities(self) -> Capabilities:
        return Capabilities(
            send_signals=True,
            exec=True,
            fs_isolation=FSIsolation.NONE,
            network_isolation_modes=(NetworkIsolationMode.HOST, NetworkIsolationMode.GROUP),
            mount_configs=MountConfigSupport.NONE,
        )

    def fingerprint(self) -> Fingerprint:
        if not self.config.enabled:
            return Fingerprint(HealthState.UNDETECTED, "disabled")
        if os.geteuid() != 0:
            return Fingerprint(
                HealthState.UNDETECTED, "raw_exec driver must run as root (each task gets its own cgroup)"
            )
        return Fingerprint(HealthState.HEALTHY, "Healthy", {"driver.raw_exec": True})

    # --- start -----------------------------------------------------------------------------

    def start_task(self, task: TaskConfig) -> TaskHandle:
        if not self.config.enabled:
            raise DriverDisabledError(
                f"task {task.name!r}: the raw_exec driver is disabled on this client; an operator enables it "
                'in the client config with plugin "raw_exec" { config { enabled = true } }'
            )
        if self._tasks.has(task.id):
            raise DriverError(f"task with ID {task.id!r} already started")
        # Everything that can be refused is checked before anything is created.
        cfg = TaskRawConfig.from_decoded(task.driver_config, task=task.name)
        user = lookup_user(task.user, task=task.name)
        check_user_allowed(user, self.config.denied_uids, self.config.denied_gids, task=task.name, plugin="raw_exec")
        key = task_key_for(task.id)
        cgroup = RawCgroup(
            key, unified_only(), self.config.cgroup_parent, cfg.cgroup_v1_override, cfg.cgroup_v2_override
        )
        cgroup.check_overrides(task=task.name)
        env = task_env(dict(task.env), self.config.denied_envvars, cfg.denied_envvars)
        path = resolve_command(cfg.command, task, env)
        cwd = cfg.work_dir or task.task_dir
        if not os.path.isdir(cwd):
            raise DriverError(f"task {task.name!r} config: work_dir {cwd!r} is not an existing directory on the host")
        netns = ""
        net = task.network_isolation_spec
        if net is not None and net.mode == NetworkIsolationMode.GROUP and net.path:
            netns = net.path

        state_dir = os.path.join(self.config.state_dir, "tasks", key)
        os.makedirs(os.path.dirname(state_dir), mode=0o700, exist_ok=True)
        # The record comes first and goes last: whatever a kill mid-start leaves hangs off it.
        owner_record = reconcile.TaskRecord(key, state_dir, "starting", 0, 0, 0.0, cgroup.v2, cgroup.parent).moved_to(
            "starting"
        )
        if not kit.create(owner_record) and not reconcile.replace_abandoned(owner_record, self.config.state_dir):
            raise DriverError(
                f"task {task.name!r}: state of task id {task.id!r} already exists at {owner_record.path!r}; "
                "destroy the earlier task with this id first"
            )
        try:
            os.mkdir(state_dir, 0o700)
        except FileExistsError:
            kit.remove(state_dir)
            raise DriverError(
                f"task {task.name!r}: state dir {state_dir!r} of task id {task.id!r} already exists; "
                "destroy the earlier task with this id first"
            ) from None
        state = RawState(
            task_key=key,
            state_dir=state_dir,
            supervisor_pid=0,
            task_pid=0,
            started_at=time.time(),
            cgroup_v2=cgroup.v2,
            cgroup_parent=cgroup.parent,
            cgroup_v1_override=dict(cfg.cgroup_v1_override),
            cgroup_v2_override=cfg.cgroup_v2_override,
        )
        fds: tuple[int, int] | None = None
        try:
            grant_task_dirs(task, user.uid, user.gid)
            cgroup.create(task.resources)
            spec = {
                "path": path,
                "argv": [cfg.command, *cfg.args],
                "env": env,
                "cwd": cwd,
                "switch_user": user.uid != os.geteuid() or bool(task.user),
                "uid": user.uid,
                "gid": user.gid,
                "groups": list(user.groups),
                "oom_score_adj": cfg.oom_score_adj,
                "cgroup_procs": cgroup.procs_files(),
                "netns": netns,
                "status_file": state.status_file,
            }
            fd = os.open(state.spec_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(spec, fh)
            fds = open_logs(task.stdout_path, task.stderr_path, task=task.name, disabled=False)
            sup_pid, task_pid = supervisor.spawn(state.spec_file, fds[0], fds[1], task=task.name)
            # From here the host gets the handle, and with it the duty to recover or destroy the task.
            kit.save(owner_record.moved_to("started"))
        except BaseException:
            for pid in reconcile.supervisor_processes(state.state_dir):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signals.SIGKILL)
            state.cgroup.plain.kill_all()
            self._release(state)
            raise
        finally:
            if fds is not None:
                for fd in fds:
                    os.close(fd)
        state = dataclasses.replace(state, supervisor_pid=sup_pid, task_pid=task_pid)
        record = RawTask(task=task, state=state, started_at=datetime.fromtimestamp(state.started_at, UTC))
        self._tasks.put(record)
        self._watch(record, own_child=True)
        log.info("started task %s as pid %d (supervisor pid %d, cgroup %s)", task.id, task_pid, sup_pid, key)
        return TaskHandle(config=task, driver_state=state.encode(), state=TaskState.RUNNING)

    def _watch(self, record: RawTask, *, own_child: bool) -> None:
        """Have the process-wide watcher report the supervisor's exit: no thread per task.

        A supervisor we spawned is our child, reaped once it exits. One a predecessor spawned is
        not: its pid may have been reused by the time we look, so the watcher checks it is still
        this task's supervisor before and after pinning it with a pidfd."""
        state = record.state
        pid = state.supervisor_pid

        def exited(_returncode: int | None) -> None:
            # The task's exit is in the status file the supervisor wrote, not in its own status.
            self._exited(record)

        identity = None if own_child else lambda: supervisor.is_supervisor(pid, state.spec_file)
        procwatch.watch(pid, exited, reap=own_child, identity=identity)

    def _exited(self, record: RawTask) -> None:
        """The supervisor is gone: record the task's exit. Runs on the watcher thread, which
        serves every task of this plugin, so it only reads two small files."""
        state = record.state
        ended = supervised_exit(record.task, supervisor.read_status(state.status_file), state.cgroup.oom_killed)
        record.finish(ended.result, ended.completed_at)
        if ended.event is not None:
            self.emit_event(ended.event)

    # --- recovery --------------------------------------------------------------------------

    def recover_task(self, handle: TaskHandle) -> None:
        task = handle.config
        if self._tasks.has(task.id):
            return
        state = RawState.decode(handle.driver_state, handle.version)
        # The host holds a handle: the task is "started" and this plugin its owner from now on.
        if os.path.isdir(os.path.dirname(state.state_dir)):
            reconcile.claim(_record_of(state), self.config.state_dir)
        finished = supervisor.read_status(state.status_file) is not None
        if not finished and not supervisor.is_supervisor(state.supervisor_pid, state.spec_file):
            # Nobody is left to report this task's exit: release what remains so the host's
            # follow-up start does not trip over it.
            self._kill_all(state)
            self._release(state)
            raise DriverError(
                f"task {task.name!r} cannot be recovered: its supervisor (pid {state.supervisor_pid}) is gone "
                "without recording an exit status; the task will be restarted",
                recoverable=True,
            )
        record = RawTask(task=task, state=state, started_at=datetime.fromtimestamp(state.started_at, UTC))
        self._tasks.put(record)
        self._watch(record, own_child=False)
        log.info("recovered task %s (pid %d, supervisor pid %d)", task.id, state.task_pid, state.supervisor_pid)

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
        sig = signal_number(signal or DEFAULT_STOP_SIGNAL)
        # The whole process group: a shell and the program it runs in the foreground both hear it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.state.task_pid, sig)
        if record.exit.wait(timeout) is not None:
            return
        log.info(
            "task %s did not stop within %.1fs after %s; killing it",
            task_id,
            timeout,
            signal_name(signal or DEFAULT_STOP_SIGNAL),
        )
        self._kill_all(record.state)
        if record.exit.wait(KILL_WAIT) is None:
            raise DriverError(
                f"task {record.task.name!r} did not exit within {KILL_WAIT:.0f}s of SIGKILL; retry stopping it",
                recoverable=True,
            )

    def _kill_all(self, state: RawState) -> None:
        """SIGKILL the task's process group and everything in its own cgroup."""
        if state.task_pid > 0 and not supervisor.read_status(state.status_file):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(state.task_pid, signals.SIGKILL)
        state.cgroup.plain.kill_all()

    def destroy_task(self, task_id: str, force: bool) -> None:
        record = self._tasks.get(task_id)
        if not record.exit.done:
            if not force:
                raise TaskStillRunningError(
                    f"task {record.task.name!r} is still running; stop it first or destroy it with force"
                )
            self._kill_all(record.state)
            if record.exit.wait(KILL_WAIT) is None:
                raise DriverError(
                    f"task {record.task.name!r} did not exit within {KILL_WAIT:.0f}s of SIGKILL; retry destroying it",
                    recoverable=True,
                )
        # Whatever the task left running in its cgroup (daemons it forked) goes with it.
        record.state.cgroup.plain.kill_all()
        self._release(record.state)
        self._tasks.remove(task_id)

    def _release(self, state: RawState) -> None:
        """Remove the task's own cgroups, its state dir and its record; safe to repeat."""
        record = reconcile.load(kit.record_path(state.state_dir))
        if record is not None:
            # Should this plugin die half-way, the next one's reconciler finishes the removal.
            kit.save(record.moved_to("destroying"))
        state.cgroup.plain.remove()
        if os.path.isdir(state.state_dir):
            shutil.rmtree(state.state_dir)
        kit.remove(state.state_dir)

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
            driver_attributes={"pid": str(record.state.task_pid)},
        )

    def signal_task(self, task_id: str, signal: str) -> None:
        record = self._tasks.get(task_id)
        if record.exit.done:
            raise DriverError(f"task {record.task.name!r} has already exited; it cannot be signalled")
        sig = signal_number(signal)
        try:
            os.kill(record.state.task_pid, sig)
        except ProcessLookupError:
            raise DriverError(
                f"failed to send {signal_name(signal)} to task {record.task.name!r}: it is not running"
            ) from None

    def _exec_argv(self, record: RawTask, command: list[str]) -> list[str]:
        if not command:
            raise DriverError(f"exec in task {record.task.name!r}: the command is empty; give a program to run")
        if record.exit.done:
            raise DriverError(f"exec in task {record.task.name!r}: the task has exited")
        return supervisor.launcher("exec", record.state.spec_file, *command)

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        record = self._tasks.get(task_id)
        argv = self._exec_argv(record, command)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=supervisor.launcher_env(),
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The launcher exec'd the command itself: killing its group kills the command and its children.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signals.SIGKILL)
            try:
                stdout, stderr = proc.communicate(timeout=KILL_WAIT)
            except subprocess.TimeoutExpired:
                # Something the command started in another session still holds the pipes open.
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
                proc.wait()
                stdout, stderr = b"", b""
        return ExecResult(stdout=stdout, stderr=stderr, result=exit_result(proc.returncode))

    def exec_task_streaming(self, session: ExecSession) -> ExitResult:
        record = self._tasks.get(session.task_id)
        if session.tty:
            raise DriverError(f"exec in task {record.task.name!r}: tty sessions are not supported; run without -t")
        return run_session(self._exec_argv(record, session.command), session, env=supervisor.launcher_env())

    def task_stats(self, task_id: str) -> TaskStats | None:
        record = self._tasks.get(task_id)
        if record.exit.done:
            return None
        stats, record.last_sample = task_stats(record.state.cgroup, record.last_sample)
        return stats


def _record_of(state: RawState) -> reconcile.TaskRecord:
    """The record of a task the host recovers (written again if it was lost)."""
    return reconcile.TaskRecord(
        state.task_key, state.state_dir, "started", 0, 0, state.started_at, state.cgroup_v2, state.cgroup_parent
    )
