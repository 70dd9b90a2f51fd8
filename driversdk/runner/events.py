"""What ``driversdk run`` reports: one :class:`RunEvent` per line, formatted by the CLI either as
the ``==> …`` text lines or as one JSON object per line (``run --json``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class RunEvent:
    """kind: ``task`` (a task's lifecycle or a driver event), ``plugin`` (a CSI plugin task's
    health), ``group`` (an allocation), ``volume``, ``driver`` (a driver plugin), ``run`` (the
    whole run) or ``error`` (a refusal). ``name`` is the volume or driver the event is about."""

    kind: str
    message: str
    job: str = ""
    group: str = ""
    alloc_id: str = ""
    task: str = ""
    name: str = ""
    time: float = field(default_factory=time.time)

    def text(self) -> str:
        """The line today's operators read."""
        if self.kind == "task":
            return f'==> task "{self.task}" {self.message}'
        if self.kind == "plugin":
            return f'==> task "{self.task}": {self.message}'
        if self.kind == "group":
            return f'==> group "{self.group}": {self.message}'
        if self.kind in ("volume", "driver"):
            return f'==> {self.kind} "{self.name}": {self.message}'
        if self.kind == "error":
            return f"error {self.message}"
        return f"==> {self.message}"

    def json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


Emit = Callable[[RunEvent], None]


def printer(as_json: bool, out: Callable[[str], None] = print) -> Emit:
    """An event sink writing one line per event, as text or JSON."""
    return lambda event: out(event.json() if as_json else event.text())
