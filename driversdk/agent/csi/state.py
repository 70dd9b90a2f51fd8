"""The CSI tables of ``state.db`` (:class:`~driversdk.agent.state.store.Store`): who uses which
published volume, what is staged, and which plugins are registered, so a restarted process can
finish what it started."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from driversdk.agent.state.store import Store, Table


@dataclass(frozen=True)
class UsageRow:
    plugin_id: str
    namespace: str
    volume_id: str
    usage: str
    alloc_id: str
    phase: str
    volume_json: str


class StateStore(Table):
    """The CSI tables on a :class:`Store`, or on the store of a state file path; safe to share
    between threads of one process."""

    def __init__(self, store: Store | str) -> None:
        super().__init__(store, file=True)
        self.path = self.store.path

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _write(self, sql: str, params: tuple[str, ...]) -> None:
        """One statement, committed on its own: SQLite makes a lone statement its own atomic
        transaction (the connection is in autocommit mode), which saves BEGIN and COMMIT round
        trips on the hot path of every mount; several statements go through :meth:`_tx`."""
        with self._lock:
            self._db.execute(sql, params)

    # --- usage ---------------------------------------------------------------------------------

    def set_usage(self, row: UsageRow) -> None:
        self._write(
            "INSERT OR REPLACE INTO csi_usage VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row.plugin_id, row.namespace, row.volume_id, row.usage, row.alloc_id, row.phase, row.volume_json),
        )

    def drop_usage(self, plugin_id: str, namespace: str, volume_id: str, usage: str, alloc_id: str) -> int:
        """Remove one alloc's use; returns how many allocs still use (volume, usage)."""
        with self._tx() as db:
            db.execute(
                "DELETE FROM csi_usage WHERE plugin_id=? AND namespace=? AND volume_id=? AND usage=? AND alloc_id=?",
                (plugin_id, namespace, volume_id, usage, alloc_id),
            )
            (left,) = db.execute(
                "SELECT COUNT(*) FROM csi_usage WHERE plugin_id=? AND namespace=? AND volume_id=? AND usage=?",
                (plugin_id, namespace, volume_id, usage),
            ).fetchone()
        return int(left)

    def finish_mount(self, row: UsageRow, staged: bool) -> None:
        """Record a finished mount: the use as "mounted" and, when this mount staged the volume,
        the stage, in one transaction. Neither protects an RPC of the mount: until this is
        written the "mounting" row leads a teardown through NodeUnstageVolume all the same, and
        a stage that was never recorded is staged again (idempotent) by the next mount."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO csi_usage VALUES (?, ?, ?, ?, ?, ?, ?)",
                (row.plugin_id, row.namespace, row.volume_id, row.usage, row.alloc_id, row.phase, row.volume_json),
            )
            if staged:
                db.execute(
                    "INSERT OR REPLACE INTO csi_staged VALUES (?, ?, ?, ?)",
                    (row.plugin_id, row.namespace, row.volume_id, row.usage),
                )

    def others_using(self, plugin_id: str, namespace: str, volume_id: str, usage: str, alloc_id: str) -> int:
        """How many allocs other than ``alloc_id`` use (volume, usage): a read, no write."""
        with self._lock:
            (left,) = self._db.execute(
                "SELECT COUNT(*) FROM csi_usage WHERE plugin_id=? AND namespace=? AND volume_id=? AND usage=? "
                "AND alloc_id!=?",
                (plugin_id, namespace, volume_id, usage, alloc_id),
            ).fetchone()
        return int(left)

    def finish_unstage(self, plugin_id: str, namespace: str, volume_id: str, usage: str, alloc_id: str) -> None:
        """Drop the last alloc's use and the stage together, once NodeUnstageVolume is done: until
        then the alloc's "unmounting" row is what lets a restarted process finish the unstage."""
        with self._tx() as db:
            db.execute(
                "DELETE FROM csi_usage WHERE plugin_id=? AND namespace=? AND volume_id=? AND usage=? AND alloc_id=?",
                (plugin_id, namespace, volume_id, usage, alloc_id),
            )
            db.execute(
                "DELETE FROM csi_staged WHERE plugin_id=? AND namespace=? AND volume_id=? AND usage=?",
                (plugin_id, namespace, volume_id, usage),
            )

    def usages(self, plugin_id: str, phase: str | None = None) -> list[UsageRow]:
        with self._lock:
            query = "SELECT * FROM csi_usage WHERE plugin_id=?" + (" AND phase=?" if phase else "")
            rows = self._db.execute(query, (plugin_id, phase) if phase else (plugin_id,)).fetchall()
        return [UsageRow(*r) for r in rows]

    # --- staging -------------------------------------------------------------------------------

    def staged(self, plugin_id: str, namespace: str, volume_id: str, usage: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM csi_staged WHERE plugin_id=? AND namespace=? AND volume_id=? AND usage=?",
                (plugin_id, namespace, volume_id, usage),
            ).fetchone()
        return row is not None

    def set_staged(self, plugin_id: str, namespace: str, volume_id: str, usage: str, staged: bool) -> None:
        if staged:
            self._write(
                "INSERT OR REPLACE INTO csi_staged VALUES (?, ?, ?, ?)", (plugin_id, namespace, volume_id, usage)
            )
        else:
            self._write(
                "DELETE FROM csi_staged WHERE plugin_id=? AND namespace=? AND volume_id=? AND usage=?",
                (plugin_id, namespace, volume_id, usage),
            )

    def node_use(self, plugin_id: str, namespace: str, volume_id: str) -> tuple[list[str], list[str]]:
        """What this node still holds of a volume, whatever the allocation or usage: the usages
        recorded as staged, and the allocations with a use (mounting, mounted or unmounting)."""
        key = (plugin_id, namespace, volume_id)
        with self._lock:
            staged = self._db.execute(
                "SELECT usage FROM csi_staged WHERE plugin_id=? AND namespace=? AND volume_id=? ORDER BY usage", key
            ).fetchall()
            used = self._db.execute(
                "SELECT DISTINCT alloc_id FROM csi_usage WHERE plugin_id=? AND namespace=? AND volume_id=? "
                "ORDER BY alloc_id",
                key,
            ).fetchall()
        return [str(r[0]) for r in staged], [str(r[0]) for r in used]

    # --- plugin registry -----------------------------------------------------------------------

    def add_plugin(self, kind: str, name: str, alloc_id: str, record: dict[str, object]) -> bool:
        """Insert one registration as the newest of its name; False when that alloc has one.

        Row-level, in one transaction, so two processes sharing the file never lose each
        other's registrations."""
        with self._tx() as db:
            if db.execute(
                "SELECT 1 FROM csi_plugins WHERE type=? AND name=? AND alloc_id=?", (kind, name, alloc_id)
            ).fetchone():
                return False
            (lowest,) = db.execute(
                "SELECT COALESCE(MIN(position), 0) FROM csi_plugins WHERE type=? AND name=?", (kind, name)
            ).fetchone()
            db.execute(
                "INSERT INTO csi_plugins VALUES (?, ?, ?, ?, ?)",
                (kind, name, alloc_id, int(lowest) - 1, json.dumps(record, sort_keys=True)),
            )
        return True

    def remove_plugin(self, kind: str, name: str, alloc_id: str) -> dict[str, object] | None:
        with self._tx() as db:
            row = db.execute(
                "SELECT record FROM csi_plugins WHERE type=? AND name=? AND alloc_id=?", (kind, name, alloc_id)
            ).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM csi_plugins WHERE type=? AND name=? AND alloc_id=?", (kind, name, alloc_id))
        record: dict[str, object] = json.loads(row[0])
        return record

    def load_plugins(self) -> list[dict[str, object]]:
        with self._lock:
            rows = self._db.execute("SELECT record FROM csi_plugins ORDER BY type, name, position").fetchall()
        return [json.loads(r[0]) for r in rows]
