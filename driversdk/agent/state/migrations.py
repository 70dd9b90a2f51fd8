"""Numbered migrations of ``state.db``; ``PRAGMA user_version`` says how many have run.

Migration 1 is the schema as the three stores created it before there were versions (run
state, CSI state, volume store), so a database of any earlier version lands on the same
tables; each later migration is one change, in order, in one transaction with the version
bump, so a second process opening the file meanwhile waits and then finds it done.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from driversdk.errors import DriverSDKError


class StateVersionError(DriverSDKError):
    """The state file was written by a newer driversdk than this one."""


# Exactly as runstate.py, csi/state.py and volumes.py created them before migrations existed.
_V1_TABLES = [
    """CREATE TABLE IF NOT EXISTS run_tasks (
    alloc_id TEXT NOT NULL, job TEXT NOT NULL, grp TEXT NOT NULL, task TEXT NOT NULL, driver TEXT NOT NULL,
    task_id TEXT NOT NULL, state TEXT NOT NULL, exit_code INTEGER, signal INTEGER, oom INTEGER,
    handle BLOB, alloc_dir TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (alloc_id, task)
)""",
    """CREATE TABLE IF NOT EXISTS run_allocs (
    alloc_id TEXT PRIMARY KEY, job TEXT NOT NULL, grp TEXT NOT NULL, idx INTEGER NOT NULL, alloc_dir TEXT NOT NULL,
    state TEXT NOT NULL, run_pid INTEGER NOT NULL, network TEXT, csi TEXT, updated REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS run_plugins (
    alloc_id TEXT NOT NULL, driver TEXT NOT NULL, reattach TEXT NOT NULL, PRIMARY KEY (alloc_id, driver)
)""",
    """CREATE TABLE IF NOT EXISTS csi_usage (
    plugin_id TEXT NOT NULL, namespace TEXT NOT NULL, volume_id TEXT NOT NULL, usage TEXT NOT NULL,
    alloc_id TEXT NOT NULL, phase TEXT NOT NULL, volume_json TEXT NOT NULL,
    PRIMARY KEY (plugin_id, namespace, volume_id, usage, alloc_id)
)""",
    """CREATE TABLE IF NOT EXISTS csi_staged (
    plugin_id TEXT NOT NULL, namespace TEXT NOT NULL, volume_id TEXT NOT NULL, usage TEXT NOT NULL,
    PRIMARY KEY (plugin_id, namespace, volume_id, usage)
)""",
    """CREATE TABLE IF NOT EXISTS csi_plugins (
    type TEXT NOT NULL, name TEXT NOT NULL, alloc_id TEXT NOT NULL, position INTEGER NOT NULL,
    record TEXT NOT NULL, PRIMARY KEY (type, name, alloc_id)
)""",
    "CREATE TABLE IF NOT EXISTS volumes (namespace TEXT NOT NULL, id TEXT NOT NULL, record TEXT NOT NULL, "
    "PRIMARY KEY (namespace, id))",
    "CREATE TABLE IF NOT EXISTS volume_claims (namespace TEXT NOT NULL, volume_id TEXT NOT NULL, "
    "alloc_id TEXT NOT NULL, job TEXT NOT NULL, mode TEXT NOT NULL, access_mode TEXT NOT NULL, "
    "attachment_mode TEXT NOT NULL, PRIMARY KEY (namespace, volume_id, alloc_id))",
]


def _v1_unversioned_schema(db: sqlite3.Connection) -> None:
    for statement in _V1_TABLES:
        db.execute(statement)
    columns = {r[1] for r in db.execute("PRAGMA table_info(run_tasks)")}
    if "logmon_pid" not in columns:  # written before log collectors were processes
        db.execute("ALTER TABLE run_tasks ADD COLUMN logmon_pid INTEGER NOT NULL DEFAULT 0")


def _v2_one_plugin_per_driver(db: sqlite3.Connection) -> None:
    """Driver plugins were one per allocation; now one per driver per ``run`` process (the driver
    manager). The old per-allocation rows are kept aside as retired plugins: the manager adopts a
    live one as its driver's instance and shuts the others down once their tasks are recovered."""
    db.execute(
        "CREATE TABLE run_plugins_retired (alloc_id TEXT NOT NULL, driver TEXT NOT NULL, reattach TEXT NOT NULL, "
        "PRIMARY KEY (alloc_id, driver))"
    )
    db.execute("INSERT INTO run_plugins_retired SELECT alloc_id, driver, reattach FROM run_plugins")
    db.execute("DROP TABLE run_plugins")
    db.execute(
        "CREATE TABLE run_plugins (driver TEXT NOT NULL, run_pid INTEGER NOT NULL, reattach TEXT NOT NULL, "
        "PRIMARY KEY (driver, run_pid))"
    )


def _v3_claims_that_end(db: sqlite3.Connection) -> None:
    """Claims get a life: a state (``taken``; past: ``unpublishing``, ``node-detached``), what the
    volume watcher needs to release them without the allocation (``detail``: plugin, usage, paths,
    CSI node id), and its progress (``last_error``, ``attempts``, ``next_attempt``). Existing
    claims stay taken; the watcher finds the terminal ones."""
    for column in (
        "state TEXT NOT NULL DEFAULT 'taken'",
        "detail TEXT NOT NULL DEFAULT '{}'",
        "last_error TEXT NOT NULL DEFAULT ''",
        "attempts INTEGER NOT NULL DEFAULT 0",
        "next_attempt REAL NOT NULL DEFAULT 0",
        "updated REAL NOT NULL DEFAULT 0",
    ):
        db.execute(f"ALTER TABLE volume_claims ADD COLUMN {column}")


def _v4_task_restarts(db: sqlite3.Connection) -> None:
    """Tasks are restarted by their restart policy: how often, for ``driversdk status``."""
    db.execute("ALTER TABLE run_tasks ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0")


def _v5_idle_plugins(db: sqlite3.Connection) -> None:
    """Plugins a finished run kept for the next one (``driversdk run`` plugin linger): the
    fingerprint of the command and plugin config they were configured with (only a run with the
    same one may take them), their reattach config, and since when they wait."""
    db.execute(
        "CREATE TABLE idle_plugins (reattach TEXT PRIMARY KEY, driver TEXT NOT NULL, fingerprint TEXT NOT NULL, "
        "since REAL NOT NULL)"
    )


def _v6_no_kept_plugins(db: sqlite3.Connection) -> None:
    """Runs keep no plugin for the next one any more: each shuts down what it launched. The rows
    of plugins an older version kept are dropped with their table; such a plugin stops by itself
    once idle (it was launched with an idle exit), and nothing reattaches to it again."""
    db.execute("DROP TABLE IF EXISTS idle_plugins")


def _v7_task_events(db: sqlite3.Connection) -> None:
    """Each task's last events (Nomad's task event types, with exit code and signal), for
    ``driversdk status`` to show why a task ended."""
    db.execute(
        "CREATE TABLE run_task_events (seq INTEGER PRIMARY KEY AUTOINCREMENT, alloc_id TEXT NOT NULL, "
        "task TEXT NOT NULL, event TEXT NOT NULL)"
    )
    db.execute("CREATE INDEX run_task_events_task ON run_task_events (alloc_id, task, seq)")


def _v8_agent_jobs(db: sqlite3.Connection) -> None:
    """Jobs registered with the agent (``PUT /v1/jobs``): each job's specification in Nomad's API
    JSON, its status, whether it was told to stop, and Nomad's version and indexes, so a restarted
    agent runs (or stops) what it was told before it went down."""
    db.execute(
        "CREATE TABLE agent_jobs (id TEXT PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL, "
        "stop INTEGER NOT NULL DEFAULT 0, submit_time INTEGER NOT NULL, version INTEGER NOT NULL, "
        "create_index INTEGER NOT NULL, modify_index INTEGER NOT NULL)"
    )
    db.execute(
        "CREATE TABLE agent_acl (accessor TEXT PRIMARY KEY, secret_sha256 TEXT NOT NULL, name TEXT NOT NULL, "
        "type TEXT NOT NULL, create_time INTEGER NOT NULL)"
    )


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _v1_unversioned_schema,
    _v2_one_plugin_per_driver,
    _v3_claims_that_end,
    _v4_task_restarts,
    _v5_idle_plugins,
    _v6_no_kept_plugins,
    _v7_task_events,
    _v8_agent_jobs,
]
SCHEMA_VERSION = len(MIGRATIONS)


def version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migrate(db: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Run the pending migrations up to ``target`` in one transaction; returns the version."""
    if version(db) == target:
        return target  # the common case: no write lock taken
    db.execute("BEGIN IMMEDIATE")
    try:
        current = version(db)
        if current > SCHEMA_VERSION:
            raise StateVersionError(
                f"the state database was written by a newer driversdk (schema version {current}; this one knows up "
                f"to {SCHEMA_VERSION}); run that version, or use another data_dir"
            )
        for number in range(current + 1, target + 1):
            MIGRATIONS[number - 1](db)
            db.execute(f"PRAGMA user_version={number}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return target
