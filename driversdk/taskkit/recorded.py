"""``RecordedDriver``: a :class:`~driversdk.taskkit.base.SupervisedDriver` whose tasks live in
``<state_dir>/tasks/<key>`` beside an owner record (:mod:`.owner`), as exec's and raw_exec's do.

Starting, releasing and recovering such a task is the same for every driver: the record is
written first and removed last, so whatever a plugin killed at any point leaves hangs off a
record a later plugin's reconciler finds; a failed start removes what it made before it
returns. A driver says what differs: :meth:`RecordedDriver.prepare` (the checks, and how to
build the task's files and launch), :meth:`~RecordedDriver.record_of`,
:meth:`~RecordedDriver.started`, and what more than the kit's cgroup and dir it must remove.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from driversdk.errors import DriverError
from driversdk.model import TaskConfig, TaskHandle
from driversdk.taskkit import owner, shared, supervisor
from driversdk.taskkit.base import S, SupervisedDriver, shared_run
from driversdk.taskkit.hostcfg import HostPluginConfig
from driversdk.taskkit.logs import open_logs
from driversdk.taskkit.owner import PeriodicPass, TaskRecord
from driversdk.taskkit.reconcilecfg import ReconcileConfig
from driversdk.taskkit.shared import Spawned
from driversdk.taskkit.supervisor import SPEC_FILE, Launch

log = logging.getLogger("driversdk.taskkit")

R = TypeVar("R", bound=TaskRecord)

ORPHANED = "plugin died"  # release_record's reason when the reconciler releases a task


@dataclass(frozen=True)
class Start(Generic[S]):
    """What :meth:`RecordedDriver.prepare` decided; nothing of the task exists on the host yet."""

    state: S
    """The task's state before it runs (its pids 0): what a failed start releases."""
    build: Callable[[], Launch]
    """Makes the task's files and cgroup in its new, empty dir; returns how to launch it."""


class RecordedDriver(SupervisedDriver[S], Generic[S, R]):
    """Implement :meth:`prepare`, :meth:`record_of`, :meth:`started`, :attr:`record_type` and
    :attr:`config` (a :class:`~driversdk.taskkit.hostcfg.HostPluginConfig`), plus SupervisedDriver's
    signal, kill and exec hooks; override :meth:`remove_runtime` and :meth:`remove_dir` where a task
    holds more than a cgroup and a dir."""

    record_type: type[R]
    config: HostPluginConfig
    """The plugin config (SetConfig's); a driver narrows it to its own subclass."""
    dir_noun = "state dir"
    """What the task's dir is called in the lines the release logs."""

    def __init__(self) -> None:
        super().__init__()
        self._reconciler = PeriodicPass(
            f"{self.name}-reconciler", self.reconcile_pass, lambda: self.reconcile_config().period
        )

    # --- what a driver supplies -----------------------------------------------------------------

    @property
    def plugin_state_dir(self) -> str:
        return self.config.state_dir

    def reconcile_config(self) -> ReconcileConfig:
        return self.config.reconcile

    def prepare(self, task: TaskConfig) -> Start[S]:
        """Check everything that can be refused; create nothing."""
        raise NotImplementedError

    def record_of(self, state: S) -> R:
        """The record of the task ``state`` describes, in phase "started" (its owner unset)."""
        raise NotImplementedError

    def started(self, state: S, run: Spawned) -> S:
        """``state`` of the task the shared supervisor now runs."""
        raise NotImplementedError

    def logs_disabled(self) -> bool:
        return False

    def runtime_names(self, record: R) -> tuple[str, ...]:
        """More argv words than the launch spec that name the task's processes (a container id)."""
        return ()

    def remove_runtime(self, record: R) -> list[str]:
        """Remove what a runtime keeps of the task beside its cgroup and dir (safe to repeat);
        returns what it removed."""
        return []

    def remove_dir(self, path: str) -> None:
        shutil.rmtree(path)

    def reconcile_more(self, now: float) -> list[str]:
        """What else a reconciler pass removes (under its lock); returns what."""
        return []

    # --- the reconciler -----------------------------------------------------------------------------

    def start_reconciler(self) -> None:
        """From SetConfig with an agent config: Nomad's config-validation launch (without one) lives
        for a moment and runs no tasks. The pass reads the config each time, so a later SetConfig
        changes its period and grace."""
        if self.reconcile_config().enabled:
            self._reconciler.start()

    def shutdown(self) -> None:
        self._reconciler.stop()
        self._release_supervisor(self.plugin_state_dir)

    def _state_dir_of(self, state: S) -> str:
        """The plugin state dir a task lives in (a recovered task may live in an earlier config's)."""
        return os.path.dirname(os.path.dirname(self.record_of(state).directory))

    def _release_supervisor(self, state_dir: str) -> None:
        """With no task of ours left in ``state_dir``, its shared supervisor need not wait for its
        idle timeout: it leaves now unless it still runs another plugin's tasks. While tasks run it
        stays, through plugin restarts, by design."""
        if any(self._state_dir_of(t.state) == state_dir for t in self.tasks.records()):
            return
        if os.path.isdir(state_dir):
            shared.release(state_dir)

    def destroy_task(self, task_id: str, force: bool) -> None:
        state_dir = self._state_dir_of(self.tasks.get(task_id).state)
        super().destroy_task(task_id, force)
        self._release_supervisor(state_dir)

    def tracked_keys(self) -> set[str]:
        """What the reconciler must leave alone: every task this plugin tracks."""
        return {self.record_of(t.state).key for t in self.tasks.records()}

    def reconcile_pass(self) -> list[str]:
        """Release what plugins killed inside StartTask or DestroyTask left (:func:`owner.is_orphan`),
        one plugin at a time per state dir; returns the keys (and what reconcile_more names) removed."""
        with owner.exclusive(self.plugin_state_dir) as mine:
            if not mine:
                return []
            now = time.time()
            tasks_dir = os.path.join(self.plugin_state_dir, "tasks")
            grace = self.reconcile_config().creation_grace
            decode = self.record_type.decode
            removed = owner.release_orphans(
                tasks_dir, decode, self.release_record, tracked=self.tracked_keys(), grace=grace, now=now
            )
            return removed + self.reconcile_more(now)

    # --- start --------------------------------------------------------------------------------------

    def start_task(self, task: TaskConfig) -> TaskHandle:
        if self.tasks.has(task.id):
            raise DriverError(f"task with ID {task.id!r} already started")
        start = self.prepare(task)
        record = self.record_of(start.state).moved_to("starting")
        home = record.directory
        os.makedirs(os.path.dirname(home), mode=0o700, exist_ok=True)
        # The record comes first and goes last: whatever a kill mid-start leaves hangs off it.
        # Keys derive from the (unique per start) task id: an existing record or dir is an earlier
        # start of this id that was not destroyed.
        if not owner.create(record) and not owner.replace_abandoned(
            record, self.plugin_state_dir, self.record_type.decode, self.release_record
        ):
            raise DriverError(
                f"task {task.name!r}: state of task id {task.id!r} already exists at {record.path!r}; "
                "destroy the earlier task with this id first"
            )
        try:
            os.mkdir(home, 0o700)
        except FileExistsError:
            owner.remove(home)  # the dir is not ours to remove: only the record we just made
            raise DriverError(
                f"task {task.name!r}: state dir {home!r} of task id {task.id!r} already exists; "
                "destroy the earlier task with this id first"
            ) from None
        state = start.state
        fds: tuple[int, int] | None = None
        try:
            launch = start.build()
            fds = open_logs(task.stdout_path, task.stderr_path, task=task.name, disabled=self.logs_disabled())
            run = shared.spawn(self.plugin_state_dir, home, launch, *fds, task=task.name)
            state = self.started(state, run)
            # From here the host gets the handle, and with it the duty to recover or destroy the task.
            owner.save(record.moved_to("started"))
        except BaseException:
            self._roll_back(task, state, record)
            raise
        finally:
            for fd in fds or ():
                os.close(fd)
        log.info("started task %s as %s (supervisor pid %d)", task.id, record.key, state.supervisor_pid)
        return self.track(task, state)

    def _roll_back(self, task: TaskConfig, state: S, record: R) -> None:
        """Remove what a failed start made; the start's own error is the one the host sees."""
        run = shared_run(state)
        if run is not None and run.task.alive():  # only saving the record failed: the task runs
            with contextlib.suppress(ProcessLookupError):
                os.kill(run.task.pid, signal.SIGKILL)
        try:
            self.release_record(record, why="start failed")
        except (DriverError, OSError) as err:
            # The record stays: this plugin's reconciler removes the rest once it is no longer ours.
            log.warning("task %s: removing what its failed start made: %s", task.id, getattr(err, "message", err))

    # --- release ------------------------------------------------------------------------------------

    def claim(self, state: S) -> None:
        # A task started by a plugin version without records gets one. The lock is that of the
        # state dir the task lives in, which a later plugin config may no longer name.
        record = self.record_of(state)
        tasks_dir = os.path.dirname(record.directory)
        if os.path.isdir(tasks_dir):
            owner.claim(record, os.path.dirname(tasks_dir), self.record_type.decode)

    def release(self, state: S) -> None:
        record = owner.load(self.record_of(state).path, self.record_type.decode)
        if record is not None:
            # Should this plugin die half-way, the next one's reconciler finishes the removal.
            owner.save(record.moved_to("destroying"))
        run = shared_run(state)
        # Under the shared supervisor no process of the task's own names it but the runc (or
        # `launch.py exec`) this plugin or that supervisor started: their children are read
        # instead of every process on the node, which cost ~15 ms a destroy with 1000 tasks
        # running. A task under a supervisor of its own (no shared run) is found by the full scan.
        among = None if run is None else supervisor.children_of(os.getpid(), run.supervisor.pid)
        if among is not None:
            among = self._not_running_tasks(among)
        self.release_record(record or self.record_of(state), why="destroy was requested", among=among)

    def _not_running_tasks(self, pids: list[int]) -> list[int]:
        """``pids`` less the tasks of ours still running. The shared supervisor's children are
        mostly other tasks (1000 of them, each a /proc read a destroy, under a GIL every read gives
        up and takes back): none is a runc or launcher, and none may be killed by this destroy. A
        task counts only while its exit is not known, so no pid its end freed is left out."""
        running: set[int] = set()
        for other in self.tasks.records():
            spawned = shared_run(other.state)
            if spawned is not None and not other.exit.done:
                running.add(spawned.task.pid)
        return [pid for pid in pids if pid not in running]

    def release_record(self, record: R, why: str = ORPHANED, among: list[int] | None = None) -> list[str]:
        """Kill and remove everything of the task ``record`` names, the record last; returns what
        was removed, each logged. Safe to repeat: each step skips what is already gone. DestroyTask,
        a failed start and the reconciler (for a task whose plugin died) all release this way."""
        fields = {"task_key": record.key, "task_dir": record.directory, "phase": record.phase}
        fields["owner_pid"] = str(record.owner_pid)
        # The reconciler's removals are news to an operator; a destroy's are what was asked for.
        level, who = (logging.INFO, "reconciler") if why == ORPHANED else (logging.DEBUG, "release")

        def removed_one(what: str, name: str | int) -> None:
            log.log(level, "%s: %s %s of a task whose %s", who, what, name, why, extra=fields)

        # The supervisor first, so it cannot record an exit (or start anything) while the rest goes.
        naming = (os.path.join(record.directory, SPEC_FILE), *self.runtime_names(record))
        for pid in supervisor.processes_naming(*naming, among=among):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                removed_one("killed process", pid)
        cgroup = record.cgroup
        cgroup.kill_all()  # what the task forked into the background goes with it
        removed = self.remove_runtime(record)
        for what in removed:
            removed_one(f"removed {what}", record.key)
        if cgroup.existing():
            cgroup.remove()
            removed.append("cgroup")
            removed_one("removed cgroup", cgroup.relative)
        if os.path.lexists(record.directory):
            self.remove_dir(record.directory)
            removed.append(self.dir_noun)
            removed_one(f"removed {self.dir_noun}", record.directory)
        owner.remove(record.directory)
        return removed
