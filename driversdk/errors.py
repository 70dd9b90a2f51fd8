"""The exception tree of the SDK.

Every error that can reach an operator derives from :class:`DriverSDKError` and carries one
flat sentence: what went wrong, where (task, volume, field), why, and how to fix it.  Callers
catch by meaning (the class), never by matching message text.
"""

from __future__ import annotations


class DriverSDKError(Exception):
    """Root of every error raised by driversdk."""


class DriverError(DriverSDKError):
    """A driver call failed.

    ``recoverable`` tells the host whether retrying (the task's restart policy) could help:
    over the wire it becomes a ``RecoverableError`` detail on the gRPC status, which is the only
    thing a Nomad client looks at.
    """

    def __init__(self, message: str, *, recoverable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.recoverable = recoverable


class TaskNotFoundError(DriverError):
    """The driver does not track a task with this id."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} is not known to this driver (it was never started or was destroyed)")
        self.task_id = task_id


class TaskStillRunningError(DriverError):
    """DestroyTask without force on a running task."""


class NotSupportedError(DriverError):
    """An optional driver call that this driver does not implement (UNIMPLEMENTED on the wire)."""

    def __init__(self, driver: str, call: str) -> None:
        super().__init__(f"the {driver!r} driver does not support {call}")
        self.driver = driver
        self.call = call


class ConfigError(DriverError):
    """A plugin or task configuration did not match its schema (INVALID_ARGUMENT on the wire)."""


class PluginError(DriverSDKError):
    """Launching, handshaking with or talking to a plugin process failed (host side)."""


class MissingExtraError(PluginError):
    """A bundled driver needs a package that only its extra installs (``driversdk[docker]``)."""


class HandshakeError(PluginError):
    """The plugin process did not complete the go-plugin handshake."""


class PluginCallError(PluginError):
    """A driver RPC returned an error status; ``code`` keeps the gRPC status code name."""

    def __init__(self, message: str, *, code: str, call: str, recoverable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.call = call
        self.recoverable = recoverable


class StateWriteError(DriverSDKError):
    """A write to ``state.db`` failed (a full or read-only file system, an I/O error): what the run
    could not record is lost, so the run fails it and ends instead of going on without it.

    ``what`` names what was being recorded ("the exit of task "web" of job "demo""); the store that
    knows more than the connection re-raises with :meth:`about`."""

    def __init__(self, path: str, reason: str, remedy: str, what: str = "the run's state") -> None:
        self.path = path
        self.reason = reason
        self.remedy = remedy
        self.what = what
        super().__init__(f"cannot record {what} in {path}: {reason}; {remedy}")

    def about(self, what: str) -> StateWriteError:
        """The same failure, naming what was being recorded."""
        return StateWriteError(self.path, self.reason, self.remedy, what)
