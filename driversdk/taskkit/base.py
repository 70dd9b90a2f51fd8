"""``SupervisedDriver``: the lifecycle every driver whose tasks run under the kit's supervisor shares.

A driver starts a task its own way (a runc bundle, a host process in a cgroup), hands the
supervisor a :class:`~driversdk.taskkit.supervisor.Launch`, and calls :meth:`SupervisedDriver.track`
with its state. From then on this class answers wait / watch_exit / stop (the signal, the
timeout, then SIGKILL) / destroy / inspect / signal / streaming exec / stats and recovery, through
a few small methods the driver implements: how to decode its state, signal the task, kill all of
it, release what it holds and run a command in it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, Protocol, TypeVar

from driversdk import procwatch
from driversdk.driver import DriverPlugin, ExecSession
from driversdk.errors import DriverError, TaskStillRunningError
from driversdk.exits import ExitSlot, supervised_exit
from driversdk.model import ExecResult, ExitResult, TaskConfig, TaskEvent, TaskHandle, TaskState, TaskStats, TaskStatus
from driversdk.signals import signal_name
from driversdk.taskkit import shared, supervisor
from driversdk.taskkit.cgroups import CgroupSample, CounterFiles, TaskCgroup
from driversdk.taskkit.owner import ProcessIdentity
from driversdk.taskkit.shared import SharedRunState, Spawned
from driversdk.taskkit.stats import task_stats
from driversdk.taskkit.streaming import exit_result, run_session
from driversdk.taskkit.taskmap import TaskMap

log = logging.getLogger("driversdk.taskkit")

KILL_WAIT = 10.0
STATUS_WAIT = 10.0
"""How long a task's exit waits for the shared supervisor's status file (it writes it on reaping)."""
STATUS_POLL = 0.02


class SupervisedState(Protocol):
    """What a driver's saved task state (TaskHandle.driver_state) must tell the kit."""

    @property
    def supervisor_pid(self) -> int: ...

    @property
    def started_at(self) -> float: ...

    @property
    def status_file(self) -> str: ...

    @property
    def spec_file(self) -> str: ...

    def encode(self) -> bytes: ...


S = TypeVar("S", bound=SupervisedState)


def shared_run(state: SupervisedState) -> Spawned | None:
    """The task and the shared supervisor running it, for a state built on SharedRunState (exec's,
    raw_exec's); None for a task under a supervisor of its own (ProcessDriver's, or a SharedRunState
    without a task start time), which is followed by ``supervisor_pid``."""
    return state.shared_run if isinstance(state, SharedRunState) else None


@dataclass(frozen=True)
class ExecRun:
    """How ExecTask runs one command in a task (:meth:`SupervisedDriver.exec_run`)."""

    argv: list[str]
    env: dict[str, str] | None
    """None: the plugin's environment."""
    kill: Callable[[subprocess.Popen[bytes]], None]
    """What the timeout kills: the command and what it started, wherever they run."""
    done: Callable[[], None] = lambda: None
    """Runs once the command ended, whatever happened (removes files the run needed)."""
    signal_in_exit_code: bool = False
    """The argv's program (runc) reports the command killed by signal N as exit 128 + N."""


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """The default timeout kill: ``proc`` leads its own session, so its group holds the command
    (a launcher exec'd it) and every child it did not move elsewhere."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class SupervisedTask(Generic[S]):
    """One task as the driver tracks it."""

    task: TaskConfig
    state: S
    cgroup: TaskCgroup | None
    """Where its stats and OOM kills are read; None for a task without a cgroup of its own."""
    exit: ExitSlot = field(default_factory=ExitSlot)
    """Set once by the process watcher when the supervisor is gone; wait_task and watch_exit wait on it."""
    completed_at: datetime | None = None
    last_sample: CgroupSample | None = None
    counter_files: CounterFiles = field(default_factory=CounterFiles)
    """The cgroup counter files its stats stream reads, open while the task runs."""

    @property
    def started_at(self) -> datetime:
        return datetime.fromtimestamp(self.state.started_at, UTC)


class SupervisedDriver(DriverPlugin, Generic[S]):
    """Base of the kit's process drivers. Implement :meth:`decode_state`, :meth:`task_cgroup`,
    :meth:`send_signal`, :meth:`kill_all`, :meth:`release` and :meth:`exec_command`; start tasks
    with :func:`driversdk.taskkit.supervisor.spawn` and :meth:`track`."""

    default_stop_signal = "SIGINT"  # what Nomad's executor sends when the job names no kill_signal

    def __init__(self) -> None:
        super().__init__()
        self.tasks: TaskMap[SupervisedTask[S]] = TaskMap()
        self._supervisors: set[ProcessIdentity] = set()  # shared supervisors whose exit we watch
        self._supervisors_lock = threading.Lock()

    # --- what a driver supplies -----------------------------------------------------------------

    def decode_state(self, handle: TaskHandle) -> S:
        raise NotImplementedError

    def task_cgroup(self, state: S) -> TaskCgroup | None:
        raise NotImplementedError

    def send_signal(self, state: S, sig: str, *, stopping: bool) -> bool:
        """Deliver ``sig`` (a name such as "SIGTERM") to the task; ``stopping``: StopTask's, for
        the whole task. False when nothing is running to receive it."""
        raise NotImplementedError

    def kill_all(self, state: S) -> None:
        """SIGKILL every process of the task; safe to repeat."""
        raise NotImplementedError

    def release(self, state: S) -> None:
        """Remove everything the task holds on the host; safe to repeat."""
        raise NotImplementedError

    def exec_command(self, record: SupervisedTask[S], command: list[str]) -> tuple[list[str], dict[str, str] | None]:
        """The argv (and environment, None for the plugin's) that runs ``command`` in the task."""
        raise NotImplementedError

    def claim(self, state: S) -> None:
        """Recovery: make this plugin the owner of the task's on-disk record, where it keeps one."""

    def is_supervisor(self, state: S) -> bool:
        """Whether the task's supervisor still runs (not a process that reused its pid)."""
        return supervisor.is_supervisor(state.supervisor_pid, state.spec_file)

    def is_supervised(self, state: S) -> bool:
        """Whether the task runs under a living supervisor that will record its exit."""
        run = shared_run(state)
        if run is None:
            return self.is_supervisor(state)
        return run.task.alive() and shared.is_server(run.supervisor)

    def driver_attributes(self, record: SupervisedTask[S]) -> dict[str, str]:
        return {}

    # --- tracking ---------------------------------------------------------------------------------

    def track(self, task: TaskConfig, state: S, *, version: int = 1) -> TaskHandle:
        """Follow a task this plugin just started (its supervisor is our child); its handle,
        ``version`` numbering the layout of ``state``."""
        record = SupervisedTask(task, state, self.task_cgroup(state))
        self.tasks.put(record)
        self._watch(record, own_child=True)
        return TaskHandle(config=task, driver_state=state.encode(), version=version, state=TaskState.RUNNING)

    def _watch(self, record: SupervisedTask[S], *, own_child: bool) -> None:
        """Have the process-wide watcher report the supervisor's exit: no thread per task.

        A supervisor we spawned is our child, reaped once it exits. One a predecessor spawned is
        not: its pid may have been reused by the time we look, so the watcher checks it is still
        this task's supervisor before and after pinning it with a pidfd."""
        state = record.state
        run = shared_run(state)
        if run is not None:
            # The task itself, never our child (the shared supervisor's), known by its start time.
            self._watch_supervisor(run.supervisor)
            procwatch.watch(
                run.task.pid, lambda _code: self._task_gone(record, run), reap=False, identity=run.task.alive
            )
            return

        def exited(_returncode: int | None) -> None:
            # The task's exit is in the status file the supervisor wrote, not in its own status.
            self._exited(record)

        identity = None if own_child else lambda: self.is_supervisor(state)
        procwatch.watch(state.supervisor_pid, exited, reap=own_child, identity=identity)

    def _task_gone(self, record: SupervisedTask[S], run: Spawned) -> None:
        """The task of a shared supervisor exited; the supervisor writes its status on reaping it,
        a moment later. Waiting for that happens off the watcher thread, which serves every task."""
        if supervisor.read_status(record.state.status_file) is not None:
            self._exited(record)
            return

        def await_status() -> None:
            deadline = time.monotonic() + STATUS_WAIT
            while supervisor.read_status(record.state.status_file) is None:
                if time.monotonic() > deadline or not shared.is_server(run.supervisor):
                    if supervisor.read_status(record.state.status_file) is None:
                        self._exited(record, supervisor_died=run.supervisor.pid)
                        return
                    break
                time.sleep(STATUS_POLL)
            self._exited(record)

        threading.Thread(target=await_status, name=f"status-{record.task.id}", daemon=True).start()

    def _watch_supervisor(self, identity: ProcessIdentity) -> None:
        """Once per shared supervisor: when it dies, its tasks are killed, since nobody can record
        how they end any more; each then ends with :meth:`_exited`'s 'exit status unknown'."""
        with self._supervisors_lock:
            if identity in self._supervisors:
                return
            self._supervisors.add(identity)

        def died(_code: int | None) -> None:
            orphans = []
            for record in self.tasks.records():
                run = shared_run(record.state)
                if run is not None and run.supervisor == identity and not record.exit.done:
                    orphans.append(record)
            if orphans:
                log.error("task supervisor pid %d died; killing its %d task(s)", identity.pid, len(orphans))

            def kill() -> None:
                for orphan in orphans:
                    with contextlib.suppress(DriverError, OSError):
                        self.kill_all(orphan.state)

            threading.Thread(target=kill, name=f"orphans-{identity.pid}", daemon=True).start()

        procwatch.watch(identity.pid, died, reap=False, identity=lambda: shared.is_server(identity))

    def _exited(self, record: SupervisedTask[S], *, supervisor_died: int = 0) -> None:
        """Runs on the watcher thread, which serves every task: it only reads two small files."""
        record.counter_files.close()  # no more samples: the stats stream ends with the task
        cgroup = record.cgroup
        oom: Callable[[], bool] = cgroup.oom_killed if cgroup is not None else lambda: False
        ended = supervised_exit(record.task, supervisor.read_status(record.state.status_file), oom)
        record.completed_at = ended.completed_at  # first: whoever sees the slot set may read it
        record.exit.set(ended.result)
        event = ended.event
        if supervisor_died:
            task = record.task
            event = TaskEvent(
                task_id=task.id,
                alloc_id=task.alloc_id,
                task_name=task.name,
                message=(
                    f"task {task.name!r} ended with its exit status unknown because the task supervisor "
                    f"(pid {supervisor_died}) died; it was killed, since nothing could record how it ends"
                ),
                timestamp=ended.completed_at,
                annotations={"exit_status": "unknown"},
            )
        if event is not None:
            self.emit_event(event)

    # --- recovery ---------------------------------------------------------------------------------

    def recover_task(self, handle: TaskHandle) -> None:
        task = handle.config
        if self.tasks.has(task.id):
            return
        state = self.decode_state(handle)
        # The host holds a handle: the task is "started" and this plugin its owner from now on.
        self.claim(state)
        finished = supervisor.read_status(state.status_file) is not None
        if not finished and not self.is_supervised(state):
            # Nobody is left to report this task's exit: release what remains so the host's
            # follow-up start does not trip over it.
            self.kill_all(state)
            self.release(state)
            raise DriverError(
                f"task {task.name!r} cannot be recovered: its supervisor (pid {state.supervisor_pid}) is gone "
                "without recording an exit status; the task will be restarted",
                recoverable=True,
            )
        record = SupervisedTask(task, state, self.task_cgroup(state))
        self.tasks.put(record)
        self._watch(record, own_child=False)
        log.info("recovered task %s (supervisor pid %d)", task.id, state.supervisor_pid)

    # --- wait / stop / destroy --------------------------------------------------------------------

    def wait_task(self, task_id: str) -> ExitResult:
        result = self.tasks.get(task_id).exit.wait()
        assert result is not None  # no timeout: wait returns only once the exit is set
        return result

    def watch_exit(self, task_id: str, callback: Callable[[ExitResult], None]) -> bool:
        self.tasks.get(task_id).exit.add_callback(callback)
        return True

    def stop_task(self, task_id: str, timeout: float, signal: str) -> None:
        record = self.tasks.get(task_id)
        if record.exit.done:
            return
        sig = signal_name(signal or self.default_stop_signal)
        self.send_signal(record.state, sig, stopping=True)
        if record.exit.wait(timeout) is not None:
            return
        log.info("task %s did not stop within %.1fs after %s; killing it", task_id, timeout, sig)
        self._kill_and_wait(record, "stopping")

    def _kill_and_wait(self, record: SupervisedTask[S], doing: str) -> None:
        self.kill_all(record.state)
        if record.exit.wait(KILL_WAIT) is None:
            raise DriverError(
                f"task {record.task.name!r} did not exit within {KILL_WAIT:.0f}s of SIGKILL; retry {doing} it",
                recoverable=True,
            )

    def destroy_task(self, task_id: str, force: bool) -> None:
        record = self.tasks.get(task_id)
        if not record.exit.done:
            if not force:
                raise TaskStillRunningError(
                    f"task {record.task.name!r} is still running; stop it first or destroy it with force"
                )
            self._kill_and_wait(record, "destroying")
        record.counter_files.close()
        self.release(record.state)
        self.tasks.remove(task_id)

    # --- inspect / signal / exec / stats ------------------------------------------------------------

    def inspect_task(self, task_id: str) -> TaskStatus:
        record = self.tasks.get(task_id)
        done = record.exit.done
        return TaskStatus(
            id=record.task.id,
            name=record.task.name,
            state=TaskState.EXITED if done else TaskState.RUNNING,
            started_at=record.started_at,
            completed_at=record.completed_at if done else None,
            result=record.exit.result or ExitResult(),
            driver_attributes=self.driver_attributes(record),
        )

    def signal_task(self, task_id: str, signal: str) -> None:
        record = self.tasks.get(task_id)
        if record.exit.done:
            raise DriverError(f"task {record.task.name!r} has already exited; it cannot be signalled")
        sig = signal_name(signal)
        if not self.send_signal(record.state, sig, stopping=False):
            raise DriverError(f"failed to send {sig} to task {record.task.name!r}: it is not running")

    @staticmethod
    def check_exec(record: SupervisedTask[S], command: list[str]) -> None:
        """Refuse an empty command and a task that has exited."""
        if not command:
            raise DriverError(f"exec in task {record.task.name!r}: the command is empty; give a program to run")
        if record.exit.done:
            raise DriverError(f"exec in task {record.task.name!r}: the task has exited")

    def exec_argv(self, record: SupervisedTask[S], command: list[str]) -> tuple[list[str], dict[str, str] | None]:
        """The checked ``command``'s argv and environment (exec_command's)."""
        self.check_exec(record, command)
        return self.exec_command(record, command)

    def exec_task_streaming(self, session: ExecSession) -> ExitResult:
        record = self.tasks.get(session.task_id)
        if session.tty:
            raise DriverError(f"exec in task {record.task.name!r}: tty sessions are not supported; run without -t")
        argv, env = self.exec_argv(record, session.command)
        return run_session(argv, session, env=env)

    def exec_run(self, record: SupervisedTask[S], command: list[str]) -> ExecRun:
        """How ExecTask runs the checked ``command``: exec_command's argv, its group killed on timeout."""
        argv, env = self.exec_command(record, command)
        return ExecRun(argv, env, kill_group)

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        record = self.tasks.get(task_id)
        self.check_exec(record, command)
        run = self.exec_run(record, command)
        try:
            proc = subprocess.Popen(
                run.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=run.env,
            )
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                run.kill(proc)
                try:
                    stdout, stderr = proc.communicate(timeout=KILL_WAIT)
                except subprocess.TimeoutExpired:
                    # Something the command started in another session still holds the pipes open.
                    proc.kill()
                    for stream in (proc.stdout, proc.stderr):
                        if stream is not None:
                            stream.close()
                    proc.wait()
                    stdout, stderr = b"", b""
        finally:
            run.done()
        result = exit_result(proc.returncode, signal_in_exit_code=run.signal_in_exit_code)
        return ExecResult(stdout=stdout, stderr=stderr, result=result)

    def task_stats(self, task_id: str) -> TaskStats | None:
        record = self.tasks.get(task_id)
        if record.exit.done or record.cgroup is None:
            return None
        stats, record.last_sample = task_stats(record.cgroup, record.last_sample, record.counter_files)
        return stats
