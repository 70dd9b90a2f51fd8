"""The plugin's bookkeeping: one JSON file under the root, read and rewritten under a file lock.

A volume is a directory under ``<root>/volumes`` and a snapshot one under ``<root>/snapshots``;
the directories are the truth about what exists (an operator may pre-provision a volume by
making its directory). The file only adds what a directory cannot say: a volume's name,
capacity, parameters and source, where the controller published it, and which staging and
target paths the node service set up with which capability. Every RPC that reads or changes
it holds the lock from its first lookup to its last change, so two calls, or two plugin
processes sharing a root, never interleave; a call that fails saves nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

STATE_FILE = "hostpath-state.json"
LOCK_FILE = "hostpath-state.lock"


@dataclass
class Publication:
    """The controller's record of one volume published to one node."""

    capability: str  # the VolumeCapability, serialized (see plugin.capability_key)
    readonly: bool = False


@dataclass
class VolumeRecord:
    volume_id: str
    name: str
    capacity: int = 0
    parameters: dict[str, str] = field(default_factory=dict)
    source_snapshot: str = ""
    source_volume: str = ""
    published: dict[str, Publication] = field(default_factory=dict)  # node id -> publication


@dataclass
class SnapshotRecord:
    snapshot_id: str
    name: str
    source_volume_id: str
    size: int
    created_ns: int


@dataclass
class NodeMount:
    """The node's record of a staging path or a target path it set up."""

    volume_id: str
    capability: str
    readonly: bool = False
    staging_path: str = ""


@dataclass
class State:
    volumes: dict[str, VolumeRecord] = field(default_factory=dict)
    snapshots: dict[str, SnapshotRecord] = field(default_factory=dict)
    staged: dict[str, NodeMount] = field(default_factory=dict)  # staging path -> mount
    published: dict[str, NodeMount] = field(default_factory=dict)  # target path -> mount


def _volume(raw: dict[str, Any]) -> VolumeRecord:
    published = {node: Publication(**pub) for node, pub in raw.pop("published", {}).items()}
    return VolumeRecord(**raw, published=published)


def _decode(raw: dict[str, Any]) -> State:
    return State(
        volumes={k: _volume(dict(v)) for k, v in raw.get("volumes", {}).items()},
        snapshots={k: SnapshotRecord(**v) for k, v in raw.get("snapshots", {}).items()},
        staged={k: NodeMount(**v) for k, v in raw.get("staged", {}).items()},
        published={k: NodeMount(**v) for k, v in raw.get("published", {}).items()},
    )


class Store:
    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, STATE_FILE)
        self._lock_path = os.path.join(root, LOCK_FILE)
        self._threads = threading.Lock()

    def _load(self) -> State:
        try:
            with open(self.path, encoding="utf-8") as fh:
                return _decode(json.load(fh))
        except FileNotFoundError:
            return State()
        except (ValueError, TypeError) as err:
            # Surfaces as INTERNAL naming the file, instead of an unexplained UNKNOWN per call.
            raise OSError(
                f"the plugin state file {self.path} is unreadable ({err}); move it aside to start over"
            ) from err

    def _save(self, text: str) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    @contextmanager
    def transaction(self) -> Iterator[State]:
        """The current state, saved on a normal exit if it changed; an exception saves nothing."""
        with self._threads, open(self._lock_path, "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = self._load()
                before = json.dumps(asdict(state), sort_keys=True)
                yield state
                after = json.dumps(asdict(state), sort_keys=True)
                if after != before:
                    self._save(after)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
