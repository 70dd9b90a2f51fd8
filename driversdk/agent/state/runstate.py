"""The runs table of the client's state.db (:class:`~driversdk.agent.state.store.Store`): what
``driversdk run`` and the agent record of allocations and their tasks, with the task handles a later
process needs to find them again. Records come out as frozen dataclasses whose states are
:class:`AllocStatus` / :class:`TaskStatus` (string enums: the values are what the file holds)."""

from __future__ import annotations

import enum
import itertools
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from driversdk.agent.state.store import Store, Table
from driversdk.errors import DriverSDKError, StateWriteError

_TASK_COLUMNS = (
    "alloc_id, job, grp, task, driver, task_id, state, exit_code, signal, oom, handle, alloc_dir, updated, logmon_pid, "
    "restarts"
)

# Events kept per task, as Nomad's client keeps a task's last ten.
TASK_EVENTS_KEPT = 10
# Parsed events kept in memory: the last ten of 2000 tasks; past that the cache starts again.
PARSED_EVENTS_CACHED = 20_000

_TASK_QUERY = (
    "SELECT alloc_id, job, grp, task, driver, task_id, state, exit_code, signal, oom, alloc_dir, updated, "
    "handle, logmon_pid, restarts FROM run_tasks"
)


class AllocStatus(enum.StrEnum):
    """An allocation's state in ``run_allocs``: running until its runner ends it."""

    RUNNING = "running"
    STOPPED = "stopped"  # every task ended or was stopped, and the teardown succeeded
    FAILED = "failed"  # a task failed, a prerun hook failed, or the teardown did


class TaskStatus(enum.StrEnum):
    """A task's state in ``run_tasks`` (what ``driversdk status`` and the API show)."""

    STARTING = "starting"  # recorded before StartTask: an interrupted start is found again
    RUNNING = "running"
    RESTARTING = "restarting"  # exited; its restart policy starts it again after a delay
    COMPLETE = "complete"  # exited 0, or stopped on purpose
    FAILED = "failed"
    STOPPED = "stopped"  # the run ended while the task still ran
    LOST = "lost"  # ended while no run followed it, how unknown


# Each state by its stored text: a dict lookup, where calling the enum costs a microsecond a row and
# an answer about 1000 allocations converts thousands of rows.
_ALLOC_STATUSES = {status.value: status for status in AllocStatus}
_TASK_STATUSES = {status.value: status for status in TaskStatus}

_T = TypeVar("_T")

# One-allocation reads kept by the allocation's version (allocation, tasks, events: three each).
KEPT_BY_VERSION = 30_000

# Allocation row writes remembered (by allocation) for allocs() to read only what changed; past
# this many, everything kept is read again once.
ALLOC_ROW_WRITES_KEPT = 50_000

# Allocation ids bound to one read (SQLite's limit on a statement's parameters is 999 in old builds).
IDS_PER_READ = 500

_ALLOC_COLUMNS = "alloc_id, job, grp, idx, alloc_dir, state, run_pid, network, csi"


@dataclass(frozen=True)
class AllocRecord:
    alloc_id: str
    job: str
    group: str
    index: int
    alloc_dir: str
    state: AllocStatus
    run_pid: int
    network: str | None
    csi: str | None


@dataclass(frozen=True)
class KeptEvent:
    """One kept event of a task (``RunEvent.to_json``), under its row's sequence number. Shared by
    every reader of the row: read it, never change it."""

    seq: int
    event: Mapping[str, Any]


class RunStateError(DriverSDKError):
    """A task or log that the run state does not know."""


@dataclass(frozen=True)
class TaskStart:
    """Which task a start is of, and how: recorded before StartTask (``starting``) and again with
    the driver's handle once it returned (``started``)."""

    alloc_id: str
    job: str
    group: str
    task: str
    driver: str
    task_id: str
    alloc_dir: str
    logmon_pid: int = 0
    restarts: int = 0  # times the restart policy started the task before this start


@dataclass(frozen=True)
class TaskRecord:
    alloc_id: str
    job: str
    group: str
    task: str
    driver: str
    task_id: str
    state: TaskStatus
    exit_code: int | None
    signal: int | None
    oom: bool
    alloc_dir: str
    updated: float
    handle: bytes | None = None
    logmon_pid: int = 0
    restarts: int = 0  # times the restart policy started the task again


# What allocs() keeps of one job's allocations: the write generation they were read at, them, and
# each one's rowid (the order they are listed in).
_KeptAllocs = tuple[int, list[tuple["AllocRecord", float]], dict[str, int]]


class RunState(Table):
    """The runs tables (``run_allocs``, ``run_tasks``, ``run_task_events``, ``run_plugins``) on a
    :class:`Store`, or on the store of a data dir (a convenience for the CLI and tests)."""

    def __init__(self, store: Store | str, *, writer: bool = False) -> None:
        """``writer``: this process writes the data dir (the agent, or a run embedding one), so
        what it read of an allocation is kept until its own write moves the version; a reader of
        a data dir another process writes (the CLI with --data-dir) reads every time."""
        super().__init__(store)
        self._writer = writer
        self._parsed: dict[int, KeptEvent] = {}
        self._versions: dict[str, int] = {}
        self._kept_by_version: dict[tuple[str, str], tuple[int, object]] = {}
        self._clock = itertools.count(1)
        # Moves on with every write of an allocation row (not of its tasks): allocs() is kept per job
        # at the generation it was read at, and reads again the rows written since (by
        # _alloc_row_written). Read before the rows, so a write racing a read only costs one more
        # read.
        self._alloc_rows = 0
        # By allocation: the generation of its row's last write, and its job when this store
        # inserted the row (an allocation's job never changes).
        self._alloc_row_written: dict[str, tuple[int, str | None]] = {}
        self._allocs_kept: dict[str | None, _KeptAllocs] = {}

    # --- what a failed write was recording ------------------------------------------------------

    @contextmanager
    def _recording(self, what: str | Callable[[], str], alloc_id: str | None = None) -> Iterator[None]:
        """Hold the lock for one write; a :class:`StateWriteError` says what was being recorded
        (``what``, worked out only then when it is a function). A write about ``alloc_id`` moves
        the allocation's version on."""
        try:
            with self._lock:
                yield
                if alloc_id is not None:
                    self._versions[alloc_id] = next(self._clock)
        except StateWriteError as err:
            raise err.about(what if isinstance(what, str) else what()) from None

    def _of_task(self, what: str, alloc_id: str, task: str, job: str | None = None) -> Callable[[], str]:
        """What a write about a task was recording, for its error: the job is looked up then."""

        def said() -> str:
            known = job
            if known is None:
                try:
                    with self._lock:
                        row = self._db.execute("SELECT job FROM run_allocs WHERE alloc_id=?", (alloc_id,)).fetchone()
                except DriverSDKError:
                    row = None
                known = str(row[0]) if row else None
            return f'{what} of task "{task}" of ' + (
                f'job "{known}"' if known is not None else f"allocation {alloc_id[:8]}"
            )

        return said

    def version(self, alloc_id: str) -> int:
        """A number that changes whenever this store records anything about the allocation (its
        row, its tasks, their events); 0 for one it has not written to since it was opened. The
        agent is the only writer of its data dir, so an unchanged version means unchanged rows."""
        return self._versions.get(alloc_id, 0)

    # --- allocations ---------------------------------------------------------------------------

    def alloc_started(self, alloc_id: str, job: str, group: str, index: int, alloc_dir: str) -> None:
        with self._recording(f'the start of allocation {alloc_id[:8]} of job "{job}"', alloc_id=alloc_id):
            self._db.execute(
                "INSERT OR REPLACE INTO run_allocs VALUES (?, ?, ?, ?, ?, 'running', ?, NULL, NULL, ?)",
                (alloc_id, job, group, index, alloc_dir, os.getpid(), time.time()),
            )
            self._alloc_row_writes(alloc_id, inserted_for=job)

    def alloc_update(self, alloc_id: str, **fields: str | int | None) -> None:
        allowed = {"state", "run_pid", "network", "csi"}
        assert set(fields) <= allowed, fields
        if "state" in fields:
            fields["state"] = AllocStatus(str(fields["state"])).value  # nothing else is ever written
        assignments = ", ".join(f"{k}=?" for k in fields)
        with self._recording(f"the {' and '.join(fields)} of allocation {alloc_id[:8]}", alloc_id=alloc_id):
            self._db.execute(
                f"UPDATE run_allocs SET {assignments}, updated=? WHERE alloc_id=?",
                (*fields.values(), time.time(), alloc_id),
            )
            self._alloc_row_writes(alloc_id)

    def running_allocs(self, job: str) -> list[AllocRecord]:
        with self._read_lock:
            rows = self._reader.execute(
                f"SELECT {_ALLOC_COLUMNS} FROM run_allocs WHERE job=? AND state='running' ORDER BY updated",
                (job,),
            ).fetchall()
        return [_alloc_record(r) for r in rows]

    def allocs(self, job: str | None = None) -> list[tuple[AllocRecord, float]]:
        """Every allocation (of one job), oldest first, with when it last changed (Unix seconds).
        Kept, and after writes of allocation rows only the rows written since are read again: an
        API client waiting on a job's allocations asks after every change, and while 1000
        allocations start or stop each writes its row, so reading and converting every row each
        time was most of what a job list cost."""
        if not self._writer:
            return [(_alloc_record(r), float(r[9] or 0)) for r in self._alloc_rows_of(job)]
        generation = self._alloc_rows
        kept = self._allocs_kept.get(job)
        if kept is not None and kept[0] == generation:
            return list(kept[1])
        if kept is None:
            rows = self._alloc_rows_of(job)
            found = [(_alloc_record(r), float(r[9] or 0)) for r in rows]
            rowids = {r[0]: int(r[10]) for r in rows}
        else:
            since, before, rowids = kept
            # Written since, and of this job: a row it had, or one inserted for it.
            written = [
                alloc_id
                for alloc_id, (at, inserted_for) in list(self._alloc_row_written.items())
                if at > since and (alloc_id in rowids or (inserted_for is not None and job in (None, inserted_for)))
            ]
            if not written:
                self._allocs_kept[job] = (generation, before, rowids)
                return list(before)
            rows = [r for r in self._alloc_rows_of(None, written) if job is None or r[1] == job]
            now = {r[0]: (_alloc_record(r), float(r[9] or 0)) for r in rows}
            rowids = dict(rowids)
            was = {alloc_id: rowids.pop(alloc_id, None) for alloc_id in written}
            moved = any(was[r[0]] != r[10] for r in rows)  # a new row, or one replaced: a new rowid
            rowids.update((r[0], int(r[10])) for r in rows)
            gone = set(written) - now.keys()
            found = [now.get(pair[0].alloc_id) or pair for pair in before if pair[0].alloc_id not in gone]
            if moved:  # in rowid order again
                found = sorted({pair[0].alloc_id: pair for pair in found + list(now.values())}.values(),
                               key=lambda pair: rowids[pair[0].alloc_id])  # fmt: skip
        if len(self._allocs_kept) > 64:
            self._allocs_kept.clear()
        self._allocs_kept[job] = (generation, found, rowids)
        return list(found)

    def _alloc_rows_of(self, job: str | None, alloc_ids: Sequence[str] | None = None) -> list[tuple[Any, ...]]:
        """The rows of run_allocs (of one job, or the allocations ``alloc_ids``), in rowid order,
        with their ``updated`` and rowid last."""
        return self._read_rows(f"SELECT {_ALLOC_COLUMNS}, updated, rowid FROM run_allocs", "rowid", job, alloc_ids)

    def _alloc_row_writes(self, alloc_id: str, inserted_for: str | None = None) -> None:
        """Count a write of an allocation's row (under the write lock): allocs() reads it again.
        ``inserted_for``: the job of a row this write inserted."""
        self._alloc_rows += 1
        if len(self._alloc_row_written) > ALLOC_ROW_WRITES_KEPT:
            self._alloc_row_written.clear()
            self._allocs_kept.clear()  # what was kept cannot tell what changed since: read all again
        before = self._alloc_row_written.get(alloc_id)
        job = inserted_for or (before[1] if before is not None else None)
        self._alloc_row_written[alloc_id] = (self._alloc_rows, job)

    def alloc_by_id(self, alloc_id: str) -> tuple[AllocRecord, float] | None:
        """One allocation by its whole id, with when it last changed."""

        def read() -> tuple[AllocRecord, float] | None:
            with self._read_lock:
                row = self._reader.execute(
                    f"SELECT {_ALLOC_COLUMNS}, updated FROM run_allocs WHERE alloc_id=?",
                    (alloc_id,),
                ).fetchone()
            return None if row is None else (_alloc_record(row), float(row[9] or 0))

        return self._of_version("alloc", alloc_id, read)

    def _of_version(self, what: str, alloc_id: str, read: Callable[[], _T]) -> _T:
        """``read()`` of one allocation, kept until the allocation's version moves: an API client
        asking about one allocation again and again (a UI, a script waiting on it) is answered
        without a read of state.db, so while hundreds of allocations start its answer does not
        queue behind their reads and writes. The version is taken before the read (see version)."""
        if not self._writer:
            return read()
        version = self.version(alloc_id)
        kept = self._kept_by_version.get((what, alloc_id))
        if kept is not None and kept[0] == version:
            return cast(_T, kept[1])
        value = read()
        if len(self._kept_by_version) >= KEPT_BY_VERSION:
            self._kept_by_version.clear()
        self._kept_by_version[(what, alloc_id)] = (version, value)
        return value

    def allocs_by_prefix(self, prefix: str) -> list[tuple[AllocRecord, float]]:
        """Allocations whose id starts with ``prefix`` (Nomad's CLI takes a short id)."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        with self._read_lock:
            rows = self._reader.execute(
                f"SELECT {_ALLOC_COLUMNS}, updated FROM run_allocs WHERE alloc_id LIKE ? ESCAPE '\\' ORDER BY rowid",
                (escaped + "%",),
            ).fetchall()
        return [(_alloc_record(r), float(r[9] or 0)) for r in rows]

    # --- garbage collection of terminal allocations (driversdk.agent.allocgc) -------------------

    def terminal_allocs(self) -> list[AllocRecord]:
        """Allocations that are over (stopped or failed), the one over longest first: the order
        Nomad's client garbage-collects them in."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_ALLOC_COLUMNS} FROM run_allocs WHERE state IN ('stopped', 'failed') ORDER BY updated, rowid",
            ).fetchall()
        return [_alloc_record(r) for r in rows]

    def alloc_count(self) -> int:
        """Allocations this data dir knows, whatever their state (Nomad's NumAllocs)."""
        with self._read_lock:
            return int(self._reader.execute("SELECT COUNT(*) FROM run_allocs").fetchone()[0])

    def csi_use_left(self, alloc_id: str) -> bool:
        """Whether a CSI volume claim or staging use of the allocation is not released yet."""
        with self._lock:
            claim = self._db.execute("SELECT 1 FROM volume_claims WHERE alloc_id=? LIMIT 1", (alloc_id,)).fetchone()
            usage = self._db.execute("SELECT 1 FROM csi_usage WHERE alloc_id=? LIMIT 1", (alloc_id,)).fetchone()
        return claim is not None or usage is not None

    def alloc_collected(self, alloc_id: str) -> None:
        """Forget a garbage-collected allocation and its tasks, as Nomad's client deletes a
        destroyed allocation from its state."""
        with self._recording(f"the garbage collection of allocation {alloc_id[:8]}", alloc_id=alloc_id):
            self._db.execute("BEGIN IMMEDIATE")  # both rows or neither: `status` never shows half of it
            try:
                self._db.execute("DELETE FROM run_tasks WHERE alloc_id=?", (alloc_id,))
                self._db.execute("DELETE FROM run_allocs WHERE alloc_id=?", (alloc_id,))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            self._alloc_row_writes(alloc_id)

    # --- driver plugins: one per driver per run process (the driver manager) --------------------

    def allocs_without_tasks(self) -> list[AllocRecord]:
        """Allocations no task of which was ever started (a prerun hook failed), oldest first."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_ALLOC_COLUMNS} FROM run_allocs a "
                "WHERE NOT EXISTS (SELECT 1 FROM run_tasks t WHERE t.alloc_id = a.alloc_id) ORDER BY updated",
            ).fetchall()
        return [_alloc_record(r) for r in rows]

    def plugin_started(self, driver: str, reattach: str) -> None:
        with self._recording(f'the launch of the "{driver}" driver plugin'):
            self._db.execute("INSERT OR REPLACE INTO run_plugins VALUES (?, ?, ?)", (driver, os.getpid(), reattach))

    def plugins_to_adopt(self, driver: str, alive: Callable[[int], bool]) -> list[tuple[int, str]]:
        """Reattach configs of this driver's plugins whose run process is gone (newest first), as
        (run pid, config): a restarted run takes one over. A live run's plugin is its own."""
        with self._lock:
            rows = self._db.execute(
                "SELECT run_pid, reattach FROM run_plugins WHERE driver=? ORDER BY rowid DESC", (driver,)
            ).fetchall()
        return [(int(pid), str(config)) for pid, config in rows if pid == os.getpid() or not alive(int(pid))]

    def plugin_adopted(self, driver: str, old_pid: int, reattach: str) -> None:
        with self._recording(f'the take-over of the "{driver}" driver plugin'):
            self._db.execute("DELETE FROM run_plugins WHERE driver=? AND run_pid=?", (driver, old_pid))
            self._db.execute("INSERT OR REPLACE INTO run_plugins VALUES (?, ?, ?)", (driver, os.getpid(), reattach))

    def plugin_gone(self, driver: str, run_pid: int | None = None) -> None:
        pid = os.getpid() if run_pid is None else run_pid
        with self._recording(f'the end of the "{driver}" driver plugin'):
            self._db.execute("DELETE FROM run_plugins WHERE driver=? AND run_pid=?", (driver, pid))

    def retired_plugins(self, driver: str) -> list[tuple[str, str]]:
        """Per-allocation plugins a run before the driver manager left (alloc id, reattach config)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT alloc_id, reattach FROM run_plugins_retired WHERE driver=? ORDER BY rowid DESC", (driver,)
            ).fetchall()
        return [(str(a), str(r)) for a, r in rows]

    def retired_plugin_gone(self, alloc_id: str, driver: str) -> None:
        with self._recording(f'the end of the "{driver}" driver plugin of allocation {alloc_id[:8]}'):
            self._db.execute("DELETE FROM run_plugins_retired WHERE alloc_id=? AND driver=?", (alloc_id, driver))

    def set_logmon(self, alloc_id: str, task: str, pid: int) -> None:
        with self._recording(self._of_task("the log collector", alloc_id, task), alloc_id=alloc_id):
            self._db.execute("UPDATE run_tasks SET logmon_pid=? WHERE alloc_id=? AND task=?", (pid, alloc_id, task))

    def starting(self, start: TaskStart) -> None:
        """Recorded before StartTask: a run killed during the call leaves this row, and the next run
        knows which task id the interrupted start used (so it adopts or removes what it made)."""
        self._record_start(start, TaskStatus.STARTING, None)

    def start_failed(self, alloc_id: str, task: str) -> None:
        with self._recording(self._of_task("the failed start", alloc_id, task), alloc_id=alloc_id):
            self._db.execute(
                "UPDATE run_tasks SET state='failed', updated=? WHERE alloc_id=? AND task=? AND state='starting'",
                (time.time(), alloc_id, task),
            )

    def started(self, start: TaskStart, handle: bytes) -> None:
        """The task runs: its row with the driver's handle."""
        self._record_start(start, TaskStatus.RUNNING, handle)

    def _record_start(self, start: TaskStart, state: TaskStatus, handle: bytes | None) -> None:
        with self._recording(
            self._of_task("the start", start.alloc_id, start.task, start.job), alloc_id=start.alloc_id
        ):
            self._db.execute(
                f"INSERT OR REPLACE INTO run_tasks ({_TASK_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, 0, ?, ?, ?, ?, ?)",
                (
                    start.alloc_id, start.job, start.group, start.task, start.driver, start.task_id, state.value,
                    handle, start.alloc_dir, time.time(), start.logmon_pid, start.restarts,
                ),
            )  # fmt: skip

    def restarting(self, alloc_id: str, task: str, exit_code: int, signal: int, restarts: int) -> None:
        """The task exited and its restart policy starts it again after a delay. A run killed
        meanwhile leaves this row (with the exited task's handle); the next run restarts it."""
        with self._recording(self._of_task("the restart", alloc_id, task), alloc_id=alloc_id):
            self._db.execute(
                "UPDATE run_tasks SET state='restarting', exit_code=?, signal=?, restarts=?, updated=? "
                "WHERE alloc_id=? AND task=?",
                (exit_code, signal, restarts, time.time(), alloc_id, task),
            )

    def finished(self, alloc_id: str, task: str, exit_code: int, signal: int, oom: bool) -> None:
        state = TaskStatus.COMPLETE if exit_code == 0 and signal == 0 else TaskStatus.FAILED
        with self._recording(self._of_task("the exit", alloc_id, task), alloc_id=alloc_id):
            self._db.execute(
                "UPDATE run_tasks SET state=?, exit_code=?, signal=?, oom=?, updated=? WHERE alloc_id=? AND task=?",
                (state.value, exit_code, signal, int(oom), time.time(), alloc_id, task),
            )

    def killed(self, alloc_id: str, task: str) -> None:
        """The task was stopped on purpose (Ctrl-C, its sidecar role done, a sibling failed): it is
        dead and not failed, as Nomad's Killed task. Its last exit stays in its Terminated event."""
        with self._recording(self._of_task("the stop", alloc_id, task), alloc_id=alloc_id):
            self._db.execute(
                "UPDATE run_tasks SET state='complete', exit_code=NULL, signal=NULL, updated=? "
                "WHERE alloc_id=? AND task=?",
                (time.time(), alloc_id, task),
            )

    def task_event(self, alloc_id: str, task: str, event: Mapping[str, object]) -> None:
        """Keep one of a task's events (``RunEvent.to_json``); the last TASK_EVENTS_KEPT are kept."""
        with self._recording(self._of_task("an event", alloc_id, task), alloc_id=alloc_id):
            self._db.execute(
                "INSERT INTO run_task_events (alloc_id, task, event) VALUES (?, ?, ?)",
                (alloc_id, task, json.dumps(event, sort_keys=True)),
            )
            self._db.execute(
                "DELETE FROM run_task_events WHERE alloc_id=? AND task=? AND seq NOT IN "
                "(SELECT seq FROM run_task_events WHERE alloc_id=? AND task=? ORDER BY seq DESC LIMIT ?)",
                (alloc_id, task, alloc_id, task, TASK_EVENTS_KEPT),
            )

    def task_events(self, alloc_id: str, task: str) -> list[dict[str, Any]]:
        """A task's kept events, oldest first."""
        with self._read_lock:
            rows = self._reader.execute(
                "SELECT seq, event FROM run_task_events WHERE alloc_id=? AND task=? ORDER BY seq", (alloc_id, task)
            ).fetchall()
        return [dict(self._kept(seq, text).event) for seq, text in rows]

    def lost(self, alloc_id: str, task: str) -> None:
        """The task ended while no run followed it and its driver cannot tell how (Nomad's "lost"):
        no exit code is recorded."""
        with self._recording(self._of_task("the loss", alloc_id, task), alloc_id=alloc_id):
            self._db.execute(
                "UPDATE run_tasks SET state='lost', exit_code=NULL, signal=NULL, updated=? WHERE alloc_id=? AND task=?",
                (time.time(), alloc_id, task),
            )

    def stopped(self, alloc_id: str, task: str) -> None:
        """The run ended while the task had not exited by itself (Ctrl-C, or a failure elsewhere)."""
        with self._recording(self._of_task("the stop", alloc_id, task), alloc_id=alloc_id):
            self._db.execute(
                "UPDATE run_tasks SET state='stopped', updated=? WHERE alloc_id=? AND task=? AND state='running'",
                (time.time(), alloc_id, task),
            )

    def tasks(self, alloc_id: str | None = None) -> list[TaskRecord]:
        if alloc_id is None:
            with self._read_lock:
                rows = self._reader.execute(_TASK_QUERY + " ORDER BY updated").fetchall()
            return [_task_record(r) for r in rows]

        def read() -> list[TaskRecord]:
            with self._read_lock:
                rows = self._reader.execute(_TASK_QUERY + " WHERE alloc_id=? ORDER BY updated", (alloc_id,)).fetchall()
            return [_task_record(r) for r in rows]

        return list(self._of_version("tasks", alloc_id, read))

    def tasks_by_alloc(
        self, job: str | None = None, alloc_ids: Sequence[str] | None = None
    ) -> dict[str, list[TaskRecord]]:
        """Every task (of one job, or of the allocations ``alloc_ids``) by allocation, in one read
        (a few for many ids): an answer about many allocations reads their tasks once, not once per
        allocation."""
        found: dict[str, list[TaskRecord]] = {}
        for r in self._read_rows(_TASK_QUERY, "updated", job, alloc_ids):
            found.setdefault(r[0], []).append(_task_record(r))
        return found

    def events_by_task(
        self, job: str | None = None, alloc_id: str | None = None, alloc_ids: Sequence[str] | None = None
    ) -> dict[tuple[str, str], list[KeptEvent]]:
        """The kept events of every task (of one job, of one allocation, or of the allocations
        ``alloc_ids``) by (allocation, task), oldest first, in one read (a few for many ids)."""
        query = "SELECT seq, alloc_id, task, event FROM run_task_events"
        if alloc_id is not None:
            one = alloc_id
            kept = self._of_version(
                "events", one, lambda: self._events_found(self._read_rows(query, "seq", None, [one]))
            )
            return {key: list(events) for key, events in kept.items()}
        if job is not None and alloc_ids is None:
            with self._read_lock:
                rows = self._reader.execute(
                    query + " WHERE alloc_id IN (SELECT alloc_id FROM run_allocs WHERE job=?) ORDER BY seq", (job,)
                ).fetchall()
            return self._events_found(rows)
        return self._events_found(self._read_rows(query, "seq", None, alloc_ids))

    def _events_found(self, rows: Iterable[tuple[Any, ...]]) -> dict[tuple[str, str], list[KeptEvent]]:
        found: dict[tuple[str, str], list[KeptEvent]] = {}
        for seq, alloc, task, text in rows:
            found.setdefault((alloc, task), []).append(self._kept(seq, text))
        return found

    def _read_rows(
        self, query: str, order: str, job: str | None, alloc_ids: Sequence[str] | None
    ) -> list[tuple[Any, ...]]:
        """The rows of ``query`` (a table with ``job`` and ``alloc_id`` columns, or ``alloc_id``
        only when ``job`` is None) of one job, of some allocations, or all, ordered by ``order``.
        Ids go in as parameters, IDS_PER_READ at a time; each part is ordered, not the whole."""
        with self._read_lock:
            if alloc_ids is not None:
                rows: list[tuple[Any, ...]] = []
                for start in range(0, len(alloc_ids), IDS_PER_READ):
                    part = alloc_ids[start : start + IDS_PER_READ]
                    marks = ",".join("?" * len(part))
                    rows += self._reader.execute(
                        f"{query} WHERE alloc_id IN ({marks}) ORDER BY {order}", part
                    ).fetchall()
                return rows
            if job is None:
                return self._reader.execute(f"{query} ORDER BY {order}").fetchall()
            return self._reader.execute(f"{query} WHERE job=? ORDER BY {order}", (job,)).fetchall()

    def _kept(self, seq: int, text: str) -> KeptEvent:
        """A kept event, parsed once: a row never changes under its seq (it is only deleted)."""
        event = self._parsed.get(seq)
        if event is None:
            if len(self._parsed) >= PARSED_EVENTS_CACHED:
                self._parsed.clear()  # the newest are read again on the next answer
            event = self._parsed[seq] = KeptEvent(seq, json.loads(text))
        return event


def _alloc_record(r: tuple[Any, ...]) -> AllocRecord:
    """A row that starts with ``_ALLOC_COLUMNS``."""
    return AllocRecord(r[0], r[1], r[2], r[3], r[4], _ALLOC_STATUSES[r[5]], r[6], r[7], r[8])


def _task_record(r: tuple[Any, ...]) -> TaskRecord:
    """A row of ``_TASK_QUERY``."""
    return TaskRecord(
        alloc_id=r[0],
        job=r[1],
        group=r[2],
        task=r[3],
        driver=r[4],
        task_id=r[5],
        state=_TASK_STATUSES[r[6]],
        exit_code=r[7],
        signal=r[8],
        oom=bool(r[9]),
        alloc_dir=r[10],
        updated=r[11],
        handle=r[12],
        logmon_pid=r[13],
        restarts=r[14],
    )
