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
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from driversdk import procwatch
from driversdk.driver import DriverPlugin, ExecSession
from driversdk.errors import DriverError, TaskStillRunningError
from driversdk.exits import ExitSlot
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
    TaskState,
    TaskStats,
    TaskStatus,
)
from driversdk.taskkit import supervisor
from driversdk.taskkit.logs import open_logs
from driversdk.taskkit.owner import ProcessIdentity
from driversdk.taskkit.streaming import run_session
from driversdk.taskkit.supervisor import Launch
from driversdk.taskkit.taskmap import TaskMap

# 2: the kit's supervisor (task pid, task dir). 1, still read: a shim that forwarded signals.
STATE_VERSION = 2


@dataclass
class ProcessTask:
    """The driver's record of one task: its supervisor, the task's pid and how it ended."""

    task: TaskConfig
    supervisor: ProcessIdentity
    pid: int
    """Whom signals go to: the task, leader of its own process group."""
    status_file: str
    task_dir: str
    """Its launch spec and status file; removed on destroy ("" for a version-1 task)."""
    started_at: datetime
    exit: ExitSlot = field(default_factory=ExitSlot)
    completed_at: datetime | None = None
    killed: bool = False  # we sent SIGKILL to the group


class ProcessDriver(DriverPlugin):
    """A driver whose tasks are host processes. Implement ``task_config_schema`` and ``command``
    (or ``launch``)."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: TaskMap[ProcessTask] = TaskMap()

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
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        # The temp dir is shared with every user: a name someone else made first (a symlink, their
        # dir, or one they may write) would let them plant or redirect the exit files we trust.
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise DriverError(
                f"{type(self).__name__}: {path} is not a private directory of uid {os.geteuid()} "
                "(a symlink, another user's, or open to others); remove it and start the task again"
            )
        return path

    # --- lifecycle ---------------------------------------------------------------------------

    def start_task(self, task: TaskConfig) -> TaskHandle:
        if self.tasks.has(task.id):
            raise DriverError(f"task with ID {task.id!r} already started")
        launch = self.launch(task)
        task_dir = os.path.join(self.state_dir, task.id.replace("/", "_"))
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
        status_file = os.path.join(task_dir, supervisor.STATUS_FILE)
        record = ProcessTask(task, sup, pid, status_file, task_dir, datetime.now(UTC))
        self.tasks.put(record)
        procwatch.watch(sup_pid, lambda code: self._exited(record, code), reap=True)
        state = {
            "supervisor_pid": sup.pid,
            "supervisor_start_time": sup.start_time,
            "pid": pid,
            "task_dir": task_dir,
            "started_at": record.started_at.timestamp(),
        }
        return TaskHandle(
            config=task, driver_state=json.dumps(state).encode(), version=STATE_VERSION, state=TaskState.RUNNING
        )

    def _exited(self, record: ProcessTask, code: int | None) -> None:
        record.completed_at = datetime.now(UTC)
        status = supervisor.read_status(record.status_file)
        if status is not None:
            record.exit.set(ExitResult(exit_code=status.exit_code, signal=status.signal))
        elif code is not None and code < 0:  # no record: the supervisor itself was killed
            record.exit.set(ExitResult(signal=-code))
        else:
            record.exit.set(ExitResult(signal=int(signal.SIGKILL)))

    def recover_task(self, handle: TaskHandle) -> None:
        if self.tasks.has(handle.config.id):
            return
        name = handle.config.name
        try:
            state = json.loads(handle.driver_state)
            started_at = datetime.fromtimestamp(float(state["started_at"]), UTC)
            if handle.version == 1:  # the shim: signalled itself, wrote result_file
                sup = ProcessIdentity(int(state["pid"]), int(state["start_time"]))
                pid, status_file, task_dir = sup.pid, str(state["result_file"]), ""
            else:
                sup = ProcessIdentity(int(state["supervisor_pid"]), int(state["supervisor_start_time"]))
                pid, task_dir = int(state["pid"]), str(state["task_dir"])
                status_file = os.path.join(task_dir, supervisor.STATUS_FILE)
        except (ValueError, KeyError, TypeError):
            raise DriverError(
                f"task {name!r} cannot be recovered: its handle's driver state is not what {type(self).__name__} wrote"
            ) from None
        record = ProcessTask(handle.config, sup, pid, status_file, task_dir, started_at)
        if not sup.alive() and not os.path.exists(status_file):
            raise DriverError(
                f"task {name!r} cannot be recovered: its process {sup.pid} is gone and left no exit status"
            )
        self.tasks.put(record)
        procwatch.watch(sup.pid, lambda code: self._exited(record, code), reap=False, identity=sup.alive)

    def wait_task(self, task_id: str) -> ExitResult:
        result = self.tasks.get(task_id).exit.wait()
        assert result is not None
        return result

    def watch_exit(self, task_id: str, callback: Callable[[ExitResult], None]) -> bool:
        self.tasks.get(task_id).exit.add_callback(callback)
        return True

    def stop_task(self, task_id: str, timeout: float, signal_name: str) -> None:
        record = self.tasks.get(task_id)
        if record.exit.done:
            return
        self._signal(record, signal_name or "SIGTERM")
        if record.exit.wait(max(timeout, 0.0)) is None:
            self._kill(record)

    def destroy_task(self, task_id: str, force: bool) -> None:
        try:
            record = self.tasks.get(task_id)
        except DriverError:
            return  # destroying twice is not an error: it is gone either way
        if not record.exit.done:
            if not force:
                raise TaskStillRunningError(
                    f"task {record.task.name!r} is still running; stop it first or destroy it with force"
                )
            self._kill(record)
        if record.task_dir:
            shutil.rmtree(record.task_dir, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(record.status_file)
        self.tasks.remove(task_id)

    def inspect_task(self, task_id: str) -> TaskStatus:
        record = self.tasks.get(task_id)
        done = record.exit.done
        return TaskStatus(
            id=task_id,
            name=record.task.name,
            state=TaskState.EXITED if done else TaskState.RUNNING,
            started_at=record.started_at,
            completed_at=record.completed_at if done else None,
            result=record.exit.result,
            driver_attributes={"pid": str(record.pid)},
        )

    def signal_task(self, task_id: str, signal_name: str) -> None:
        record = self.tasks.get(task_id)
        if not record.exit.done:
            self._signal(record, signal_name)

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
        task = self.tasks.get(session.task_id).task
        cwd = task.task_dir if os.path.isdir(task.task_dir) else None
        # run_session has no cwd: a shell changes into the task dir, then becomes the command.
        argv = ["/bin/sh", "-c", 'cd "$0" 2>/dev/null; exec "$@"', cwd or ".", *session.command]
        return run_session(argv, session, env=dict(task.env))

    def task_stats(self, task_id: str) -> TaskStats | None:
        record = self.tasks.get(task_id)
        if record.exit.done:
            return None  # ends the stream
        user = system = 0.0
        rss = 0
        ticks = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        for pid in _group_members(record.pid):
            fields = _stat_fields(pid)
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

    # --- helpers -------------------------------------------------------------------------------

    def _signal(self, record: ProcessTask, name: str) -> None:
        try:
            signum = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        except KeyError:
            raise DriverError(
                f"task {record.task.name!r}: unknown signal {name!r}; use a name such as SIGHUP"
            ) from None
        if signum is signal.SIGKILL:
            self._kill(record)
            return
        if record.supervisor.alive():  # else the pid may be another process's by now
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signum)

    def _kill(self, record: ProcessTask) -> None:
        record.killed = True
        if record.supervisor.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGKILL)
        if record.exit.wait(30) is None:
            raise DriverError(f"task {record.task.name!r} did not exit within 30 s of SIGKILL")


def _bytes(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else value


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _group_members(pgid: int) -> list[int]:
    """Every live process of the task's process group (the task and its children)."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            # fields[2] is the process group id (field 5 of /proc/<pid>/stat).
            if fields is not None and len(fields) > 21 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                members.append(int(name))
    return members


__all__ = ["ProcessDriver", "ProcessTask"]
