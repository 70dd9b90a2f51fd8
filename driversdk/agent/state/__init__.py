"""The client's one state file: :class:`Store` owns it (one writer and one reader connection per
process, opened by :func:`connect` with private files, WAL and a busy timeout, migrated once) and
every table of it (runs, jobs, ACL tokens, CSI usage, volumes) is a :class:`Table` on that store."""

from driversdk.agent.state.db import connect, open_state
from driversdk.agent.state.migrations import SCHEMA_VERSION, StateVersionError, migrate
from driversdk.agent.state.store import Store, Table

__all__ = ["SCHEMA_VERSION", "StateVersionError", "Store", "Table", "connect", "migrate", "open_state"]
