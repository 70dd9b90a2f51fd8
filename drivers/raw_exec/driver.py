"""The raw_exec task driver: a host process per task, in its own process group and cgroup,
under a small supervisor that outlives the plugin (launch.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import signal as signals
import subprocess
import time
from typing import TYPE_CHECKING, Any

from drivers.raw_exec import reconcile
from drivers.raw_exec.cgroups import RawCgroup
from drivers.raw_exec.config import PluginConfig, TaskRawConfig, plugin_spec, task_env, task_spec
from drivers.raw_exec.store import RawState
from driversdk.errors import DriverError
from driversdk.model import (
    AgentConfig,
    Capabilities,
    ExecResult,
    Fingerprint,
    FSIsolation,
    HealthState,
    MountConfigSupport,
    NetworkIsolationMode,
    TaskConfig,
    TaskHandle,
)
from driversdk.signals import signal_number
from driversdk.taskkit import owner as kit
from driversdk.taskkit import supervisor
from driversdk.taskkit.base import KILL_WAIT, SupervisedDriver, SupervisedTask
from driversdk.taskkit.cgroups import TaskCgroup, unified_only
from driversdk.taskkit.ids import check_user_allowed, lookup_user
from driversdk.taskkit.logs import open_logs
from driversdk.taskkit.streaming import exit_result
from driversdk.taskkit.supervisor import Launch
from driversdk.taskkit.taskdirs import grant_task_dirs

if TYPE_CHECKING:
    from driversdk.hclspec import Spec  # the schema classes load when the host first asks for one

log = logging.getLogger("driversdk.raw_exec")

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


class RawExecDriver(SupervisedDriver[RawState]):
    name = "raw_exec"
    version = "0.1.0"

    def __init__(self) -> None:
        super().__init__()
        self.config = PluginConfig()
        self._reconciler = reconcile.Reconciler(
            lambda: (self.config.state_dir, self.config.reconcile_period, self.config.reconcile_creation_grace),
            self._tracked_keys,
        )

    # --- configuration ---------------------------------------------------------------------

    def _tracked_keys(self) -> set[str]:
        """What the reconciler must leave alone: every task this plugin tracks."""
        return {t.state.task_key for t in self.tasks.records()}

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
        if self.tasks.has(task.id):
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
            launch = Launch(
                path=path,
                argv=[cfg.command, *cfg.args],
                env=env,
                cwd=cwd,
                user=user if user.uid != os.geteuid() or task.user else None,
                cgroup_procs=cgroup.procs_files(),
                oom_score_adj=cfg.oom_score_adj,
                netns=netns,
            )
            fds = open_logs(task.stdout_path, task.stderr_path, task=task.name, disabled=False)
            sup_pid, task_pid = supervisor.spawn(state_dir, launch, fds[0], fds[1], task=task.name)
            # From here the host gets the handle, and with it the duty to recover or destroy the task.
            kit.save(owner_record.moved_to("started"))
        except BaseException:
            for pid in supervisor.processes_naming(state.spec_file):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signals.SIGKILL)
            self.release(state)
            raise
        finally:
            if fds is not None:
                for fd in fds:
                    os.close(fd)
        state = dataclasses.replace(state, supervisor_pid=sup_pid, task_pid=task_pid)
        log.info("started task %s as pid %d (supervisor pid %d, cgroup %s)", task.id, task_pid, sup_pid, key)
        return self.track(task, state)

    # --- what the kit asks of this driver ----------------------------------------------------

    def decode_state(self, handle: TaskHandle) -> RawState:
        return RawState.decode(handle.driver_state, handle.version)

    def task_cgroup(self, state: RawState) -> TaskCgroup:
        return state.cgroup  # reads follow a job's cgroup override

    def claim(self, state: RawState) -> None:
        if os.path.isdir(os.path.dirname(state.state_dir)):
            reconcile.claim(_record_of(state), self.config.state_dir)

    def send_signal(self, state: RawState, sig: str, *, stopping: bool) -> bool:
        # Stopping takes the whole process group: a shell and the program it runs in the
        # foreground both hear it. A signal of SignalTask goes to the task's main process.
        try:
            (os.killpg if stopping else os.kill)(state.task_pid, signal_number(sig))
        except ProcessLookupError:
            return False
        return True

    def kill_all(self, state: RawState) -> None:
        """SIGKILL the task's process group and everything in its own cgroup."""
        if state.task_pid > 0 and not supervisor.read_status(state.status_file):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(state.task_pid, signals.SIGKILL)
        state.cgroup.plain.kill_all()

    def release(self, state: RawState) -> None:
        """Remove the task's own cgroups, its state dir and its record; safe to repeat."""
        record = reconcile.load(kit.record_path(state.state_dir))
        if record is not None:
            # Should this plugin die half-way, the next one's reconciler finishes the removal.
            kit.save(record.moved_to("destroying"))
        # Whatever the task left running in its cgroup (daemons it forked) goes with it.
        state.cgroup.plain.kill_all()
        state.cgroup.plain.remove()
        if os.path.isdir(state.state_dir):
            shutil.rmtree(state.state_dir)
        kit.remove(state.state_dir)

    def driver_attributes(self, record: SupervisedTask[RawState]) -> dict[str, str]:
        return {"pid": str(record.state.task_pid)}

    def exec_command(
        self, record: SupervisedTask[RawState], command: list[str]
    ) -> tuple[list[str], dict[str, str] | None]:
        # The launcher does the task's set-up (cgroups, user, environment) in place, then execs.
        return supervisor.launcher("exec", record.state.spec_file, *command), supervisor.launcher_env()

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        argv, env = self.exec_argv(self.tasks.get(task_id), command)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=env,
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


def _record_of(state: RawState) -> reconcile.TaskRecord:
    """The record of a task the host recovers (written again if it was lost)."""
    return reconcile.TaskRecord(
        state.task_key, state.state_dir, "started", 0, 0, state.started_at, state.cgroup_v2, state.cgroup_parent
    )
