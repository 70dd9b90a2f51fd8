"""The raw_exec task driver: a host process per task, in its own process group and cgroup,
a child of the plugin state dir's shared supervisor, which outlives the plugin (launch.py serve)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal as signals
import time
from typing import TYPE_CHECKING, Any

from drivers.raw_exec.cgroups import RawCgroup
from drivers.raw_exec.config import PluginConfig, TaskRawConfig, plugin_spec, task_env, task_spec
from drivers.raw_exec.reconcile import TaskRecord
from drivers.raw_exec.store import RawState
from driversdk.errors import DriverError
from driversdk.model import (
    AgentConfig,
    Capabilities,
    Fingerprint,
    FSIsolation,
    HealthState,
    MountConfigSupport,
    NetworkIsolationMode,
    TaskConfig,
    TaskHandle,
)
from driversdk.signals import signal_number
from driversdk.taskkit import supervisor
from driversdk.taskkit.base import SupervisedTask
from driversdk.taskkit.cgroups import TaskCgroup, unified_only
from driversdk.taskkit.ids import check_user_allowed, lookup_user
from driversdk.taskkit.recorded import RecordedDriver, Start
from driversdk.taskkit.shared import Spawned
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


class RawExecDriver(RecordedDriver[RawState, TaskRecord]):
    name = "raw_exec"
    version = "0.1.0"
    record_type = TaskRecord
    config: PluginConfig

    def __init__(self) -> None:
        super().__init__()
        self.config = PluginConfig()

    # --- configuration ---------------------------------------------------------------------

    def config_schema(self) -> Spec:
        return plugin_spec()

    def set_config(self, config: dict[str, Any], agent: AgentConfig | None) -> None:
        enabled_before = self.config.enabled
        self.config = PluginConfig.from_decoded(config)
        if self.config.enabled != enabled_before:
            self.notify_fingerprint_changed()
        if agent is not None and self.config.enabled:
            self.start_reconciler()

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

    # --- start: what the kit's start sequence asks ---------------------------------------------

    def prepare(self, task: TaskConfig) -> Start[RawState]:
        if not self.config.enabled:
            raise DriverDisabledError(
                f"task {task.name!r}: the raw_exec driver is disabled on this client; an operator enables it "
                'in the client config with plugin "raw_exec" { config { enabled = true } }'
            )
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
        net = task.network_isolation_spec
        netns = net.path if net is not None and net.mode == NetworkIsolationMode.GROUP and net.path else ""

        def build() -> Launch:
            grant_task_dirs(task, user.uid, user.gid)
            cgroup.create(task.resources)
            return Launch(
                path=path,
                argv=[cfg.command, *cfg.args],
                env=env,
                cwd=cwd,
                user=user if user.uid != os.geteuid() or task.user else None,
                cgroup_procs=cgroup.procs_files(),
                oom_score_adj=cfg.oom_score_adj,
                netns=netns,
            )

        state = RawState(
            task_key=key,
            state_dir=os.path.join(self.config.state_dir, "tasks", key),
            supervisor_pid=0,
            task_pid=0,
            started_at=time.time(),
            cgroup_v2=cgroup.v2,
            cgroup_parent=cgroup.parent,
            cgroup_v1_override=dict(cfg.cgroup_v1_override),
            cgroup_v2_override=cfg.cgroup_v2_override,
        )
        return Start(state, build)

    def started(self, state: RawState, run: Spawned) -> RawState:
        return state.running(run)

    def record_of(self, state: RawState) -> TaskRecord:
        return TaskRecord(
            phase="started",
            owner_pid=0,
            owner_start_time=0,
            since=state.started_at,
            cgroup_v2=state.cgroup_v2,
            cgroup_parent=state.cgroup_parent,
            task_key=state.task_key,
            state_dir=state.state_dir,
        )

    # --- what the kit asks of this driver ----------------------------------------------------

    def decode_state(self, handle: TaskHandle) -> RawState:
        return RawState.decode(handle.driver_state, handle.version)

    def task_cgroup(self, state: RawState) -> TaskCgroup:
        return state.cgroup  # reads follow a job's cgroup override

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

    def driver_attributes(self, record: SupervisedTask[RawState]) -> dict[str, str]:
        return {"pid": str(record.state.task_pid)}

    def exec_command(
        self, record: SupervisedTask[RawState], command: list[str]
    ) -> tuple[list[str], dict[str, str] | None]:
        # The launcher does the task's set-up (cgroups, user, environment) in place, then execs.
        return supervisor.launcher("exec", record.state.spec_file, *command), supervisor.launcher_env()
