"""One running container as the driver tracks it, and the state saved to recover it."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from drivers.docker.logs import LogCollector
from driversdk.errors import ConfigError
from driversdk.model import ExitResult, TaskConfig

# Version of the driver_state layout below; bump it and keep reading older ones.
STATE_VERSION = 1


@dataclass(frozen=True)
class DriverState:
    container_id: str
    image: str
    image_id: str
    tty: bool
    log_state_dir: str
    logs: bool

    def encode(self) -> bytes:
        return json.dumps({"version": STATE_VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, version: int) -> DriverState:
        try:
            raw = json.loads(data)
            if version != STATE_VERSION or raw.get("version") != STATE_VERSION:
                raise ValueError(f"unknown state version {raw.get('version')}")
            return cls(
                container_id=raw["container_id"],
                image=raw["image"],
                image_id=raw["image_id"],
                tty=bool(raw["tty"]),
                log_state_dir=raw["log_state_dir"],
                logs=bool(raw["logs"]),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"failed to decode driver task state: {err}") from None


@dataclass
class ContainerHandle:
    task: TaskConfig
    state: DriverState
    started_at: datetime
    logs: LogCollector | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: ExitResult | None = None
    completed_at: datetime | None = None
    previous_cpu: dict[str, Any] | None = None
    # Why the task ended, when it was not the task's own doing (e.g. the engine stopped).
    err: str | None = None
    # When the engine was first found unreachable while the container ran, and when it answered again.
    engine_lost_at: datetime | None = None
    engine_back_at: datetime | None = None

    def finish(self, result: ExitResult, completed_at: datetime | None = None, err: str | None = None) -> None:
        self.result = result
        self.err = err
        self.completed_at = completed_at or datetime.now(UTC)
        self.done.set()
