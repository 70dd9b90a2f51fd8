"""The agent: what one ``driversdk run`` owned for its lifetime, owned for the agent's.

It holds the data dir (one agent per data dir), the state stores, the driver manager with one
plugin per driver launched at start and kept while the agent lives, and a :class:`JobRunner`
per registered job. Jobs arrive as Nomad's API JSON (``PUT /v1/jobs``), are checked by the same
validation ``driversdk validate`` runs (against the agent's own plugins: nothing is launched to
check a job), recorded, and run. A restarted agent reattaches to its plugins (or relaunches them)
and recovers every task with RecoverTask through the jobs it recorded.

Stopping the agent leaves the tasks running, as stopping a Nomad client does: its plugins are
shut down (containers and task supervisors outlive them) and the next agent recovers the tasks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from driversdk.agent.acl import TokenStore
from driversdk.agent.api.eventstream import EventBuffer
from driversdk.agent.datadirlock import DataDirLock
from driversdk.agent.events import RunEvent
from driversdk.agent.jobrunner import JobRunner
from driversdk.agent.periodic import PeriodicDispatcher, PeriodicError, Schedule
from driversdk.agent.settings import AgentSettings
from driversdk.agent.state.jobstore import JobRecord, JobStatus, JobStore
from driversdk.agent.state.store import Store
from driversdk.errors import ConfigError, DriverSDKError, StateWriteError
from driversdk.jobspec.problems import Problem
from driversdk.mallocarenas import give_back_freed_memory
from driversdk.paths import check_name

if TYPE_CHECKING:
    from driversdk.agent.allocrunner.allocrunner import NodeServices
    from driversdk.agent.pluginmanager.drivermanager import DriverHealth, DriverManager
    from driversdk.agent.validate import DriverFacts
    from driversdk.jobspec.taskenv import Node


# How long shutdown() waits for each state store's current write before it gives up on taking it.
SHUTDOWN_LOCK_WAIT = 30.0
# How long the node's attributes (host, storage: /proc/self/mountinfo, which grows with every
# task's mounts) are served before they are read again. Every allocation in an answer names the
# node: read per allocation, 1000 of them made one list request take seconds and stalled the API.
NODE_INFO_TTL = 15.0

# How often allocation updates move the change index at most (Nomad's client: allocSyncIntv).
ALLOC_SYNC_INTERVAL = 0.2


class JobInvalid(ConfigError):
    """A job the agent will not run: each problem is one sentence."""

    def __init__(self, job: str, problems: list[Problem]) -> None:
        self.problems = problems
        lines = "; ".join(str(p) for p in problems)
        super().__init__(f'job "{job}" is invalid: {lines}' if job else f"the job is invalid: {lines}")


class JobNotFound(DriverSDKError):
    """No job of that id is registered."""


class Agent:
    def __init__(self, settings: AgentSettings, log: Any = None) -> None:
        self.settings = settings
        self.client = settings.client
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.lock = DataDirLock(settings.data_dir)
        self.node: NodeServices | None = None
        self.drivers: DriverManager | None = None
        self.jobs: JobStore | None = None
        self.tokens: TokenStore | None = None
        self.store: Store | None = None  # state.db, opened once: every table above is on it
        self._node_lock = threading.Lock()
        self._node_cache: tuple[float, dict[str, dict[str, str]], Node] | None = None
        self.runners: dict[str, JobRunner] = {}
        self._registering: dict[str, threading.Lock] = {}
        self.started_at = time.time()
        self._lock = threading.RLock()
        # Bumped on every change a client may wait for (Nomad's index, for blocking queries).
        self._changed = threading.Condition()
        self.index = 1
        self._synced_at = 0.0  # when an allocation update last moved the index
        self._sync_due = False  # an update waits for the end of the batching period
        self.events = EventBuffer()
        self._gc: Any = None
        self.periodic: PeriodicDispatcher | None = None
        self._logs_held = False

    # --- log and change index --------------------------------------------------------------------

    def log(self, level: str, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
        self._log(f"    {stamp} [{level.upper()}] {message}")

    def emit(self, event: RunEvent) -> None:
        level = "error" if event.kind == "error" else "info"
        self.log(level, f"client: {event.text().removeprefix('==> ')}")
        if event.alloc_id:
            # On the event stream as Nomad's AllocationUpdated, carrying the event that changed it.
            states = {event.task: {"Events": [event.to_api()]}} if event.task else {}
            allocation = {"ID": event.alloc_id, "JobID": event.job, "TaskGroup": event.group, "TaskStates": states}
            self.events.publish("Allocation", "AllocationUpdated", event.alloc_id, {"Allocation": allocation})
        self._allocation_updated()

    def bump(self) -> None:
        with self._changed:
            self.index += 1
            self._changed.notify_all()

    def _allocation_updated(self) -> None:
        """An allocation's state changed: the index moves at once if it has not moved for an
        allocation update within ALLOC_SYNC_INTERVAL, else once at the end of that period for all
        the updates made in it. Nomad's client syncs allocation updates to its servers in such
        batches, so a blocking query on a job's allocations wakes a few times a second while a
        thousand of them start, not after each of their several thousand events (each answer
        reads the whole list again)."""
        with self._changed:
            if self._sync_due:
                return
            since = time.monotonic() - self._synced_at
            if since >= ALLOC_SYNC_INTERVAL:
                self._synced_at = time.monotonic()
                self.index += 1
                self._changed.notify_all()
                return
            self._sync_due = True
        timer = threading.Timer(ALLOC_SYNC_INTERVAL - since, self._sync_allocations)
        timer.daemon = True
        timer.start()

    def _sync_allocations(self) -> None:
        with self._changed:
            self._sync_due = False
            self._synced_at = time.monotonic()
            self.index += 1
            self._changed.notify_all()

    def wait_change(self, after: int, timeout: float) -> int:
        """Block until the index passes ``after`` or ``timeout`` seconds pass; the current index."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.index <= after:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return self.index

    # --- start / stop ----------------------------------------------------------------------------

    def start(self) -> None:
        """Take the data dir, open the stores, launch (or reattach) the plugins, fingerprint them and
        recover the recorded jobs. Raises DataDirBusy when another agent has the data dir."""
        from driversdk.agent.allocgc import GCPolicy, PeriodicGC
        from driversdk.agent.logmon import tasklogs as logcollect
        from driversdk.agent.pluginmanager.drivermanager import DriverManager
        from driversdk.agent.state.db import prepare_data_dir

        prepare_data_dir(self.settings.data_dir)
        self.lock.acquire()
        try:
            self.store = Store.open(self.client.data_dir)
            self.node = _open_node(self.store, self._state_write_failed)
            # Every task's logs go through the data dir's one collector process (started with the
            # first task that logs, or adopted from an agent before): held for the agent's life.
            logcollect.acquire(self.client.data_dir)
            self._logs_held = True
            self.jobs = JobStore(self.store, writer=True)
            self.tokens = TokenStore(self.store) if self.settings.acl_enabled else None
            self.drivers = self.node.drivers = DriverManager(self.client, self.node.state, self.emit)
            self._fingerprint()
            self._gc = PeriodicGC(self.client.data_dir, self.node.state, GCPolicy.of(self.client),
                                  lambda text: self.log("info", f"client.gc: {text}"))  # fmt: skip
            self._gc.start(room_for=0)
            self.periodic = PeriodicDispatcher(self._launch_child, self._child_running, self.log)
            self._recover()
        except BaseException:
            self._release_logs()
            self.lock.release()
            raise

    def _drivers_to_load(self) -> list[str]:
        from driversdk.bundled import SHIPPED

        names = set(SHIPPED) | set(self.client.plugins)
        return sorted(n for n in names if self.client.driver_command(n) is not None)

    @property
    def facts(self) -> dict[str, DriverFacts]:
        """What each driver's fingerprint told (validation refuses a job against these)."""
        return self.drivers.facts if self.drivers is not None else {}

    @property
    def health(self) -> dict[str, DriverHealth]:
        """Each driver's health as last fingerprinted (the node's Drivers)."""
        return self.drivers.health if self.drivers is not None else {}

    def _fingerprint(self) -> None:
        """Launch (or reattach to) every driver's plugin once and keep it for the agent's life; a
        driver that cannot load is unhealthy, with the reason, and tried again when a job needs it."""
        for driver in self._drivers_to_load():
            self.fingerprint(driver)

    def fingerprint(self, driver: str) -> DriverHealth:
        """The driver manager's fingerprint of ``driver``, logged; its attributes become the node's."""
        assert self.drivers is not None and self.node is not None
        health = self.drivers.fingerprint(driver)
        facts = self.drivers.facts.get(driver)
        if facts is not None:
            self.node.driver_attributes[driver] = dict(facts.attributes)
        self.log("info" if health.healthy else "warn", f"client.driver_mgr: driver {driver}: {health.description}")
        return health

    def _recover(self) -> None:
        """Run again what was running, and stop what was stopped while the agent was down.

        A job whose record says ``running`` had every allocation of its version started: its
        running allocations are recovered (RecoverTask) and the ones that ended are not started
        again; when none is left the job is dead. A ``pending`` job was being started (or
        updated) when the agent went: what it recorded is recovered, the rest started."""
        assert self.jobs is not None
        for record in self.jobs.all():
            if record.status is JobStatus.DEAD:
                continue
            try:
                schedule = Schedule.of(record.id, record.spec)
                if schedule is not None:
                    if not record.stop:
                        assert self.periodic is not None
                        self.periodic.track(schedule)  # launches missed while down are not made up for
                    continue
                job = self._checked(record.id, record.spec)
            except DriverSDKError as err:
                self.log("error", f"client: job {record.id!r} could not be recovered: {err}")
                continue
            self.log("info", f"client: recovering job {record.id!r}" + (" to stop it" if record.stop else ""))
            self._start_runner(job, only_to_stop=record.stop, started=record.status is JobStatus.RUNNING)

    def _state_write_failed(self, err: StateWriteError) -> None:
        """A write of state.db failed in an allocation's thread. The task it was about fails with
        that sentence (its task runner says so), and the agent goes on: one job that cannot be
        recorded is no reason to stop every other (``driversdk run`` ends instead, see
        NodeServices.state_failed). Registrations meanwhile are refused with the same sentence."""
        self.log("error", f"client: {err}")

    def shutdown(self) -> None:
        """Leave the tasks running (the next agent recovers them) and everything recorded: every
        store's lock is taken so no thread records a plugin's exit as a task's, then the plugins are
        shut down and the process ends."""
        assert self.node is not None
        self.log("info", "agent: shutting down; tasks keep running and are recovered by the next agent")
        if self.periodic is not None:
            self.periodic.close()
        if self._gc is not None:
            self._gc.stop()
        locks = [self.node.state.store.write_lock]  # the one writer of every table
        # The locks are never given back: the process ends holding them. A store that cannot be
        # taken (a write stuck on the disk) leaves the plugins running rather than risk a task
        # runner recording their end as its task's (lost, failed); the next agent reattaches them.
        if not all(lock.acquire(timeout=SHUTDOWN_LOCK_WAIT) for lock in locks):
            self.log("warn", "agent: a state store stayed busy; the plugins are left running for the next agent")
            self.lock.release()
            return
        if self.drivers is not None:
            with self.drivers._lock:
                self.drivers._closing = True
                for plugin in list(self.drivers._plugins.values()):
                    plugin.kill()
        self._release_logs()  # the collector serves the tasks left running on; the next agent adopts it
        self.lock.release()

    def close(self) -> None:
        """Shut the plugins down and close the stores (after every job was stopped)."""
        if self.periodic is not None:
            self.periodic.close()
        if self._gc is not None:
            self._gc.stop()
        try:
            if self.node is not None:
                self.node.close()
        finally:
            for table in (self.jobs, self.tokens, self.store):
                if table is not None:
                    table.close()
            self._release_logs()  # every job stopped: the collector, serving nothing, ends
            self.lock.release()

    def _release_logs(self) -> None:
        from driversdk.agent.logmon import tasklogs as logcollect

        if self._logs_held:
            self._logs_held = False
            logcollect.release(self.client.data_dir)

    # --- what the API shows ------------------------------------------------------------------------

    def node_info(self) -> Node:
        """The node as the API shows it, read again at most every NODE_INFO_TTL seconds (Nomad
        fingerprints on an interval too) and whenever a driver's health changed."""
        from driversdk.agent import nodeattrs

        drivers = {name: h.attributes for name, h in self.health.items()}
        with self._node_lock:
            cached = self._node_cache
            if cached is not None and cached[1] == drivers and time.monotonic() - cached[0] < NODE_INFO_TTL:
                return cached[2]
        node = nodeattrs.node(self.client, drivers)
        with self._node_lock:
            self._node_cache = (time.monotonic(), drivers, node)
        return node

    def ports_of(self, alloc_id: str) -> list[dict[str, Any]]:
        """The ports given to a live allocation of this agent (Nomad's AllocatedPorts)."""
        with self._lock:
            runners = list(self.runners.values())
        for runner in runners:
            for alloc in list(runner.allocs):
                if alloc.alloc_id == alloc_id:
                    return [{"Label": p.label, "Value": p.value, "To": p.to, "HostIP": p.host_ip} for p in alloc.ports]
        return []

    @staticmethod
    def version() -> str:
        from driversdk import __version__

        return __version__

    # --- jobs ------------------------------------------------------------------------------------

    def _checked(self, job_id: str, spec: dict[str, Any]) -> Any:
        """The job model of an API job, checked as ``driversdk validate`` checks a job file.

        The validation copy of the job lives in a private temporary directory, not in the data
        dir: the only write a registration makes to the data dir is its one state.db transaction,
        so a full data dir refuses it with that sentence and leaves nothing behind."""
        import shutil
        import tempfile

        from driversdk.agent.validate import validate_job
        from driversdk.jobspec.hcl import Inputs

        try:
            folder = tempfile.mkdtemp(prefix="driversdk-job-")
        except OSError as err:
            raise JobInvalid(job_id, [Problem("", f"the job could not be copied for validation: {err.strerror}; "
                                                  f"free space in {tempfile.gettempdir()}")]) from None  # fmt: skip
        try:
            path = os.path.join(folder, "job.json")
            try:
                with open(path, "w", encoding="utf-8") as fh:
                    json.dump({"Job": spec}, fh)
            except OSError as err:
                raise JobInvalid(job_id, [Problem("", f"the job could not be copied for validation: {err.strerror}; "
                                                      f"free space in {folder}")]) from None  # fmt: skip
            report = validate_job(path, self.client, inputs=Inputs(), known=self.facts, scheduled=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if not report.valid or report.parsed is None:
            # The file is the agent's copy of the request: what the caller sent has no file name.
            problems = [dataclasses.replace(p, file="", message=p.message.replace(path, "the job"))
                        for p in report.problems]  # fmt: skip
            raise JobInvalid(job_id, problems)
        if report.parsed.name != job_id:
            raise JobInvalid(job_id, [Problem("", f"the job's ID {job_id!r} and name {report.parsed.name!r} differ; "
                                                  "driversdk keeps one job per name", field="ID")])  # fmt: skip
        return report.parsed

    def _job_id(self, spec: dict[str, Any]) -> str:
        job_id = spec.get("ID") or spec.get("Name")
        if not isinstance(job_id, str) or not job_id:
            raise JobInvalid("", [Problem("", "the job has no ID (and no Name to take it from)", field="ID")])
        problem = check_name(job_id, "job ID")
        if problem:
            raise JobInvalid("", [Problem("", problem, field="ID")])
        return job_id

    def check(self, spec: dict[str, Any]) -> None:
        """Validate a job as registering it would (``POST /v1/validate/job``); nothing is kept."""
        job_id = self._job_id(spec)
        self._checked(job_id, dict(spec, ID=job_id))

    def register(self, spec: dict[str, Any]) -> JobRecord:
        """Check, record and run a job (an update replaces the job's allocations with new ones)."""
        assert self.jobs is not None
        job_id = self._job_id(spec)
        spec = dict(spec, ID=job_id)
        spec.setdefault("Name", job_id)
        job = self._checked(job_id, spec)
        try:
            schedule = Schedule.of(job_id, spec)
        except PeriodicError as err:
            raise JobInvalid(job_id, [Problem("", str(err), field="periodic")]) from None
        if schedule is not None:
            return self._register_periodic(job_id, spec, schedule)
        with self._lock:
            one_at_a_time = self._registering.setdefault(job_id, threading.Lock())
        # Two registrations of one job at once: the second waits until the first has replaced
        # the allocations, and then finds its runner (an unchanged job keeps it).
        with one_at_a_time:
            with self._lock:
                record, changed = self.jobs.put(job_id, spec)
                running = self.runners.get(job_id)
                if running is not None and not running.ended.is_set() and not changed:
                    return record
            if record.status is JobStatus.DEAD:
                # Run again unchanged: pending until its allocations started, so an agent
                # restarted meanwhile recovers them (a dead job is not recovered).
                self.jobs.set_status(job_id, JobStatus.PENDING)
            if running is not None:
                running.stop()
            self._start_runner(job)
        self._job_event("JobRegistered", record)
        self.bump()
        return record

    def _job_event(self, kind: str, record: JobRecord) -> None:
        """A job's registration or stop on the event stream (Nomad's Job topic)."""
        job = {"ID": record.id, "Name": record.name, "Type": record.type, "Version": record.version,
               "Stop": kind == "JobDeregistered", "ModifyIndex": record.modify_index}  # fmt: skip
        self.events.publish("Job", kind, record.id, {"Job": job})

    def _register_periodic(self, job_id: str, spec: dict[str, Any], schedule: Schedule) -> JobRecord:
        """A periodic job runs no allocation of its own: the dispatcher launches a child job at
        each time of its schedule. The parent is running for as long as it is scheduled."""
        assert self.jobs is not None and self.periodic is not None
        with self._lock:
            record, _ = self.jobs.put(job_id, spec)
            running = self.runners.pop(job_id, None)
        if running is not None:
            running.stop()  # it was a job of its own before this update
        self.jobs.set_status(job_id, JobStatus.RUNNING)
        self.periodic.track(schedule)
        self._job_event("JobRegistered", record)
        self.bump()
        return record

    def _launch_child(self, spec: dict[str, Any]) -> None:
        self.register(spec)

    def _child_running(self, child_id: str) -> bool:
        with self._lock:
            runner = self.runners.get(child_id)
        return runner is not None and not runner.ended.is_set()

    def force_launch(self, job_id: str) -> str:
        """Launch a periodic job's child now (``POST /v1/job/:id/periodic/force``); its id."""
        assert self.jobs is not None and self.periodic is not None
        record = self.jobs.get(job_id)
        if record is None:
            raise JobNotFound(f'job "{job_id}" is not registered')
        schedule = Schedule.of(job_id, record.spec)
        if schedule is None or record.stop:
            raise JobInvalid(job_id, [Problem("", f'job "{job_id}" is not a periodic job that is scheduled',
                                              field="periodic")])  # fmt: skip
        return self.periodic.launch_now(schedule)

    def _start_runner(self, job: Any, only_to_stop: bool = False, started: bool = False) -> None:
        """Run the job's allocations; the job is ``running`` once every one of them was started
        (or recovered), which is what tells a restarted agent not to start ended ones again."""
        assert self.node is not None and self.drivers is not None and self.jobs is not None
        runner = JobRunner(job, self.client, self.node, self.drivers, self.emit, self._runner_ended,
                           only_to_stop=only_to_stop, started=started, on_running=self._runner_running)  # fmt: skip
        with self._lock:
            self.runners[job.name] = runner
        runner.start()

    def _runner_running(self, runner: JobRunner) -> None:
        assert self.jobs is not None
        with self._lock:
            if self.runners.get(runner.job.name) is runner:
                try:
                    self.jobs.set_status(runner.job.name, JobStatus.RUNNING)
                except DriverSDKError as err:
                    self.log("error", f"client: {err}")
        self.bump()

    def _runner_ended(self, runner: JobRunner) -> None:
        assert self.jobs is not None
        with self._lock:
            if self.runners.get(runner.job.name) is runner:
                try:
                    self.jobs.set_status(runner.job.name, JobStatus.DEAD)
                except DriverSDKError as err:
                    self.log("error", f"client: {err}")
        self.bump()

    def deregister(self, job_id: str, purge: bool = False) -> JobRecord | None:
        """Stop the job's allocations (the stop is recorded first: an agent restarted meanwhile
        stops them too); ``purge`` forgets the job afterwards."""
        assert self.jobs is not None
        record = self.jobs.get(job_id)
        if record is None:
            raise JobNotFound(f'job "{job_id}" is not registered')
        self.jobs.mark_stopped(job_id)
        if self.periodic is not None:
            self.periodic.untrack(job_id)
        with self._lock:
            runner = self.runners.get(job_id)
        self._job_event("JobDeregistered", record)
        self.bump()

        def finish() -> None:
            if runner is not None:
                runner.stop()
            if purge:
                assert self.jobs is not None and self.node is not None
                self.jobs.purge(job_id)
                with self._lock:
                    if self.runners.get(job_id) is runner:
                        self.runners.pop(job_id, None)
                from driversdk.agent.allocgc import collect_job

                # Its allocations go with it (Nomad's GC of a purged job): a new job of the same ID
                # starts with none. One whose claims or mounts are not released yet is kept, said.
                report = collect_job(self.client.data_dir, self.node.state, job_id)
                for line in report.lines():
                    self.log("info", f"client.gc: {line}")
            self.bump()
            give_back_freed_memory()

        threading.Thread(target=finish, name=f"stop-{job_id}", daemon=True).start()
        return record


def _open_node(store: Store, report: Callable[[StateWriteError], None]) -> NodeServices:
    """The node's stores, whose failed state write is reported to the agent instead of stopping
    every allocation of the node (see Agent._state_write_failed)."""
    from driversdk.agent.allocrunner.allocrunner import NodeServices

    @dataclass
    class AgentNode(NodeServices):
        def state_failed(self, err: StateWriteError) -> None:
            if self.state_failure is None:
                self.state_failure = err
            report(err)

    return AgentNode.open(store)
