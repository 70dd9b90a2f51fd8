"""The data dir and its SQLite file: private on disk, whoever opens them first.

``state.db`` holds CSI secrets, plugin reattach configs and task handles, so it and its WAL
files are 0600 and the data dir 0700: no other local user may read or even list them. The
file's owner (:class:`~driversdk.agent.state.store.Store`) opens it through :func:`connect`, which
also tightens a data dir or a database that an older version (or a permissive umask) left readable.

A statement that fails because of the storage under the file (a full or read-only file system, an
I/O error) raises :class:`~driversdk.errors.StateWriteError` naming the file and its file system,
whichever store and thread ran it, so no caller sees a bare ``sqlite3.OperationalError``.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from typing import Any

from driversdk.errors import StateWriteError

DATA_DIR_MODE = 0o700
STATE_FILE_MODE = 0o600
# SQLite waits this long for another process's write lock instead of failing at once.
BUSY_TIMEOUT_MS = 10_000


def prepare_data_dir(data_dir: str) -> str:
    """Create the data dir (0700) or tighten an existing one; returns its absolute path."""
    path = os.path.abspath(data_dir)
    os.makedirs(path, mode=DATA_DIR_MODE, exist_ok=True)
    _tighten(path, DATA_DIR_MODE)
    return path


def connect(db_path: str) -> sqlite3.Connection:
    """Open (creating if needed) a state database with private files, WAL and a busy timeout."""
    db_path = os.path.abspath(db_path)
    prepare_data_dir(os.path.dirname(db_path))
    # Create the file ourselves with 0600 so there is no moment in which it is world-readable;
    # SQLite gives the -wal and -shm files the mode of the database file. Only when it does not
    # exist: closing any descriptor of the file drops every POSIX lock this process holds on it,
    # so opening a second store next to a live one would leave the first unlocked, and another
    # process closing the database last would then checkpoint and delete the WAL under it.
    try:
        fd = os.open(db_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, STATE_FILE_MODE)
    except FileExistsError:
        pass
    else:
        os.close(fd)
    try:
        db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None, factory=StateConnection)
    except sqlite3.Error as err:
        raise storage_failure(err, db_path) or err from None
    db.path = db_path
    try:
        db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        db.execute("PRAGMA journal_mode=WAL")
    except BaseException:
        db.close()
        raise
    for suffix in ("", "-wal", "-shm"):
        _tighten(db_path + suffix, STATE_FILE_MODE)
    return db


def open_state(db_path: str) -> sqlite3.Connection:
    """:func:`connect`, then bring the schema to the current version: how the one owner of
    ``state.db`` (:class:`~driversdk.agent.state.store.Store`) opens its writer."""
    from driversdk.agent.state.migrations import migrate

    db = connect(db_path)
    try:
        migrate(db)
    except BaseException:
        db.close()
        raise
    return db


class StateConnection(sqlite3.Connection):
    """A connection whose statements fail with :class:`StateWriteError` when the storage fails."""

    path = "state.db"  # set by connect()

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        try:
            return super().execute(sql, parameters)
        except sqlite3.Error as err:
            failure = storage_failure(err, self.path)
            if failure is None:
                raise
            raise failure from None


def storage_failure(err: sqlite3.Error, db_path: str) -> StateWriteError | None:
    """The :class:`StateWriteError` an SQLite error stands for when the storage under ``db_path``
    failed; None for any other error (a bug, a lock another process holds)."""
    name = str(getattr(err, "sqlite_errorname", "") or "")
    if not name.startswith(("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_READONLY")):
        return None
    fs = mount_point(db_path)
    try:
        vfs = os.statvfs(fs)
    except OSError:
        vfs = None
    if name.startswith("SQLITE_FULL") or (vfs is not None and vfs.f_bavail == 0):
        # SQLite says "disk I/O error" when a WAL or shm page it extends meets ENOSPC.
        return StateWriteError(db_path, "database or disk is full", f"free space on {fs} and run again")
    if name.startswith("SQLITE_READONLY") or (vfs is not None and vfs.f_flag & os.ST_RDONLY):
        return StateWriteError(
            db_path, "the file system or the file is read-only", f"make {fs} and {db_path} writable and run again"
        )
    return StateWriteError(db_path, str(err), f"check the disk under {fs} (dmesg) and run again")


def mount_point(path: str) -> str:
    """The mount point of the file system that holds ``path`` (or would hold it)."""
    here = os.path.abspath(path)
    while not os.path.exists(here) and here != os.path.dirname(here):
        here = os.path.dirname(here)
    while not os.path.ismount(here):
        here = os.path.dirname(here)
    return here


def _tighten(path: str, mode: int) -> None:
    """Take group and other bits away from a file we own; a missing file is fine."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if stat.S_IMODE(st.st_mode) & ~mode:
        os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
