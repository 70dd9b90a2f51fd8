"""What `driversdk run` records in the client's state.db: allocations and their tasks, with the
task handles a later process needs to find them again."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass

from driversdk.errors import DriverSDKError

SCHEMA = """
CREATE TABLE IF NOT EXISTS run_tasks (
    alloc_id TEXT NOT NULL, job TEXT NOT NULL, grp TEXT NOT NULL, task TEXT NOT NULL, driver TEXT NOT NULL,
    task_id TEXT NOT NULL, state TEXT NOT NULL, exit_code INTEGER, signal INTEGER, oom INTEGER,
    handle BLOB, alloc_dir TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (alloc_id, task)
);
"""


class RunStateError(DriverSDKError):
    """A task or log that the run state does not know."""


@dataclass(frozen=True)
class TaskRecord:
    alloc_id: str
    job: str
    group: str
    task: str
    driver: str
    task_id: str
    state: str
    exit_code: int | None
    signal: int | None
    oom: bool
    alloc_dir: str
    updated: float


class RunState:
    def __init__(self, data_dir: str) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self._db = sqlite3.connect(os.path.join(data_dir, "state.db"), check_same_thread=False, isolation_level=None)
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def started(
        self, alloc_id: str, job: str, group: str, task: str, driver: str, task_id: str, handle: bytes, alloc_dir: str
    ) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO run_tasks VALUES (?, ?, ?, ?, ?, ?, 'running', NULL, NULL, 0, ?, ?, ?)",
                (alloc_id, job, group, task, driver, task_id, handle, alloc_dir, time.time()),
            )

    def finished(self, alloc_id: str, task: str, exit_code: int, signal: int, oom: bool) -> None:
        state = "complete" if exit_code == 0 and signal == 0 else "failed"
        with self._lock:
            self._db.execute(
                "UPDATE run_tasks SET state=?, exit_code=?, signal=?, oom=?, updated=? WHERE alloc_id=? AND task=?",
                (state, exit_code, signal, int(oom), time.time(), alloc_id, task),
            )

    def stopped(self, alloc_id: str, task: str) -> None:
        """The run ended while the task had not exited by itself (Ctrl-C, or a failure elsewhere)."""
        with self._lock:
            self._db.execute(
                "UPDATE run_tasks SET state='stopped', updated=? WHERE alloc_id=? AND task=? AND state='running'",
                (time.time(), alloc_id, task),
            )

    def tasks(self) -> list[TaskRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT alloc_id, job, grp, task, driver, task_id, state, exit_code, signal, oom, alloc_dir, updated "
                "FROM run_tasks ORDER BY updated"
            ).fetchall()
        return [
            TaskRecord(
                alloc_id=r[0],
                job=r[1],
                group=r[2],
                task=r[3],
                driver=r[4],
                task_id=r[5],
                state=r[6],
                exit_code=r[7],
                signal=r[8],
                oom=bool(r[9]),
                alloc_dir=r[10],
                updated=r[11],
            )
            for r in rows
        ]

    def close(self) -> None:
        self._db.close()
