"""The dynamic plugin registry: which CSI plugin instances run on this node, newest first.

Several allocations may run the same plugin (an upgrade overlaps the old one); the newest is
the one used, older ones stay so restoring their volumes still works. Registrations survive a
restart through the state store.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import asdict, dataclass, field

from driversdk.agent.csi.state import StateStore
from driversdk.csi.errors import CSIError

PLUGIN_TYPES = ("csi-controller", "csi-node")


@dataclass(frozen=True)
class PluginRegistration:
    type: str
    name: str
    alloc_id: str
    socket_path: str
    version: str = ""
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RegistryEvent:
    kind: str  # "registered" | "deregistered"
    plugin: PluginRegistration


def socket_path_for(state_dir: str, alloc_id: str) -> str:
    """A socket path unique per allocation, so an old and a new instance never collide."""
    return os.path.join(state_dir, "csi", "plugins", alloc_id, "csi.sock")


class PluginRegistry:
    def __init__(self, store: StateStore | None = None) -> None:
        self._plugins: dict[str, dict[str, list[PluginRegistration]]] = {t: {} for t in PLUGIN_TYPES}
        self._lock = threading.Lock()
        self._subscribers: list[queue.Queue[RegistryEvent]] = []
        self._store = store
        self._reload()

    def _reload(self) -> None:
        """Re-read the store: another process (another `driversdk run`) may have registered or
        deregistered an instance since we last looked."""
        if self._store is None:
            return
        fresh: dict[str, dict[str, list[PluginRegistration]]] = {t: {} for t in PLUGIN_TYPES}
        for record in self._store.load_plugins():
            reg = PluginRegistration(**record)  # type: ignore[arg-type]
            fresh.setdefault(reg.type, {}).setdefault(reg.name, []).append(reg)
        with self._lock:
            self._plugins = fresh

    def _check_type(self, kind: str) -> None:
        if kind not in PLUGIN_TYPES:
            raise CSIError(
                f"unknown CSI plugin type {kind!r}; use one of {', '.join(PLUGIN_TYPES)}", code="OK", call="registry"
            )

    def _emit(self, event: RegistryEvent) -> None:
        for sub in list(self._subscribers):
            sub.put(event)

    def register(self, reg: PluginRegistration) -> bool:
        """Add an instance as the newest; False (and no event) when that alloc is registered."""
        self._check_type(reg.type)
        if not reg.name or not reg.socket_path:
            raise CSIError("a plugin registration needs a name and a socket path", code="OK", call="registry")
        if self._store is not None:
            if not self._store.add_plugin(reg.type, reg.name, reg.alloc_id, asdict(reg)):
                return False
            self._reload()
        else:
            with self._lock:
                regs = self._plugins[reg.type].setdefault(reg.name, [])
                if any(r.alloc_id == reg.alloc_id for r in regs):
                    return False
                regs.insert(0, reg)
        self._emit(RegistryEvent("registered", reg))
        return True

    def deregister(self, kind: str, name: str, alloc_id: str) -> bool:
        """Remove that alloc's instance. Safe before register (a fast crash): no event, no error."""
        self._check_type(kind)
        if self._store is not None:
            record = self._store.remove_plugin(kind, name, alloc_id)
            if record is None:
                return False
            removed = PluginRegistration(**record)  # type: ignore[arg-type]
            self._reload()
            self._emit(RegistryEvent("deregistered", removed))
            return True
        with self._lock:
            regs = self._plugins[kind].get(name)
            if not regs:
                return False
            match = next((r for r in regs if r.alloc_id == alloc_id), None)
            if match is None:
                return False
            regs.remove(match)
            if not regs:
                del self._plugins[kind][name]
        self._emit(RegistryEvent("deregistered", match))
        return True

    def current(self, kind: str, name: str) -> PluginRegistration | None:
        self._check_type(kind)
        self._reload()
        with self._lock:
            regs = self._plugins[kind].get(name)
            return regs[0] if regs else None

    def instances(self, kind: str, name: str) -> list[PluginRegistration]:
        self._check_type(kind)
        self._reload()
        with self._lock:
            return list(self._plugins[kind].get(name, []))

    def plugins(self, kind: str) -> dict[str, PluginRegistration]:
        self._check_type(kind)
        self._reload()
        with self._lock:
            return {name: regs[0] for name, regs in self._plugins[kind].items() if regs}

    def subscribe(self) -> queue.Queue[RegistryEvent]:
        sub: queue.Queue[RegistryEvent] = queue.Queue()
        with self._lock:
            self._subscribers.append(sub)
        return sub

    def unsubscribe(self, sub: queue.Queue[RegistryEvent]) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    def wait_for_plugin(self, kind: str, name: str, timeout: float) -> PluginRegistration:
        """Poll from 200 ms, doubling to 5 s, until the plugin is registered or time runs out."""
        deadline = time.monotonic() + timeout
        wait = 0.2
        while True:
            found = self.current(kind, name)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CSIError(
                    f"{kind} plugin '{name}' did not become ready: no instance registered within {timeout:g}s; "
                    "check that the plugin's task is running and healthy",
                    code="DEADLINE_EXCEEDED",
                    call="WaitForPlugin",
                )
            time.sleep(min(wait, remaining))
            wait = min(wait * 2, 5.0)
