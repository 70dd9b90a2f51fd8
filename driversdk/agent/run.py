"""``driversdk run``: run jobs' allocations on this machine through their driver plugins.

Shaped as Nomad's client: each allocation is an :class:`~driversdk.agent.allocrunner.allocrunner.AllocRunner`
running its alloc hooks (alloc dir, CSI plugin dir, group network, CSI volumes) and one
:class:`~driversdk.agent.allocrunner.taskrunner.TaskRunner` per task (task dir, log collection, CSI plugin
supervisor, volume mounts), and every task reaches its driver through the one
:class:`~driversdk.agent.pluginmanager.drivermanager.DriverManager` of the process (one plugin per driver).
Every step is recorded in ``<data_dir>/state.db``; a run that was killed and started again
recovers its allocations (reattach or relaunch the plugins, RecoverTask, adopt the log
collectors, keep the mounts) instead of starting duplicates. On the way out everything is
undone in reverse. What happens is reported as :class:`~driversdk.agent.events.RunEvent` s.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from driversdk.agent.allocgc import GCPolicy, PeriodicGC
from driversdk.agent.events import Emit, RunEvent, RunEventType, error_event
from driversdk.agent.state.runstate import AllocRecord
from driversdk.agent.validate import validate_job
from driversdk.errors import ConfigError, DriverSDKError, StateWriteError
from driversdk.jobspec.clientconfig import ClientConfig
from driversdk.jobspec.hcl import FilePolicy, Inputs
from driversdk.jobspec.job import Group, Job
from driversdk.plugin.host import pid_alive

if TYPE_CHECKING:
    from driversdk.agent.allocrunner.allocrunner import AllocRunner, NodeServices
    from driversdk.agent.pluginmanager.drivermanager import DriverManager
    from driversdk.client import DriverClient

# Allocations of one count started side by side at most (each start is mostly waiting on its
# driver plugin: StartTask, runc or dockerd), see _side_by_side.
ALLOC_START_CONCURRENCY = 8
# ... and stopped: each mostly waits out its task's kill_timeout (a task ignoring SIGTERM, as any
# container init without a handler does), so a count of n takes about n / this x kill_timeout. A
# stop in flight holds a thread here and one in the plugin while it waits; 128 took a count = 1000
# job's teardown from 43 s to under 30 s (bench/bench_agent.py) where 32 could not go below 31 s.
ALLOC_STOP_CONCURRENCY = 128

# Exit codes of `driversdk run` (README "Run a job on one machine").
EXIT_OK = 0
EXIT_TASK_FAILED = 1  # a task failed, a start failed, or the run was interrupted
EXIT_REFUSED = 2  # refused: validation, the job is run elsewhere, or an allocation's setup refused it


def _load_run_side() -> None:
    """Import what runs allocations (the alloc and task runners, their hooks).

    Called by validation once it has connected to the job's plugins and asked each for its config
    schema: a plugin loads what that first call needs (the docker plugin: the docker SDK) in the
    time these imports take, instead of this process importing them first and waiting idle after."""


class RunRefused(ConfigError):
    """The job asks for something ``driversdk run`` does not do."""


class AlreadyRunning(RunRefused):
    """Another live ``driversdk run`` process owns the job's allocations."""


class AllocRefused(RunRefused):
    """An allocation's setup hooks refused the job (a static port held on the host, a network that
    cannot be made, a volume the node cannot give): no task of it ran, so the job is refused."""

    def __init__(self, event: RunEvent) -> None:
        self.event = event  # the error as a line of its own: JSON in ``run --json``
        super().__init__(f"{event.message}{event.where(with_task=True)}")


class RunFailed(DriverSDKError):
    """What ends a run that started: a task that could not be started (once its restart policy
    gave up) or an allocation that could not be set up, named by job, allocation and task."""

    def __init__(self, event: RunEvent) -> None:
        self.event = event  # the error as a line of its own: JSON in ``run --json``
        super().__init__(f"{event.message}{event.where(with_task=True)}")


def _failed(err: DriverSDKError, allocs: list[AllocRunner]) -> RunFailed:
    """The start failure ``err`` with the job, allocation and task it is about."""
    message = str(err)
    for alloc in reversed(allocs):
        for runner in alloc.tasks:
            if runner.failure == message:
                return RunFailed(error_event(message, job=alloc.job.name, group=alloc.group.name,
                                             alloc_id=alloc.alloc_id, task=runner.task.name))  # fmt: skip
    failed = next((a for a in reversed(allocs) if a.prerun_failed), allocs[-1] if allocs else None)
    if failed is None:
        return RunFailed(error_event(message))
    return RunFailed(error_event(message, job=failed.job.name, group=failed.group.name, alloc_id=failed.alloc_id))


def _refused_in_setup(err: DriverSDKError, allocs: list[AllocRunner]) -> bool:
    """Whether ``err`` is a refusal by an allocation's setup hooks (what the node cannot give the
    job), not a task that failed: only the alloc hooks that run before any task raise it."""
    from driversdk.agent.csi.csihook import CSIHookError

    if not isinstance(err, ConfigError | CSIHookError):
        return False
    tasks = [r for a in allocs for r in a.tasks]
    if any(r.failure or (r.result is not None and not r.result.successful) for r in tasks):
        return False  # a task ran and failed (a CSI plugin task, say): that failure is what ended the run
    return any(a.prerun_failed for a in allocs)


def log_files(alloc_dir: str, task: str, kind: str) -> list[str]:
    """A task's rotated log files of one kind, oldest first."""
    logs = os.path.join(alloc_dir, "alloc", "logs")
    prefix = f"{task}.{kind}."
    if os.path.islink(logs):  # the task may swap its logs dir, or a log file, for a link to a host path
        return []
    try:
        names = [n for n in os.listdir(logs) if n.startswith(prefix) and n[len(prefix) :].isdigit()]
    except FileNotFoundError:
        return []
    paths = [os.path.join(logs, n) for n in sorted(names, key=lambda n: int(n[len(prefix) :]))]
    from driversdk.agent.logmon import tasklogs as logcollect

    return [p for p in paths if logcollect.is_log_file(p)]


def _order(jobs: list[Job]) -> list[tuple[Job, Group, int]]:
    """Groups that provide CSI plugins start first (and stop last): the others may mount through them."""
    groups = [(job, g) for job in jobs for g in job.groups]
    groups.sort(key=lambda jg: not any(t.csi_plugin is not None for t in jg[1].tasks))
    return [(job, g, i) for job, g in groups for i in range(g.count)]


def _plan(jobs: list[Job], node: NodeServices) -> list[tuple[Job, Group, int, AllocRecord | None]]:
    """One allocation per (job, group, index): recovered when a previous run left it running.
    Raises :class:`RunRefused` for what no allocation could run, before any of them starts."""
    from driversdk.agent.allocrunner.hooks.network import NetworkHook

    previous: dict[tuple[str, str, int], AllocRecord] = {}
    for job in jobs:
        for group in job.groups:
            refusal = NetworkHook.refusal(group)
            if refusal is not None:
                raise RunRefused(refusal)
        for earlier in node.state.running_allocs(job.name):
            if earlier.run_pid != os.getpid() and pid_alive(earlier.run_pid):
                raise AlreadyRunning(
                    f'job "{job.name}" is already being run by driversdk run (pid {earlier.run_pid}); stop that run '
                    "(Ctrl-C) before running the job again, or check it with `driversdk status`"
                )
            previous[(job.name, earlier.group, earlier.index)] = earlier
    return [(job, g, i, previous.get((job.name, g.name, i))) for job, g, i in _order(jobs)]


def _side_by_side(group: Group, record: AllocRecord | None) -> bool:
    """Whether allocations of this group may start concurrently with each other: fresh ones of a
    group that neither provides CSI plugins nor claims CSI volumes (plugin registration and
    claims are ordered on purpose) and shares the host network (a bridge creates a namespace and
    forwards through the driver and iptables). What they do share is locked: the run state, the
    port allocator, the driver manager."""
    return (
        record is None
        and (group.network_mode or "host") == "host"
        and not any(t.csi_plugin is not None for t in group.tasks)
        and not any(v.type == "csi" for v in group.volumes.values())
    )


def _batches(
    plan: list[tuple[Job, Group, int, AllocRecord | None]],
) -> list[list[tuple[Job, Group, int, AllocRecord | None]]]:
    """The plan in order, cut into runs of allocations that may start together (see
    _side_by_side; one allocation per batch otherwise)."""
    out: list[list[tuple[Job, Group, int, AllocRecord | None]]] = []
    for item in plan:
        job, group, _, record = item
        last = out[-1] if out else None
        if (
            last is not None
            and last[0][0] is job
            and last[0][1] is group
            and _side_by_side(group, record)
            and _side_by_side(last[0][1], last[0][3])
        ):
            last.append(item)
        else:
            out.append([item])
    return out


def _validate(
    paths: list[str], client: ClientConfig, emit: Emit, variables: Inputs | None = None
) -> tuple[list[Job], dict[str, DriverClient], dict[str, dict[str, str]]]:
    """Every job checked before anything starts; the driver plugins validation launched are kept
    (one per driver) for the driver manager, with the node attributes they fingerprinted."""
    spare: dict[str, DriverClient] = {}
    attributes: dict[str, dict[str, str]] = {}
    jobs: list[Job] = []
    refused = False
    for path in paths:
        kept: dict[str, DriverClient] = {}
        # File functions read only below the job file's directory (see FilePolicy).
        inputs = dataclasses.replace(variables or Inputs(), files=FilePolicy.beside(path))
        report = validate_job(path, client, keep_plugins=kept, inputs=inputs, while_starting=_load_run_side)
        for driver, plugin in kept.items():
            if driver in spare:
                plugin.kill()  # an earlier job's validation kept one already
            else:
                spare[driver] = plugin
                if driver in report.driver_attributes:
                    attributes[driver] = report.driver_attributes[driver]
        if not report.valid or report.parsed is None:
            refused = True
            for problem in report.problems:
                emit(RunEvent("error", str(problem), job=report.job))
            continue
        if any(j.name == report.parsed.name for j in jobs):
            refused = True
            emit(
                RunEvent(
                    "error", f'{path}: job "{report.parsed.name}" is given twice; run each job once', job=report.job
                )
            )
        jobs.append(report.parsed)
    if refused:
        for plugin in spare.values():
            plugin.kill()
        return [], {}, {}
    return jobs, spare, attributes


def run_jobs(
    paths: list[str],
    client: ClientConfig,
    emit: Emit,
    stop: threading.Event | None = None,
    variables: Inputs | None = None,
) -> int:
    """Run the jobs' allocations in this process until their tasks finish (or ``stop``); returns
    the exit code (EXIT_OK, EXIT_TASK_FAILED, EXIT_REFUSED). Every plugin the run launched is shut
    down before it returns: nothing of it runs on. ``variables``: the jobs' variable values
    (``-var``, ``-var-file``, ``NOMAD_VAR_*``), as ``nomad job run`` takes them."""
    emit = _one_at_a_time(emit)  # tasks start and exit in threads of their own: one line at a time
    jobs, spare, attributes = _validate(paths, client, emit, variables)
    if not jobs:
        return EXIT_REFUSED
    from driversdk.agent import interrupts
    from driversdk.agent.allocrunner.allocrunner import NodeServices
    from driversdk.agent.logmon import tasklogs as logcollect
    from driversdk.agent.pluginmanager.drivermanager import DriverManager
    from driversdk.csi.cancel import CallCancelled

    try:
        node = NodeServices.open(client.data_dir)  # StateWriteError on a full or read-only data dir
    except BaseException:
        for plugin in spare.values():
            plugin.kill()
        raise
    stop = stop or threading.Event()
    # A signal also cancels CSI calls in flight (runner.interrupts): the first those of setup,
    # a second those of teardown.
    run_interrupts = interrupts.start(client.data_dir, lambda count: _interrupted_again(emit, count))
    previous: dict[signal.Signals, Any] = {}

    def interrupted(*_: object) -> None:
        stop.set()
        run_interrupts.signal()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, interrupted)
    node.stopping = stop
    node.driver_attributes.update(attributes)  # fingerprinted by the plugins the driver manager takes over
    drivers = node.drivers = DriverManager(client, node.state, emit, spare)
    allocs: list[AllocRunner] = []
    bounds: list[int] = []  # where each batch's allocations end in ``allocs``
    collector: PeriodicGC | None = None
    # The data dir's one log collector process serves every task of the run; held (and started on
    # the first task that logs) until the run ends, then let go of (see logcollect.release).
    logcollect.acquire(client.data_dir)
    try:
        plan = _plan(jobs, node)  # RunRefused: the CLI says so and exits EXIT_REFUSED
        # Terminal allocations of earlier runs are collected as Nomad's client does (allocgc).
        collector = PeriodicGC(client.data_dir, node.state, GCPolicy.of(client), lambda t: emit(RunEvent("run", t)))
        collector.start(room_for=sum(1 for *_, record in plan if record is None))
        for batch in _batches(plan):
            if stop.is_set():
                break
            try:
                _start_batch(batch, client, emit, node, drivers, allocs, stop)
            except CallCancelled:
                if not stop.is_set():
                    raise
                break  # a claim given up on the interrupt: said as "interrupted" below, not as its error
            except StateWriteError:
                raise
            except DriverSDKError as err:
                if stop.is_set():
                    break  # a start (or its restart delay) cut short by Ctrl-C: "interrupted" below
                failed = _failed(err, allocs)
                if _refused_in_setup(err, allocs):
                    raise AllocRefused(failed.event) from None
                raise failed from None
            finally:
                bounds.append(len(allocs))
        tasks = [t for a in allocs for t in a.tasks]
        # CSI plugin tasks serve the others: the run ends when every other task has finished
        # (poststop tasks too; sidecars are stopped when their main tasks are done).
        main = [t for t in tasks if t.task.csi_plugin is None] or tasks
        # Each task's own event ends the wait the moment it finishes (no polling interval added
        # to every run); ``stop`` (a signal) is looked at every 0.2 s.
        for t in main:
            while not stop.is_set() and not t.done.wait(0.2):
                pass
        if node.state_failure is not None:
            emit(RunEvent("run", "state.db cannot be written: stopping tasks"))
        elif stop.is_set():
            emit(RunEvent("run", "interrupted: stopping tasks", type=RunEventType.INTERRUPTED))
        # A task the run stopped (a sidecar whose main tasks are done, the siblings of a dead leader
        # or of a failed task) ends killed, and that is no failure of its own (Nomad's too).
        judged = [t for t in main if not (t.stopped and not t.failure)]
        ok = all(t.result is not None and t.result.successful for t in judged) and not any(t.failure for t in tasks)
        ok = ok and not any(a.failure for a in allocs)
        return EXIT_OK if ok and not stop.is_set() else EXIT_TASK_FAILED
    except StateWriteError as err:
        node.state_failed(err)
        raise
    finally:
        # Every step runs whatever the one before raised; a state write that failed (in any
        # thread, or in the teardown) ends the run with the first such sentence.
        if collector is not None:
            collector.stop()  # before the run's own allocations become terminal
        try:
            _tear_down(allocs, bounds)
        except StateWriteError as err:
            node.state_failed(err)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            interrupts.stop(run_interrupts)
            try:
                node.close()  # the driver manager shuts down what is left (validation's unused plugins)
            except StateWriteError as err:
                node.state_failed(err)
            finally:
                logcollect.release(client.data_dir)
        if node.state_failure is not None:
            raise node.state_failure


def _interrupted_again(emit: Emit, count: int) -> None:
    if count == 2:
        emit(
            RunEvent(
                "run",
                "interrupted again: giving up the CSI volume teardown; what it leaves stays a past claim (see "
                "`driversdk volume status`), released by the volume watcher of the next `driversdk run` or "
                "`driversdk volume` command, or now with `driversdk volume detach <volume>`",
            )
        )


def _start_batch(
    batch: list[tuple[Job, Group, int, AllocRecord | None]],
    client: ClientConfig,
    emit: Emit,
    node: NodeServices,
    drivers: DriverManager,
    allocs: list[AllocRunner],
    stop: threading.Event,
) -> None:
    """Run one batch's allocations, concurrently when there are several (at most
    ALLOC_START_CONCURRENCY at a time). Each is in ``allocs`` before it starts, so teardown
    undoes whatever part of it ran; the first failure is raised once every started one has
    returned; after ``stop`` no further one starts."""
    from driversdk.agent.allocrunner.allocrunner import AllocRunner

    if len(batch) == 1:
        job, group, index, record = batch[0]
        alloc = AllocRunner(job, group, index, client, emit, node, drivers, record)
        allocs.append(alloc)
        alloc.run()
        return
    lock = threading.Lock()
    errors: list[BaseException] = []

    def start(item: tuple[Job, Group, int, AllocRecord | None]) -> None:
        job, group, index, record = item
        with lock:
            if stop.is_set() or errors:
                return
            alloc = AllocRunner(job, group, index, client, emit, node, drivers, record)
            allocs.append(alloc)
        try:
            alloc.run()
        except BaseException as err:  # raised below, once the others have returned
            with lock:
                errors.append(err)

    with ThreadPoolExecutor(
        max_workers=min(ALLOC_START_CONCURRENCY, len(batch)), thread_name_prefix="alloc-start"
    ) as pool:
        list(pool.map(start, batch))
    if errors:
        raise errors[0]


def _tear_down(allocs: list[AllocRunner], bounds: list[int]) -> None:
    """Stop and close every allocation, batches in reverse order of start (CSI plugin groups,
    started first, go last). The allocations of one batch were started side by side and are
    stopped the same way: each waits for its tasks' kill_timeout, so they wait together. The
    first failure is raised once every allocation has been stopped and closed."""
    errors: list[BaseException] = []
    ends = [*bounds, len(allocs)]
    slices = [allocs[a:b] for a, b in zip([0, *ends], ends, strict=False) if b > a]

    def one(alloc: AllocRunner) -> None:
        try:
            alloc.stop()
        except BaseException as err:  # the others are still torn down
            errors.append(err)
        try:
            alloc.close()
        except BaseException as err:
            errors.append(err)

    for batch in reversed(slices):
        if len(batch) == 1:
            one(batch[0])
            continue
        with ThreadPoolExecutor(
            max_workers=min(ALLOC_STOP_CONCURRENCY, len(batch)), thread_name_prefix="alloc-stop"
        ) as pool:
            list(pool.map(one, reversed(batch)))
    if errors:
        raise errors[0]


def _one_at_a_time(emit: Emit) -> Emit:
    lock = threading.Lock()

    def serialized(event: RunEvent) -> None:
        with lock:
            emit(event)

    return serialized


def run_job(path: str, client: ClientConfig, say: Any = print, stop: threading.Event | None = None) -> int:
    """One job, reported as text lines through ``say``."""
    return run_jobs([path], client, lambda event: say(event.text()), stop)
