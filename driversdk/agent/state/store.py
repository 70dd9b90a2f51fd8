"""The one owner of a data dir's ``state.db``: one writer and one reader connection per process.

Every table of the file (runs: allocations, tasks, events, driver plugins; jobs; ACL tokens; CSI
usage, staging and plugins; volumes and claims) is an object built on a :class:`Store` and runs
its statements on the store's connections under the store's locks. A process that opens the same
file twice gets the same store back (counted; the last :meth:`Store.close` closes it), so however
its parts are wired it holds the file open once for writing and once for reading, and writes of
all tables queue on one lock instead of on SQLite's busy timeout.

The connection policy is :func:`~driversdk.agent.state.db.connect`'s: private files, WAL, a busy
timeout, storage failures raised as :class:`~driversdk.errors.StateWriteError`; the writer runs
the migrations (:mod:`driversdk.agent.state.migrations`) once, when the store opens.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from typing import ClassVar

from driversdk.agent.state.db import connect, open_state

STATE_FILE = "state.db"


class Store:
    """``state.db`` opened once per process: use :meth:`open` or :meth:`at`, never the constructor."""

    # (process id, absolute path) -> the live store: a forked child opens its own.
    _live: ClassVar[dict[tuple[int, str], Store]] = {}
    # Reentrant: a table collected by the garbage collector lets go of its store (Table) on
    # whichever thread allocates then, which may be one holding this lock.
    _live_lock: ClassVar[threading.RLock] = threading.RLock()

    def __init__(self, path: str) -> None:
        self.path = path
        self.writer: sqlite3.Connection = open_state(path)
        # Reads (the API, the CLI) go through a second connection: in WAL mode a reader sees the
        # last commit without waiting, where sharing the writer's lock queued every read behind
        # the fsyncs of allocations starting (a GET took 15x its idle time, issue 31).
        try:
            self.reader: sqlite3.Connection = connect(path)
        except BaseException:
            self.writer.close()
            raise
        self.write_lock = threading.Lock()
        self.read_lock = threading.Lock()
        self._holders = 1

    @classmethod
    def open(cls, data_dir: str) -> Store:
        """The store of the data dir's state file."""
        return cls.at(os.path.join(data_dir, STATE_FILE))

    @classmethod
    def at(cls, db_path: str) -> Store:
        """The store of the state file at ``db_path``: this process's open one, or a new one.
        Every call is matched by one :meth:`close`."""
        path = os.path.abspath(db_path)
        key = (os.getpid(), path)
        with cls._live_lock:
            store = cls._live.get(key)
            if store is not None:
                store._holders += 1
                return store
            store = cls._live[key] = cls(path)
            return store

    def share(self) -> Store:
        """One more holder of this store (a table built on it); matched by one :meth:`close`."""
        with Store._live_lock:
            if self._holders <= 0:
                raise ValueError(f"the state store {self.path} is closed")
            self._holders += 1
        return self

    @property
    def closed(self) -> bool:
        return self._holders <= 0

    def close(self) -> None:
        """Let go of the store; the last holder closes its connections."""
        key = (os.getpid(), self.path)
        with Store._live_lock:
            if self._holders <= 0:
                return
            self._holders -= 1
            if self._holders > 0:
                return
            if Store._live.get(key) is self:
                del Store._live[key]
        with self.write_lock, self.read_lock:
            self.reader.close()
            self.writer.close()


def store_of(source: Store | str, *, file: bool) -> Store:
    """The store a table is built on: ``source`` itself (one more holder), or the store of a data
    dir (``file=False``) or state file (``file=True``) path, a convenience for one-off tools."""
    if isinstance(source, Store):
        return source.share()
    return Store.at(source) if file else Store.open(source)


class Table:
    """A table (or a few) of ``state.db`` on a :class:`Store`, or on the store of a path: a data
    dir's (``file=False``) or a state file's (``file=True``). It runs writes on the store's writer
    under its write lock and reads on its reader under its read lock, and holds the store until
    :meth:`close`, or until it is garbage-collected (a one-off caller that never closes it does not
    keep the file open)."""

    def __init__(self, store: Store | str, *, file: bool = False) -> None:
        self.store = store_of(store, file=file)
        self._release = weakref.finalize(self, self.store.close)
        # Not at exit: a process ends with its tables open on purpose (the agent's shutdown keeps
        # the write lock to the end, which a close would wait for).
        self._release.atexit = False
        self._db, self._lock = self.store.writer, self.store.write_lock
        self._reader, self._read_lock = self.store.reader, self.store.read_lock

    def close(self) -> None:
        """Let go of the store (its last holder closes the file)."""
        self._release()
