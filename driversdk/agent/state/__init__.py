"""The client's one state file: :func:`open_state` connects (private files, WAL, busy timeout)
and migrates it to the current schema; every store goes through it."""

from driversdk.agent.state.db import connect, open_state
from driversdk.agent.state.migrations import SCHEMA_VERSION, StateVersionError, migrate

__all__ = ["SCHEMA_VERSION", "StateVersionError", "connect", "migrate", "open_state"]
