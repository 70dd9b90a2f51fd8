"""Signal names as job files write them (kill_signal, signal_task): one grammar for the SDK.

The drivers parse the name when the task stops; validate parses it with the same rules before
the task starts, so a typo is refused up front instead of at the first stop.
"""

from __future__ import annotations

import signal

from driversdk.errors import DriverError


class UnknownSignalError(DriverError):
    """A signal name this host does not know.

    A DriverError, not a ConfigError: the drivers raise it from SignalTask and StopTask, where an
    unknown name goes over the wire as INTERNAL (not recoverable), and validate catches it by this
    class.
    """


def signal_name(name: str) -> str:
    """The canonical name ("SIGTERM") for "SIGTERM", "sigterm" or "TERM"; raises UnknownSignalError."""
    upper = name.upper()
    normalized = upper if upper.startswith("SIG") else f"SIG{upper}"
    # Only the names of the signals enum: "SIG_DFL"/"SIG_IGN" are handler constants, not signals.
    if normalized not in signal.Signals.__members__:
        raise UnknownSignalError(f"failed to parse signal: unknown signal {name!r}; use a name such as SIGTERM")
    return normalized


def signal_number(name: str) -> int:
    """The number of the named signal on this host; raises UnknownSignalError."""
    return int(signal.Signals[signal_name(name)])
