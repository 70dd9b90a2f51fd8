"""``ProcessDriver``: a complete driver that runs each task as a host process; you say which.

Subclass it, give the task schema and :meth:`ProcessDriver.command` (the task's argv from its
decoded config) or, to choose more than the argv, :meth:`ProcessDriver.launch` (a
:class:`~driversdk.taskkit.supervisor.Launch`: program, argv, environment, working dir, user,
cgroups, network namespace), and every lifecycle call works: start (output to the host's log fifos, the task
dir as working directory, the task's environment), wait, stop with its timeout then SIGKILL,
destroy, inspect, signals, exec, stats, and recovery after the plugin process restarted.

Each task runs under the kit's supervisor (:mod:`driversdk.taskkit.supervisor`, the one the
bundled exec and raw_exec drivers use), which records the task's exit status in a file, so a
later plugin process learns how a task it did not start ended. The task leads its own process
group; signals go to the task, SIGKILL to its whole group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime

from driversdk.driver import ExecSession
from driversdk.errors import DriverError
from driversdk.model import (
    CpuField,
    CpuUsage,
    ExecResult,
    ExitResult,
    MemoryField,
    MemoryUsage,
    ResourceUsage,
    TaskConfig,
    TaskHandle,
    TaskStats,
)
from driversdk.pinning import PinError, private_dir
from driversdk.taskkit import supervisor
from driversdk.taskkit.base import SupervisedDriver, SupervisedTask
from driversdk.taskkit.cgroups import TaskCgroup
from driversdk.taskkit.logs import open_logs
from driversdk.taskkit.owner import ProcessIdentity, stat_fields
from driversdk.taskkit.streaming import run_session
from driversdk.taskkit.supervisor import Launch

# 2: the kit's supervisor (task pid, task dir). 1, still read: a shim that forwarded signals.
STATE_VERSION = 2


@dataclass(frozen=True)
class ProcessState:
    """What recovers a task (TaskHandle.driver_state)."""

    supervisor_pid: int
    supervisor_start_time: int
    pid: int
    """Whom signals go to: the task, leader of its own process group."""
    task_dir: str
    """Its launch spec and status file ("" for a version-1 task: ``result_file`` then)."""
    started_at: float
    result_file: str = ""

    @property
    def status_file(self) -> str:
        return self.result_file or os.path.join(self.task_dir, supervisor.STATUS_FILE)

    @property
    def spec_file(self) -> str:
        return os.path.join(self.task_dir, supervisor.SPEC_FILE)

    @property
    def supervisor(self) -> ProcessIdentity:
        return ProcessIdentity(self.supervisor_pid, self.supervisor_start_time)

    def encode(self) -> bytes:
        fields = dataclasses.asdict(self)
        del fields["result_file"]  # only a version-1 handle has one
        return json.dumps(fields).encode()

    @classmethod
    def decode(cls, data: bytes, version: int) -> ProcessState:
        raw = json.loads(data)
        if version == 1:  # the shim: it led the task's group, forwarded signals, wrote result_file
            pid = int(raw["pid"])
            return cls(pid, int(raw["start_time"]), pid, "", float(raw["started_at"]), str(raw["result_file"]))
        return cls(
            int(raw["supervisor_pid"]),
            int(raw["supervisor_start_time"]),
            int(raw["pid"]),
            str(raw["task_dir"]),
            float(raw["started_at"]),
        )


ProcessTask = SupervisedTask[ProcessState]


class ProcessDriver(SupervisedDriver[ProcessState]):
    """A driver whose tasks are host processes. Implement ``task_config_schema`` and ``command``
    (or ``launch``)."""

    default_stop_signal = "SIGTERM"

    def command(self, task: TaskConfig) -> list[str]:
        """The argv to run for ``task`` (``task.driver_config`` is decoded by then)."""
        raise NotImplementedError(f"{type(self).__name__}.command(task) must return the argv to run")

    def launch(self, task: TaskConfig) -> Launch:
        """How to run ``task``: by default ``command(task)`` found on the task's PATH, with the
        task's environment, in its task dir, as the plugin's user. Override to choose more."""
        argv = [str(a) for a in self.command(task)]
        if not argv or not argv[0]:
            raise DriverError(f"task {task.name!r}: {type(self).__name__}.command returned an empty argv")
        cwd = task.task_dir if os.path.isdir(task.task_dir) else "/"
        return Launch(path=self.find_program(task, argv[0], cwd), argv=argv, env=dict(task.env), cwd=cwd)

    @staticmethod
    def find_program(task: TaskConfig, program: str, cwd: str) -> str:
        """``program`` as a path the supervisor can exec: a path with a '/' from ``cwd``, a bare
        name on the task's PATH (the plugin's when the task sets none)."""
        path = task.env.get("PATH", os.environ.get("PATH", os.defpath))
        found = os.path.join(cwd, program) if "/" in program else shutil.which(program, path=path)
        if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
            raise DriverError(
                f"task {task.name!r}: cannot run {program!r}: it is not an executable file on the task's PATH"
            )
        return os.path.abspath(found)

    @property
    def state_dir(self) -> str:
        """Where the tasks' launch specs and exit files live: kept across plugin restarts, private."""
        path = os.path.join(tempfile.gettempdir(), f"driversdk-{self.name}-{os.geteuid()}")
        # The temp dir is shared with every user: a name someone else made first (a symlink, their
        # dir, or one they may write) would let them plant or redirect the exit files we trust.
        try:
            private_dir(path)
        except PinError as err:
            raise DriverError(f"{type(self).__name__}: {err.reason} and start the task again") from None
        return path

    def start_task(self, task: TaskConfig) -> TaskHandle:
        if self.tasks.has(task.id):
            raise DriverError(f"task with ID {task.id!r} already started")
        launch = self.launch(task)
        entry = task.id.replace("/", "_")
        if entry in ("", ".", ".."):  # would name the state dir or its parent, which rmtree below empties
            raise DriverError(f"task ID {task.id!r} cannot name a directory; the host must give each task its own ID")
        task_dir = os.path.join(self.state_dir, entry)
        shutil.rmtree(task_dir, ignore_errors=True)  # an earlier start of this id, never destroyed
        os.mkdir(task_dir, 0o700)
        try:
            out, err = open_logs(task.stdout_path, task.stderr_path, task=task.name, disabled=False)
            try:
                sup_pid, pid = supervisor.spawn(task_dir, launch, out, err, task=task.name)
            finally:
                os.close(out)
                os.close(err)
        except BaseException:
            shutil.rmtree(task_dir, ignore_errors=True)
            raise
        sup = ProcessIdentity.of(sup_pid) or ProcessIdentity(sup_pid, 0)
        state = ProcessState(sup.pid, sup.start_time, pid, task_dir, datetime.now(UTC).timestamp())
        return self.track(task, state, version=STATE_VERSION)

    # --- what the kit asks of this driver ----------------------------------------------------

    def decode_state(self, handle: TaskHandle) -> ProcessState:
        try:
            return ProcessState.decode(handle.driver_state, handle.version)
        except (ValueError, KeyError, TypeError):
            raise DriverError(
                f"task {handle.config.name!r} cannot be recovered: its handle's driver state is not what "
                f"{type(self).__name__} wrote"
            ) from None

    def task_cgroup(self, state: ProcessState) -> TaskCgroup | None:
        return None  # stats from /proc: a driver without root has no cgroup of its own

    def is_supervisor(self, state: ProcessState) -> bool:
        return state.supervisor.alive()

    def send_signal(self, state: ProcessState, sig: str, *, stopping: bool) -> bool:
        signum = signal.Signals[sig]
        if not state.supervisor.alive():  # the pid may be another process's by now
            return False
        with contextlib.suppress(ProcessLookupError):
            (os.killpg if signum is signal.SIGKILL else os.kill)(state.pid, signum)
        return True

    def kill_all(self, state: ProcessState) -> None:
        self.send_signal(state, "SIGKILL", stopping=True)

    def release(self, state: ProcessState) -> None:
        if state.task_dir:
            shutil.rmtree(state.task_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(state.status_file)

    def driver_attributes(self, record: ProcessTask) -> dict[str, str]:
        return {"pid": str(record.state.pid)}

    def exec_command(self, record: ProcessTask, command: list[str]) -> tuple[list[str], dict[str, str] | None]:
        # run_session has no cwd: a shell changes into the task dir, then becomes the command.
        task = record.task
        cwd = task.task_dir if os.path.isdir(task.task_dir) else "."
        return ["/bin/sh", "-c", 'cd "$0" 2>/dev/null; exec "$@"', cwd, *command], dict(task.env)

    # --- what differs from the kit's defaults ------------------------------------------------

    def destroy_task(self, task_id: str, force: bool) -> None:
        if self.tasks.has(task_id):  # destroying twice is not an error: it is gone either way
            super().destroy_task(task_id, force)

    def signal_task(self, task_id: str, signal_name: str) -> None:
        record = self.tasks.get(task_id)
        if not record.exit.done:
            self._signal(record, signal_name)

    def _signal(self, record: ProcessTask, name: str) -> None:
        try:
            sig = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"].name
        except KeyError:
            raise DriverError(
                f"task {record.task.name!r}: unknown signal {name!r}; use a name such as SIGHUP"
            ) from None
        self.send_signal(record.state, sig, stopping=False)

    def _kill(self, record: ProcessTask) -> None:
        self._kill_and_wait(record, "stopping")

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        record = self.tasks.get(task_id)
        task = record.task
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                cwd=task.task_dir if os.path.isdir(task.task_dir) else None,
                env=dict(task.env),
            )
        except subprocess.TimeoutExpired as exc:
            return ExecResult(_bytes(exc.stdout), _bytes(exc.stderr), ExitResult(signal=int(signal.SIGKILL)))
        except OSError as exc:
            raise DriverError(f"task {task.name!r}: cannot exec {command[:1]!r}: {exc.strerror}") from None
        code = done.returncode
        result = ExitResult(exit_code=code) if code >= 0 else ExitResult(signal=-code)
        return ExecResult(done.stdout, done.stderr, result)

    def exec_task_streaming(self, session: ExecSession) -> ExitResult:
        record = self.tasks.get(session.task_id)
        argv, env = self.exec_command(record, session.command)
        return run_session(argv, session, env=env)

    def task_stats(self, task_id: str) -> TaskStats | None:
        record = self.tasks.get(task_id)
        if record.exit.done:
            return None  # ends the stream
        user = system = 0.0
        rss = 0
        ticks = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        for pid in _group_members(record.state.pid):
            fields = stat_fields(pid)
            if fields is None:
                continue
            user += int(fields[11]) / ticks
            system += int(fields[12]) / ticks
            rss += int(fields[21]) * page
        return TaskStats(
            timestamp=datetime.now(UTC),
            id=task_id,
            usage=ResourceUsage(
                cpu=CpuUsage(
                    user_mode=user, system_mode=system, measured_fields=(CpuField.USER_MODE, CpuField.SYSTEM_MODE)
                ),
                memory=MemoryUsage(rss=rss, measured_fields=(MemoryField.RSS,)),
            ),
        )


def _bytes(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else value


def _group_members(pgid: int) -> list[int]:
    """Every live process of the task's process group (the task and its children)."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            # fields[2] is the process group id (field 5 of /proc/<pid>/stat).
            if fields is not None and len(fields) > 21 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                members.append(int(name))
    return members


__all__ = ["ProcessDriver", "ProcessTask"]
