"""The exec task driver: one OCI bundle per task, run by runc under a supervisor that outlives us."""

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
import uuid
from typing import TYPE_CHECKING, Any

from drivers.exec import owner, reconcile
from drivers.exec import rootfs as task_root
from drivers.exec.bundle import Bundle, build_spec, check_mount_destinations, resolv_conf
from drivers.exec.config import DEFAULT_TASK_USER, PluginConfig, TaskExecConfig, plugin_spec, task_spec
from drivers.exec.fingerprint import fingerprint as read_fingerprint
from drivers.exec.network import NetworkManager
from drivers.exec.owner import ProcessIdentity, TaskRecord
from drivers.exec.reconcile import Reconciler, ReconcileSettings, claim
from drivers.exec.runc import Runc
from drivers.exec.store import DriverState
from driversdk.errors import DriverError
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
)
from driversdk.mounts import ensure_mounts_usable
from driversdk.taskkit import supervisor
from driversdk.taskkit.base import KILL_WAIT, SupervisedDriver, SupervisedTask
from driversdk.taskkit.cgroups import TaskCgroup
from driversdk.taskkit.ids import check_user_allowed, lookup_user
from driversdk.taskkit.logs import open_logs
from driversdk.taskkit.supervisor import SUPERVISOR_ENV, Launch
from driversdk.taskkit.taskdirs import grant_task_dirs

if TYPE_CHECKING:
    from driversdk.hclspec import Spec  # the schema classes load when the host first asks for one

log = logging.getLogger("driversdk.exec")


def container_id_for(task_id: str) -> str:
    """runc ids allow only [\\w+-.]; Nomad task ids contain '/', so derive a stable one."""
    return "dsx-" + hashlib.sha256(task_id.encode()).hexdigest()[:24]


def runc_launch(runc: Runc, bundle: str, container_id: str, config: PluginConfig) -> Launch:
    """The task's launch: ``runc run`` in the foreground under the kit's supervisor. --keep leaves
    the stopped container (and its cgroup, where cgroup v1 counts OOM kills) for DestroyTask;
    --no-pivot (the plugin's no_pivot_root) enters the root with MS_MOVE and chroot, which a root
    file system on a ramdisk (initramfs) needs. runc reports a signalled task as 128 + N."""
    program = shutil.which(runc.path, path=SUPERVISOR_ENV["PATH"])
    if program is None:
        raise DriverError(f"runc binary {runc.path!r} was not found; install runc or set the plugin's runtime_path")
    pivot = ["--no-pivot"] if config.no_pivot_root else []
    argv = runc.command("run", "--keep", *pivot, "--bundle", bundle, container_id)
    return Launch(
        path=os.path.abspath(program), argv=argv, env=dict(SUPERVISOR_ENV), cwd=bundle, signal_in_exit_code=True
    )


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


class ExecDriver(SupervisedDriver[DriverState]):
    name = "exec"
    version = "0.1.0"

    def __init__(self) -> None:
        super().__init__()
        self.config = PluginConfig()
        self._detected = False
        self._reconciler = Reconciler(self._reconcile_settings, self._tracked_keys)

    # --- configuration ---------------------------------------------------------------------

    def _tracked_keys(self) -> set[str]:
        """What the reconciler must leave alone: every task this plugin tracks."""
        return {t.state.container_id for t in self.tasks.records()}

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
        if self.tasks.has(task.id):
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
            pid, _runc_pid = supervisor.spawn(
                task_dir, runc_launch(runc, task_dir, cid, self.config), *fds, task=task.name
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
        log.info("started task %s as runc container %s (supervisor pid %d)", task.id, cid, pid)
        return self.track(task, state)

    # --- what the kit asks of this driver ----------------------------------------------------

    def decode_state(self, handle: TaskHandle) -> DriverState:
        return DriverState.decode(handle.driver_state, handle.version)

    def task_cgroup(self, state: DriverState) -> TaskCgroup:
        return TaskCgroup(state.container_id, state.cgroup_v2, state.cgroup_parent)

    def claim(self, state: DriverState) -> None:
        # A task started by an older plugin version has no record yet: it gets one.
        tasks_dir = os.path.dirname(state.task_dir)
        if os.path.isdir(tasks_dir):
            claim(_record_of(state), os.path.dirname(tasks_dir))

    def is_supervisor(self, state: DriverState) -> bool:
        return is_supervisor(state.supervisor_pid, state)

    def send_signal(self, state: DriverState, sig: str, *, stopping: bool) -> bool:
        # In the host's pid namespace the task's own processes are not killed with its init.
        return self.runc.kill(state.container_id, sig, all_processes=state.host_pid_mode)

    def kill_all(self, state: DriverState) -> None:
        self.runc.kill(state.container_id, "SIGKILL", all_processes=True)

    def release(self, state: DriverState) -> None:
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

    def driver_attributes(self, record: SupervisedTask[DriverState]) -> dict[str, str]:
        return {"container_id": record.state.container_id}

    def exec_command(
        self, record: SupervisedTask[DriverState], command: list[str]
    ) -> tuple[list[str], dict[str, str] | None]:
        return self.runc.exec_command(record.state.container_id, command), None

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        record = self.tasks.get(task_id)
        self.check_exec(record, command)
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
