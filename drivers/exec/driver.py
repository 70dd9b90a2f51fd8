"""The exec task driver: one OCI bundle per task, started by ``runc run --detach`` under the state
dir's shared supervisor, which outlives us."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal as signals
import time
import uuid
from typing import TYPE_CHECKING, Any

from drivers.exec import reconcile
from drivers.exec import rootfs as task_root
from drivers.exec.bundle import Bundle, build_spec, check_mount_destinations, resolv_conf
from drivers.exec.config import (
    DEFAULT_STATE_DIR,
    DEFAULT_TASK_USER,
    PluginConfig,
    TaskExecConfig,
    plugin_spec,
    task_spec,
)
from drivers.exec.fingerprint import fingerprint as read_fingerprint
from drivers.exec.network import NetworkManager
from drivers.exec.owner import TaskRecord
from drivers.exec.runc import Runc
from drivers.exec.store import DriverState
from driversdk.errors import DriverError
from driversdk.model import (
    AgentConfig,
    Capabilities,
    Fingerprint,
    FSIsolation,
    HealthState,
    MountConfigSupport,
    NetworkIsolationMode,
    NetworkIsolationSpec,
    TaskConfig,
    TaskHandle,
)
from driversdk.mounts import ensure_mounts_usable
from driversdk.taskkit import supervisor
from driversdk.taskkit.base import ExecRun, SupervisedTask
from driversdk.taskkit.cgroups import TaskCgroup
from driversdk.taskkit.ids import check_user_allowed, lookup_user
from driversdk.taskkit.recorded import RecordedDriver, Start
from driversdk.taskkit.shared import Spawned
from driversdk.taskkit.supervisor import SUPERVISOR_ENV, Launch
from driversdk.taskkit.taskdirs import grant_task_dirs

if TYPE_CHECKING:
    from driversdk.hclspec import Spec  # the schema classes load when the host first asks for one

log = logging.getLogger("driversdk.exec")


def container_id_for(task_id: str) -> str:
    """runc ids allow only [\\w+-.]; Nomad task ids contain '/', so derive a stable one."""
    return "dsx-" + hashlib.sha256(task_id.encode()).hexdigest()[:24]


PID_FILE = "container.pid"


def runc_launch(runc: Runc, bundle: str, container_id: str, config: PluginConfig) -> Launch:
    """The task's launch: ``runc run --detach`` under the shared supervisor. No runc process
    stays: runc starts the container, writes its init's host pid to the pid file and exits; the
    init, re-parented to the supervisor (a child subreaper), is the task, and its own wait status
    is recorded (a signal is a signal, not 128 + N). A detached container is never deleted by
    runc: stopped, it (and its cgroup, where cgroup v1 counts OOM kills) stays for DestroyTask.
    Without a console runc hands its stdio (the task's log fifos) to the init. --no-pivot (the
    plugin's no_pivot_root) enters the root with MS_MOVE and chroot, which a root file system on
    a ramdisk (initramfs) needs."""
    program = shutil.which(runc.path, path=SUPERVISOR_ENV["PATH"])
    if program is None:
        raise DriverError(f"runc binary {runc.path!r} was not found; install runc or set the plugin's runtime_path")
    pivot = ["--no-pivot"] if config.no_pivot_root else []
    pid_file = os.path.join(bundle, PID_FILE)
    argv = runc.command("run", "--detach", "--pid-file", pid_file, *pivot, "--bundle", bundle, container_id)
    return Launch(path=os.path.abspath(program), argv=argv, env=dict(SUPERVISOR_ENV), cwd=bundle, pid_file=pid_file)


def is_supervisor(pid: int, state: DriverState) -> bool:
    """Whether ``pid`` is still this task's supervisor: the kit's, or the ``/bin/sh`` that ran
    ``runc run`` for tasks started by driversdk before the kit (it names the container id)."""
    if supervisor.is_supervisor(pid, state.spec_file):
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return argv[:1] == [b"/bin/sh"] and state.container_id.encode() in argv


class ExecDriver(RecordedDriver[DriverState, TaskRecord]):
    name = "exec"
    version = "0.1.0"
    record_type = TaskRecord
    config: PluginConfig
    dir_noun = "bundle"

    def __init__(self) -> None:
        super().__init__()
        self.config = PluginConfig()
        self._detected = False

    # --- configuration ---------------------------------------------------------------------

    def config_schema(self) -> Spec:
        return plugin_spec()

    def set_config(self, config: dict[str, Any], agent: AgentConfig | None) -> None:
        self.config = PluginConfig.from_decoded(config)
        if agent is not None:
            self.start_reconciler()

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
        return NetworkManager(
            self.config.state_dir,
            self.config.bridge_name,
            self.config.bridge_subnet,
            earlier_state_dirs=(DEFAULT_STATE_DIR,),
        )

    def fingerprint(self) -> Fingerprint:
        fp = read_fingerprint(self.runc, detected_before=self._detected)
        self._detected = self._detected or fp.health is HealthState.HEALTHY
        return fp

    # --- start: what the kit's start sequence asks ---------------------------------------------

    def logs_disabled(self) -> bool:
        return self.config.disable_log_collection

    def prepare(self, task: TaskConfig) -> Start[DriverState]:
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
        cid = container_id_for(task.id)
        task_dir = os.path.join(self.config.state_dir, "tasks", cid)
        cgroup = TaskCgroup.for_container(cid, self.config.cgroup_parent)
        spec, links = build_spec(task, cfg, self.config, user, cgroups_path=cgroup.runc_path, bundle_dir=task_dir)
        runc = self.runc

        def build() -> Launch:
            # A task user can write its own local/, secrets/ and tmp/, and the shared alloc/data.
            grant_task_dirs(task, user.uid, user.gid)
            bundle = Bundle(task_dir)
            bundle.write(spec, links, resolv_conf=resolv_conf(task.dns))
            if spec["linux"]["rootfsPropagation"] == "rshared":
                task_root.bind_self(bundle.rootfs)
            cgroup.create(task.resources)
            return runc_launch(runc, task_dir, cid, self.config)

        state = DriverState(
            container_id=cid,
            task_dir=task_dir,
            supervisor_pid=0,
            cgroup_v2=cgroup.v2,
            started_at=time.time(),
            runc_path=runc.path,
            runc_root=runc.root,
            host_pid_mode=cfg.pid_mode == "host",
            cgroup_parent=cgroup.parent,
        )
        return Start(state, build)

    def started(self, state: DriverState, run: Spawned) -> DriverState:
        return state.running(run)

    def record_of(self, state: DriverState) -> TaskRecord:
        return TaskRecord(
            phase="started",
            owner_pid=0,
            owner_start_time=0,
            since=state.started_at,
            cgroup_v2=state.cgroup_v2,
            cgroup_parent=state.cgroup_parent,
            container_id=state.container_id,
            task_dir=state.task_dir,
            runc_path=state.runc_path,
            runc_root=state.runc_root,
        )

    # --- release: what the kit removes beside the cgroup and the dir ----------------------------

    def runtime_names(self, record: TaskRecord) -> tuple[str, ...]:
        return (record.container_id,)  # runc's own processes (run, exec) name the container

    def remove_runtime(self, record: TaskRecord) -> list[str]:
        return reconcile.remove_container(record)

    def remove_dir(self, path: str) -> None:
        task_root.unmount(Bundle(path).rootfs)
        task_root.remove_task_dir(path)

    def reconcile_more(self, now: float) -> list[str]:
        tasks_dir = os.path.join(self.config.state_dir, "tasks")
        removed = reconcile.remove_bundleless_containers(self.config.runtime_path, tasks_dir)
        return removed + reconcile.reap_networks(self.networks, self.config.reconcile_creation_grace, now)

    # --- what the kit asks of this driver ----------------------------------------------------

    def decode_state(self, handle: TaskHandle) -> DriverState:
        return DriverState.decode(handle.driver_state, handle.version)

    def task_cgroup(self, state: DriverState) -> TaskCgroup:
        return TaskCgroup(state.container_id, state.cgroup_v2, state.cgroup_parent)

    def is_supervisor(self, state: DriverState) -> bool:
        return is_supervisor(state.supervisor_pid, state)

    def send_signal(self, state: DriverState, sig: str, *, stopping: bool) -> bool:
        run, signum = state.shared_run, getattr(signals.Signals, sig, None)
        if run is not None and signum is not None and not state.host_pid_mode:
            # What `runc kill` does for a container with its own pid namespace (signal its init),
            # without starting a runc process per stop, which would be most of the teardown of
            # 1000 tasks (bench_agent --count 1000).
            return run.task.send(signum)
        # In the host's pid namespace the task's own processes are not killed with its init:
        # runc finds them all in the container's cgroup.
        return self.runc.kill(state.container_id, sig, all_processes=state.host_pid_mode)

    def kill_all(self, state: DriverState) -> None:
        run = state.shared_run
        if run is not None and not state.host_pid_mode:
            # The kernel kills every process of a pid namespace whose init dies: SIGKILL to the
            # init (pinned by its pidfd) is the whole task, with no runc started per kill. An init
            # already gone took its namespace with it.
            run.task.send(signals.SIGKILL)
            return
        self.runc.kill(state.container_id, "SIGKILL", all_processes=True)

    def driver_attributes(self, record: SupervisedTask[DriverState]) -> dict[str, str]:
        return {"container_id": record.state.container_id}

    def exec_command(
        self, record: SupervisedTask[DriverState], command: list[str]
    ) -> tuple[list[str], dict[str, str] | None]:
        return self.runc.exec_command(record.state.container_id, command), None

    def exec_run(self, record: SupervisedTask[DriverState], command: list[str]) -> ExecRun:
        pid_file = os.path.join(record.state.task_dir, f"exec-{uuid.uuid4().hex}.pid")

        def kill(_runc_exec: object) -> None:
            # Killing `runc exec` would orphan the process inside the task: kill that process.
            with contextlib.suppress(OSError, ValueError), open(pid_file) as fh:
                os.kill(int(fh.read().strip()), signals.SIGKILL)

        def done() -> None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(pid_file)

        argv = self.runc.exec_command(record.state.container_id, command, pid_file=pid_file)
        return ExecRun(argv, None, kill, done, signal_in_exit_code=True)

    # --- networking --------------------------------------------------------------------------

    def create_network(self, alloc_id: str, hostname: str) -> tuple[NetworkIsolationSpec, bool]:
        return self.networks.create(alloc_id, hostname)

    def destroy_network(self, alloc_id: str, spec: NetworkIsolationSpec) -> None:
        self.networks.destroy(alloc_id)
