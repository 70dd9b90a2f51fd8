"""The order in which an allocation's tasks start and stop, as Nomad's lifecycle coordinator
(``client/allocrunner/tasklifecycle``) and alloc runner order them.

1. **prestart** tasks start together; the main tasks wait until every non-sidecar prestart task
   has exited successfully (each after its own restart policy) and every prestart sidecar runs.
   A non-sidecar prestart task that fails fails the allocation: the main and poststart tasks never
   start and the sidecars are stopped (``Sibling Task Failed``); the poststop tasks still run.
2. **main** tasks (no ``lifecycle``) start together — a group without lifecycle hooks starts all
   its tasks at once, as Nomad does.
3. **poststart** tasks start once the main tasks run.
4. When every task but the sidecars and poststop tasks has exited, the sidecars are stopped
   (``Main Tasks Dead``); once every other task is gone, the **poststop** tasks start (after a
   failure too); the allocation's run is done when they have exited.
5. Whatever the stage, a task (not a poststop one) that ends failed stops every other live task
   of the allocation (``Sibling Task Failed``), and a ``leader`` task that ends stops them too
   (``Leader Task Dead``): the leader first, then the others together, the sidecars last, as
   Nomad's alloc runner kills them. Tasks stopped so are not failures of their own.

The first stage is started by the caller's thread, so a task that cannot start (an image that
cannot be pulled), once its restart policy gives up on it, is the run's error; the later stages
run in the coordinator's thread, and a start failure there fails the allocation with a sentence.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from driversdk.errors import DriverSDKError
from driversdk.jobspec import restarts
from driversdk.jobspec.job import Group, Job, Task
from driversdk.model import ExitResult
from driversdk.paths import show

PRESTART, MAIN, POSTSTART, POSTSTOP = "prestart", "main", "poststart", "poststop"
WAIT_STEP = 0.2


class LifecycleTask(Protocol):
    """What the coordinator uses of a task runner."""

    failure: str  # why the task failed; set here when its start failed

    @property
    def task(self) -> Task: ...
    @property
    def started(self) -> bool: ...
    @property
    def done(self) -> threading.Event: ...
    @property
    def result(self) -> ExitResult | None: ...
    @property
    def stopped(self) -> bool: ...
    def run(self) -> None: ...
    def stop(self) -> None: ...
    def skip(self, why: str) -> None: ...
    def event(self, message: str) -> None: ...


class LifecycleAlloc(Protocol):
    """What the coordinator uses of an alloc runner."""

    @property
    def alloc_id(self) -> str: ...
    @property
    def job(self) -> Job: ...
    @property
    def group(self) -> Group: ...
    @property
    def tasks(self) -> Sequence[LifecycleTask]: ...
    def stop_requested(self) -> bool: ...
    def event(self, kind: str, message: str) -> None: ...


def stage(runner: LifecycleTask) -> str:
    return runner.task.lifecycle_hook or MAIN


def is_sidecar(runner: LifecycleTask) -> bool:
    return runner.task.lifecycle_sidecar and stage(runner) in (PRESTART, POSTSTART)


def has_hooks(runners: Sequence[LifecycleTask]) -> bool:
    return any(stage(r) != MAIN for r in runners)


def start_together(runners: Sequence[LifecycleTask]) -> None:
    """Start (or recover) every runner in its own thread; the first failure is raised once all
    have returned, so none is left half-started behind another's exception."""
    pending = [r for r in runners if not r.started and not r.done.is_set()]
    errors: list[BaseException] = []

    def one(runner: LifecycleTask) -> None:
        try:
            runner.run()
        except BaseException as err:  # handed to the caller below
            runner.failure = runner.failure or str(err)
            errors.append(err)

    if len(pending) == 1:  # no thread for the common case of one task
        one(pending[0])
        if errors:
            raise errors[0]
        return

    threads = [threading.Thread(target=one, args=(r,), name=f"start-{r.task.name}") for r in pending]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


class Coordinator:
    """Moves one allocation's tasks through the stages; ``failure`` says why the allocation failed."""

    def __init__(self, alloc: LifecycleAlloc, stopping: threading.Event) -> None:
        self.alloc = alloc
        self.stopping = stopping
        self.failure = ""
        self._thread: threading.Thread | None = None
        self._killed = False  # a failed task or a dead leader has stopped the others already
        self._kill_lock = threading.Lock()

    def of(self, name: str) -> list[LifecycleTask]:
        return [r for r in self.alloc.tasks if stage(r) == name]

    def start(self) -> None:
        """The first stage now (raising what fails to start), the rest in a thread."""
        if not has_hooks(self.alloc.tasks):
            start_together(self.alloc.tasks)
            return
        start_together(self.of(PRESTART))
        self._thread = threading.Thread(target=self._rest, daemon=True, name=f"lifecycle-{self.alloc.alloc_id[:8]}")
        self._thread.start()

    def _wait(self, runners: Sequence[LifecycleTask]) -> bool:
        """Until every runner is done; False when the allocation is stopped first."""
        while not all(r.done.is_set() for r in runners):
            if self.stopping.wait(WAIT_STEP):
                return False
        return True

    def _rest(self) -> None:
        a = self.alloc
        ephemeral = [r for r in self.of(PRESTART) if not is_sidecar(r)]
        if not self._wait(ephemeral):
            return self._skip(self._unstarted(), "the allocation was stopped")
        failed = [r for r in ephemeral if r.failure or r.result is None or not r.result.successful]
        if failed:
            name = failed[0].task.name
            self.failure = (
                f"job {show(a.job.name)} group {show(a.group.name)}: prestart task {show(name)} failed "
                f"({_outcome(failed[0])}), so the main tasks were not started; see `driversdk logs {name} --stderr`"
            )
            a.event("group", f"failed: {self.failure}")
            self._stop_sidecars(restarts.SIBLING_FAILED, name)
            self._skip(self.of(MAIN) + self.of(POSTSTART), f"prestart task {show(name)} failed")
        elif self._stage(self.of(MAIN)) and self._stage(self.of(POSTSTART)):
            # Sidecars are stopped once no other task but poststop ones runs (Nomad's "Main Tasks Dead").
            if not self._wait([r for r in a.tasks if stage(r) != POSTSTOP and not is_sidecar(r)]):
                return self._skip(self._unstarted(), "the allocation was stopped")
            self._stop_sidecars(restarts.MAIN_DEAD)
        # Poststop tasks run once every other task is gone, also after a failure, as Nomad's.
        if not self._wait([r for r in a.tasks if stage(r) != POSTSTOP]):
            return self._skip(self._unstarted(), "the allocation was stopped")
        self._stage(self.of(POSTSTOP))
        return None

    def _stage(self, runners: Sequence[LifecycleTask]) -> bool:
        """Start a stage; a start failure fails the allocation: the sidecars are stopped and what
        has not started is skipped (but the poststop tasks)."""
        if self.stopping.is_set():
            self._skip(self._unstarted(), "the allocation was stopped")
            return False
        try:
            start_together(runners)
        except DriverSDKError as err:
            self.failure = str(err)
            self.alloc.event("group", f"failed: {err}")
            failed = next((r.task.name for r in runners if r.failure), "")
            self._stop_sidecars(restarts.SIBLING_FAILED if failed else restarts.MAIN_DEAD, failed)
            self._skip([r for r in self._unstarted() if stage(r) != POSTSTOP], "a task failed to start")
            return False
        return True

    def task_ended(self, runner: LifecycleTask) -> None:
        """A task has ended for good (past its restarts): when it failed, or it is the leader,
        the allocation's other live tasks are stopped, as Nomad's handleTaskStateUpdates does."""
        if stage(runner) == POSTSTOP or runner.stopped or self.alloc.stop_requested():
            return  # stopped on purpose: no fault of its own
        failed = bool(runner.failure) or runner.result is None or not runner.result.successful
        if failed and stage(runner) == PRESTART and not is_sidecar(runner):
            return  # the lifecycle order fails the allocation and stops the sidecars (_rest)
        if not failed and not runner.task.leader:
            return
        with self._kill_lock:
            if self._killed:
                return
            live = [r for r in self.alloc.tasks if r is not runner and stage(r) != POSTSTOP and not r.done.is_set()]
            if not live:
                return
            self._killed = True
        kind = restarts.SIBLING_FAILED if failed else restarts.LEADER_DEAD
        message = restarts.event_message(kind, sibling=runner.task.name)
        for r in live:
            if r.started:
                r.event(f"{kind}: {message}")
            else:  # waiting for its lifecycle stage: it never starts
                r.skip(f"{kind}: {message}")
        # Stopping waits for each task's kill_timeout: not in the ended task's wait thread.
        started = [r for r in live if r.started]
        threading.Thread(target=_kill, args=(started,), daemon=True, name="kill-siblings").start()

    def _unstarted(self) -> list[LifecycleTask]:
        return [r for r in self.alloc.tasks if not r.started and not r.done.is_set()]

    def _stop_sidecars(self, why: str, sibling: str = "") -> None:
        for runner in self.alloc.tasks:
            if is_sidecar(runner) and runner.started and not runner.done.is_set() and not runner.stopped:
                runner.event(f"{why}: {restarts.event_message(why, sibling=sibling)}")
                runner.stop()

    @staticmethod
    def _skip(runners: Sequence[LifecycleTask], why: str) -> None:
        for runner in runners:
            if not runner.started and not runner.done.is_set():
                runner.skip(why)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


def _kill(live: Sequence[LifecycleTask]) -> None:
    """Stop the tasks as Nomad's killTasks does: the leader first, then the others together, the
    sidecars last."""
    for r in [r for r in live if r.task.leader]:
        r.stop()
    rest = [r for r in live if not r.task.leader]
    for group in ([r for r in rest if not is_sidecar(r)], [r for r in rest if is_sidecar(r)]):
        threads = [threading.Thread(target=r.stop, name=f"stop-{r.task.name}") for r in group]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def _outcome(runner: LifecycleTask) -> str:
    if runner.failure:
        return runner.failure
    if runner.result is None:
        return "it did not run"
    if runner.result.signal:
        return f"signal {runner.result.signal}"
    return f"exit code {runner.result.exit_code}"
