"""What ``driversdk run`` reports: one :class:`RunEvent` per line, formatted by the CLI either as
the ``==> …`` text lines or as one JSON object per line (``run --json``).

A task's events carry Nomad's task event types (:class:`EventType`, the names ``nomad alloc
status`` shows) with the exit code, signal and details as fields of their own; :meth:`RunEvent.to_api`
gives the event as Nomad's HTTP API spells a TaskEvent, so an agent can serve the same records.
What has no Nomad type (a task's end, a port list, the run interrupted) has one of
:class:`RunEventType`. Every line about a task or an allocation names its job and allocation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class EventType(StrEnum):
    """Nomad's task event types (``structs.TaskEvent.Type``), by the names Nomad gives them."""

    SETUP = "Task Setup"
    SETUP_FAILURE = "Setup Failure"
    DRIVER_FAILURE = "Driver Failure"
    DRIVER_MESSAGE = "Driver"
    RECEIVED = "Received"
    FAILED_VALIDATION = "Failed Validation"
    STARTED = "Started"
    TERMINATED = "Terminated"
    KILLING = "Killing"
    KILLED = "Killed"
    RESTARTING = "Restarting"
    NOT_RESTARTING = "Not Restarting"
    RESTART_SIGNAL = "Restart Signaled"
    SIGNALING = "Signaling"
    SIBLING_FAILED = "Sibling Task Failed"
    LEADER_DEAD = "Leader Task Dead"
    MAIN_DEAD = "Main Tasks Dead"
    HOOK_FAILED = "Task hook failed"
    HOOK_MESSAGE = "Task hook message"
    RESTORE_FAILED = "Failed Restoring Task"
    PLUGIN_UNHEALTHY = "Plugin became unhealthy"
    PLUGIN_HEALTHY = "Plugin became healthy"


class RunEventType(StrEnum):
    """What the run reports that Nomad has no task event type for."""

    FINISHED = "finished"  # the task is dead: its last exit, after the restart policy
    RECOVERED = "recovered"  # a task a killed run left, followed again
    NOT_STARTED = "not started"  # its allocation failed or stopped before its lifecycle stage
    FAILED = "failed"  # failed for a reason that is not an exit (a plugin never healthy, a state write)
    MESSAGE = "message"  # any other notice about a task (a cleanup or destroy that failed)
    GROUP = "group"  # about an allocation
    PORTS = "ports"  # the ports an allocation was given
    PLUGIN = "plugin"  # a CSI plugin task's health
    VOLUME = "volume"
    DRIVER = "driver"  # a driver plugin
    RUN = "run"  # the whole run
    INTERRUPTED = "interrupted"  # Ctrl-C (SIGINT or SIGTERM): the tasks are being stopped
    ERROR = "error"  # a refusal, or the failure that ends the run


# The type of an event that does not name one, by its kind.
_KIND_TYPE = {
    "task": RunEventType.MESSAGE,
    "plugin": RunEventType.PLUGIN,
    "group": RunEventType.GROUP,
    "volume": RunEventType.VOLUME,
    "driver": RunEventType.DRIVER,
    "run": RunEventType.RUN,
    "error": RunEventType.ERROR,
}

_NOMAD_TYPES = frozenset(e.value for e in EventType)

# Details Nomad keeps in legacy fields of its own as well (api.TaskEvent), by detail key.
_API_STRING_FIELDS = {
    "restart_reason": "RestartReason",
    "setup_error": "SetupError",
    "driver_error": "DriverError",
    "driver_message": "DriverMessage",
    "kill_reason": "KillReason",
    "kill_error": "KillError",
    "download_error": "DownloadError",
    "validation_error": "ValidationError",
    "failed_sibling": "FailedSibling",
    "vault_renewal_error": "VaultError",
    "task_signal_reason": "TaskSignalReason",
    "task_signal": "TaskSignal",
}


@dataclass(frozen=True)
class RunEvent:
    """kind: ``task`` (a task's lifecycle or a driver event), ``plugin`` (a CSI plugin task's
    health), ``group`` (an allocation), ``volume``, ``driver`` (a driver plugin), ``run`` (the
    whole run) or ``error`` (a refusal, or the failure that ends the run). ``name`` is the volume
    or driver the event is about. ``type`` is Nomad's task event type (or one of ours);
    ``message`` is the sentence Nomad's ``alloc status`` shows for it."""

    kind: str
    message: str
    job: str = ""
    group: str = ""
    alloc_id: str = ""
    task: str = ""
    name: str = ""
    time: float = field(default_factory=time.time)
    type: str = ""
    exit_code: int | None = None
    signal: int | None = None
    fails_task: bool = False
    kill_timeout: float = 0.0  # seconds: Killing
    start_delay: float = 0.0  # seconds: Restarting
    details: Mapping[str, str] = field(default_factory=dict)

    @property
    def event_type(self) -> str:
        return self.type or _KIND_TYPE.get(self.kind, RunEventType.RUN)

    def where(self, *, with_task: bool = False) -> str:
        """`` [job "shop", alloc 1a2b3c4d]``: which allocation a line is about (the first 8
        characters of its id, as Nomad's CLI shortens them)."""
        parts = [f'job "{self.job}"'] if self.job else []
        if self.alloc_id:
            parts.append(f"alloc {self.alloc_id[:8]}")
        if with_task and self.task:
            parts.append(f'task "{self.task}"')
        return f" [{', '.join(parts)}]" if parts else ""

    def _task_line(self) -> str:
        kind = self.event_type
        if kind == EventType.STARTED:
            driver = self.details.get("driver", "")
            again = self.details.get("restarts", "")
            return (f"started ({driver})" if driver else "started") + (f", restart {again}" if again else "")
        if kind == EventType.KILLING:
            return f"stopping: {self.message}"
        if kind == EventType.DRIVER_MESSAGE:
            return f"event: {self.message}"
        if kind == EventType.RESTORE_FAILED:
            return f"lost: {self.message}"
        if kind in _NOMAD_TYPES:
            return f"{kind}: {self.message}"
        return self.message

    def text(self) -> str:
        """The line an operator reads."""
        if self.kind == "task":
            return f'==> task "{self.task}" {self._task_line()}{self.where()}'
        if self.kind == "plugin":
            return f'==> task "{self.task}": {self.message}{self.where()}'
        if self.kind == "group":
            return f'==> group "{self.group}": {self.message}{self.where()}'
        if self.kind in ("volume", "driver"):
            return f'==> {self.kind} "{self.name}": {self.message}'
        if self.kind == "error":
            if self.task:  # the failure that ends the run, about one task
                return f"error: {self.message}{self.where(with_task=True)}"
            return f"error {self.message}"
        return f"==> {self.message}"

    def to_json(self) -> dict[str, Any]:
        """The object of a ``run --json`` line: every field a reader filters on, on its own."""
        out: dict[str, Any] = {
            "type": str(self.event_type),
            "kind": self.kind,
            "job": self.job,
            "group": self.group,
            "alloc": self.alloc_id,
            "task": self.task,
            "time": self.time,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "message": self.message,
        }
        if self.kind in ("volume", "driver"):
            out[self.kind] = self.name
        if self.fails_task:
            out["fails_task"] = True
        if self.details:
            out["details"] = dict(self.details)
        return out

    def json(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    def to_api(self) -> dict[str, Any]:
        """The event as Nomad's HTTP API spells a TaskEvent (``api.TaskEvent``): Time in Unix
        nanoseconds, durations in nanoseconds, the details also in their legacy fields."""
        details = {k: str(v) for k, v in self.details.items()}
        if self.exit_code is not None:
            details["exit_code"] = str(self.exit_code)
        if self.signal:
            details["signal"] = str(self.signal)
        if self.fails_task:
            details["fails_task"] = "true"
        out: dict[str, Any] = {
            "Type": str(self.event_type),
            "Time": int(self.time * 1e9),
            "Message": self.message,
            "DisplayMessage": self.message,
            "Details": details,
            "FailsTask": self.fails_task,
            "ExitCode": self.exit_code or 0,
            "Signal": self.signal or 0,
            "KillTimeout": round(self.kill_timeout * 1e9),
            "StartDelay": round(self.start_delay * 1e9),
            "DiskLimit": 0,
            "DiskSize": 0,
            "GenericSource": "",
        }
        for key, name in _API_STRING_FIELDS.items():
            out[name] = details.get(key, "")
        return out


def split_type(message: str) -> tuple[str, str]:
    """("Sibling Task Failed", 'Task's sibling "web" failed') of a message that starts with one of
    Nomad's event types, else ("", message)."""
    head, sep, rest = message.partition(": ")
    if sep and head in _NOMAD_TYPES:
        return head, rest
    return "", message


def error_event(message: str, *, job: str = "", group: str = "", alloc_id: str = "", task: str = "") -> RunEvent:
    """The failure that ends a run (or refuses it), as an event of its own: a JSON line in ``--json``."""
    return RunEvent("error", message, job=job, group=group, alloc_id=alloc_id, task=task, type=RunEventType.ERROR)


Emit = Callable[[RunEvent], None]


def printer(as_json: bool, out: Callable[[str], None] = print) -> Emit:
    """An event sink writing one line per event, as text or JSON."""
    return lambda event: out(event.json() if as_json else event.text())
