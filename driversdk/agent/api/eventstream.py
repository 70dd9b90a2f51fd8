"""Nomad's event stream (``GET /v1/event/stream``): what happens to jobs and allocations, as
newline-delimited JSON objects ``{"Index": N, "Events": [...]}`` with ``{}`` as a heartbeat.

The agent publishes an event when a job is registered or deregistered and for each of an
allocation's task events; the last EVENTS_KEPT are kept so a client may resume from an index.
A subscriber names topics as Nomad's do (``Job``, ``Allocation``, ``*``), each with an optional
key (``Job:web``); without a topic it gets every event.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any

EVENTS_KEPT = 4096
HEARTBEAT = 10.0  # seconds between heartbeats on a quiet stream, as Nomad's


@dataclass(frozen=True)
class StreamEvent:
    index: int
    topic: str
    type: str
    key: str
    payload: dict[str, Any]

    def to_api(self) -> dict[str, Any]:
        return {"Topic": self.topic, "Type": self.type, "Key": self.key, "Namespace": "default",
                "FilterKeys": None, "Index": self.index, "Payload": self.payload}  # fmt: skip


@dataclass(frozen=True)
class Subscription:
    topics: dict[str, set[str]]  # topic → keys ("*" for every key); {} for every topic

    @classmethod
    def parse(cls, values: list[str]) -> Subscription:
        topics: dict[str, set[str]] = {}
        for value in values:
            topic, _, key = value.partition(":")
            topics.setdefault(topic or "*", set()).add(key or "*")
        return cls(topics)

    def wants(self, event: StreamEvent) -> bool:
        if not self.topics:
            return True
        keys = self.topics.get(event.topic, set()) | self.topics.get("*", set())
        return "*" in keys or event.key in keys


class EventBuffer:
    def __init__(self) -> None:
        self._events: collections.deque[StreamEvent] = collections.deque(maxlen=EVENTS_KEPT)
        self._changed = threading.Condition()
        self._index = 0

    def publish(self, topic: str, type: str, key: str, payload: dict[str, Any]) -> None:
        with self._changed:
            self._index += 1
            self._events.append(StreamEvent(self._index, topic, type, key, payload))
            self._changed.notify_all()

    def after(self, index: int, timeout: float) -> tuple[list[StreamEvent], int]:
        """The events after ``index`` (waiting up to ``timeout`` for one), and the newest index."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._index <= index:
                left = deadline - time.monotonic()
                if left <= 0:
                    return [], self._index
                self._changed.wait(left)
            return [e for e in self._events if e.index > index], self._index
