"""Jobs registered with the agent, kept in ``state.db`` (table ``agent_jobs``, migration 8).

A job is kept as Nomad's API JSON, the form ``PUT /v1/jobs`` received it in, with Nomad's
bookkeeping beside it: the status (``pending``, ``running``, ``dead``), whether it was told to
stop, its version (one more on each change of the specification) and the create and modify
indexes. A restarted agent reads them back to run what it was told to run, and to stop what was
stopped while it was down.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass
from typing import Any

from driversdk.agent.state.store import Store, Table
from driversdk.errors import StateWriteError


class JobStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DEAD = "dead"


@dataclass(frozen=True)
class JobRecord:
    id: str
    spec: dict[str, Any]
    status: JobStatus
    stop: bool
    submit_time: int  # Unix nanoseconds, as Nomad's SubmitTime
    version: int
    create_index: int
    modify_index: int

    @property
    def type(self) -> str:
        return str(self.spec.get("Type") or "service")

    @property
    def name(self) -> str:
        return str(self.spec.get("Name") or self.id)


_COLUMNS = "id, spec, status, stop, submit_time, version, create_index, modify_index"


class JobStore(Table):
    """The jobs table on a :class:`Store`, or on the store of a data dir. Reads (every API answer
    naming a job) use the store's reader: they see the last commit without queueing behind the
    writes (and fsyncs) of a registration."""

    def __init__(self, store: Store | str, *, writer: bool = False) -> None:
        """``writer``: this process is the data dir's writer, and get() keeps what it read (see
        RunState); a reader of a data dir another process writes reads every time."""
        super().__init__(store)
        self._writer = writer
        # Moves on after every write of this table through this store; get() keeps each job's
        # record until then (every answer about an allocation names its job, and the agent is the
        # only writer of its data dir). Read before the row, so a racing write costs a read again.
        self._writes = 0
        self._kept: dict[str, tuple[int, JobRecord]] = {}

    def _written(self) -> None:
        self._writes += 1

    def _record(self, row: tuple[Any, ...]) -> JobRecord:
        return JobRecord(row[0], json.loads(row[1]), JobStatus(row[2]), bool(row[3]), *row[4:])

    def _next_index(self) -> int:
        row = self._db.execute("SELECT MAX(modify_index) FROM agent_jobs").fetchone()
        return int(row[0] or 0) + 1

    def put(self, job_id: str, spec: dict[str, Any]) -> tuple[JobRecord, bool]:
        """Register or update a job; returns the record and whether its specification changed
        (an unchanged one keeps its version, as Nomad's does)."""
        text = json.dumps(spec, sort_keys=True)
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    row = self._db.execute(f"SELECT {_COLUMNS} FROM agent_jobs WHERE id=?", (job_id,)).fetchone()
                    index = self._next_index()
                    now = time.time_ns()
                    if row is None:
                        self._db.execute(
                            "INSERT INTO agent_jobs VALUES (?, ?, 'pending', 0, ?, 0, ?, ?)",
                            (job_id, text, now, index, index),
                        )
                        changed = True
                    else:
                        old = self._record(row)
                        changed = json.dumps(old.spec, sort_keys=True) != text or old.stop
                        if changed:
                            self._db.execute(
                                "UPDATE agent_jobs SET spec=?, status='pending', stop=0, submit_time=?, version=?, "
                                "modify_index=? WHERE id=?",
                                (text, now, old.version + 1, index, job_id),
                            )
                    self._db.execute("COMMIT")
                    self._written()
                except BaseException:
                    # SQLite rolls back by itself a transaction a full disk ended (SQLITE_FULL).
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
        except StateWriteError as err:
            raise err.about(f'job "{job_id}"') from None
        record = self.get(job_id)
        assert record is not None
        return record, changed

    def get(self, job_id: str) -> JobRecord | None:
        writes = self._writes
        kept = self._kept.get(job_id) if self._writer else None
        if kept is not None and kept[0] == writes:
            return kept[1]
        with self._read_lock:
            row = self._reader.execute(f"SELECT {_COLUMNS} FROM agent_jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            return None
        record = self._record(row)
        if len(self._kept) > 1024:
            self._kept.clear()
        self._kept[job_id] = (writes, record)
        return record

    def all(self) -> list[JobRecord]:
        with self._read_lock:
            rows = self._reader.execute(f"SELECT {_COLUMNS} FROM agent_jobs ORDER BY id").fetchall()
        return [self._record(r) for r in rows]

    def set_status(self, job_id: str, status: JobStatus) -> None:
        self._update(job_id, "status=?", (status.value,))

    def mark_stopped(self, job_id: str) -> None:
        self._update(job_id, "stop=1", ())

    def _update(self, job_id: str, assignment: str, values: tuple[Any, ...]) -> None:
        try:
            with self._lock:
                index = self._next_index()
                self._db.execute(
                    f"UPDATE agent_jobs SET {assignment}, modify_index=? WHERE id=?", (*values, index, job_id)
                )
                self._written()
        except StateWriteError as err:
            raise err.about(f'job "{job_id}"') from None

    def purge(self, job_id: str) -> None:
        try:
            with self._lock:
                self._db.execute("DELETE FROM agent_jobs WHERE id=?", (job_id,))
                self._written()
        except StateWriteError as err:
            raise err.about(f'job "{job_id}"') from None

    def index(self) -> int:
        with self._lock:
            return self._next_index() - 1
