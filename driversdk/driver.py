"""The class a driver author subclasses.

The core lifecycle is abstract (:class:`driversdk.taskkit.processdriver.ProcessDriver` implements
all of it for a driver whose tasks are host processes); optional calls (signals, exec, networks,
stats) have defaults that answer "not supported" with a fixed sentence, and the default
capabilities claim only what the class implements, so a partial driver stays short and honest.
The SDK turns every method here into the matching gRPC call of Nomad's driver protocol.
"""

from __future__ import annotations

import abc
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from driversdk.errors import NotSupportedError

if TYPE_CHECKING:
    # Types only: the data model is loaded when a driver first builds or receives a value.
    from driversdk.hclspec import Spec
    from driversdk.model import (
        AgentConfig,
        Capabilities,
        ExecResult,
        ExitResult,
        Fingerprint,
        NetworkIsolationSpec,
        TaskConfig,
        TaskEvent,
        TaskHandle,
        TaskStats,
        TaskStatus,
    )


@dataclass(frozen=True)
class TerminalSize:
    height: int
    width: int


class ExecSession(abc.ABC):
    """One streaming exec (``nomad alloc exec``) as the driver sees it.

    The SDK bridges it to the bidirectional gRPC stream: stdin arrives through
    :meth:`read_stdin`, output goes out through :meth:`send_stdout` / :meth:`send_stderr`.
    """

    task_id: str
    command: list[str]
    tty: bool

    @abc.abstractmethod
    def read_stdin(self, timeout: float | None = None) -> bytes | None:
        """Next stdin chunk; ``b""`` when nothing arrived within timeout; None at end of input."""

    @abc.abstractmethod
    def send_stdout(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def send_stderr(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def terminal_size(self) -> TerminalSize | None:
        """The latest size the client asked for (tty sessions), or None."""

    @abc.abstractmethod
    def on_resize(self, callback: Callable[[TerminalSize], None]) -> None:
        """Call ``callback(TerminalSize)`` on every later resize request."""

    @property
    @abc.abstractmethod
    def cancelled(self) -> bool:
        """True once the client went away."""


class DriverPlugin(abc.ABC):
    """Base class of every driver. Subclass it, then call :func:`driversdk.serve`."""

    name: ClassVar[str]
    """The driver name jobs select with ``driver = "<name>"``; keep the binary named the same."""
    version: ClassVar[str] = "0.1.0"
    fingerprint_interval: ClassVar[float] = 30.0
    """Seconds between fingerprint re-sends (Nomad's built-in drivers use 30 s)."""

    def __init__(self) -> None:
        # Who hears emit_event: the SDK's TaskEvents streams and any queue from subscribe_events.
        self._event_listeners: list[Callable[[TaskEvent], None]] = []
        self._event_lock = threading.Lock()
        self._fingerprint_changed = threading.Condition()
        self._fingerprint_generation = 0
        self._fingerprint_listeners: list[Callable[[], None]] = []

    # --- configuration -------------------------------------------------------------------

    def config_schema(self) -> Spec | None:
        """The hclspec of the agent's ``plugin "<name>" { config {} }`` block; None = no config."""
        return None

    def set_config(self, config: dict[str, Any], agent: AgentConfig | None) -> None:
        """Receive the decoded plugin config. Called more than once; must be idempotent.

        ``agent`` is None in Nomad's config-validation launch.
        """

    @abc.abstractmethod
    def task_config_schema(self) -> Spec:
        """The hclspec of a task's ``config {}`` block."""

    def capabilities(self) -> Capabilities:
        """What this driver can do. The default claims only what the class implements: signals
        when it overrides :meth:`signal_task`, exec when it overrides :meth:`exec_task` and
        :meth:`exec_task_streaming`, and no
        mounts, no filesystem isolation. Override it to claim more (mounts, networks)."""
        from driversdk.model import Capabilities, MountConfigSupport

        return Capabilities(
            send_signals=self.overrides("signal_task"),
            # Nomad uses both: ExecTask for script checks, ExecTaskStreaming for `nomad alloc exec`.
            exec=self.overrides("exec_task") and self.overrides("exec_task_streaming"),
            mount_configs=MountConfigSupport.NONE,
        )

    @classmethod
    def overrides(cls, method: str) -> bool:
        """True when this class (or a base between it and DriverPlugin) defines ``method``."""
        return getattr(cls, method) is not getattr(DriverPlugin, method)

    def init(self) -> None:
        """Called after every dispense (after SetConfig, and after a host reattaches)."""

    def shutdown(self) -> None:
        """Best-effort hook before the host kills the plugin. Must not stop tasks."""

    # --- fingerprint ---------------------------------------------------------------------

    def fingerprint(self) -> Fingerprint:
        """One reading of the driver's health and node attributes (default: healthy, none).

        The SDK streams it at once, then every ``fingerprint_interval`` seconds and whenever
        :meth:`notify_fingerprint_changed` is called. Keep the description stable: a change
        is a node event in Nomad.
        """
        from driversdk.model import Fingerprint, HealthState

        return Fingerprint(HealthState.HEALTHY, "Healthy")

    def notify_fingerprint_changed(self) -> None:
        """Ask the SDK to send a fresh fingerprint now (e.g. the engine went away)."""
        with self._fingerprint_changed:
            self._fingerprint_generation += 1
            self._fingerprint_changed.notify_all()
            listeners = list(self._fingerprint_listeners)
        for listener in listeners:
            listener()

    def add_fingerprint_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on every later :meth:`notify_fingerprint_changed`.

        It runs on the notifying thread and must return quickly; the SDK's Fingerprint stream
        uses it to wake up without holding a thread while it waits.
        """
        with self._fingerprint_changed:
            self._fingerprint_listeners.append(listener)

    def remove_fingerprint_listener(self, listener: Callable[[], None]) -> None:
        with self._fingerprint_changed:
            if listener in self._fingerprint_listeners:
                self._fingerprint_listeners.remove(listener)

    def wait_fingerprint_change(self, generation: int, timeout: float) -> int:
        """Block until notify_fingerprint_changed or timeout; returns the current generation."""
        with self._fingerprint_changed:
            self._fingerprint_changed.wait_for(lambda: self._fingerprint_generation != generation, timeout)
            return self._fingerprint_generation

    # --- task lifecycle ------------------------------------------------------------------

    @abc.abstractmethod
    def start_task(self, task: TaskConfig) -> TaskHandle:
        """Start the task and return a handle carrying everything needed to recover it.

        Raise :class:`~driversdk.errors.DriverError` (``recoverable=True`` when a retry could
        help) on failure, after releasing everything created so far.
        """

    @abc.abstractmethod
    def recover_task(self, handle: TaskHandle) -> None:
        """Re-attach to a task started by an earlier plugin process.

        ``handle.config.id`` is the task id. Return quietly if the task is already tracked.
        Raise if it cannot be found; the host then destroys it and starts a new one.
        """

    @abc.abstractmethod
    def wait_task(self, task_id: str) -> ExitResult:
        """Block until the task exits; return at once if it already has."""

    def watch_exit(self, task_id: str, callback: Callable[[ExitResult], None]) -> bool:
        """Call ``callback(result)`` once when the task exits (at once if it already has).

        The callback may run on any thread and must return quickly. Return True when the driver
        will call it; False (the default) when it cannot, and the SDK then serves WaitTask by
        running :meth:`wait_task` on a thread of its own for as long as the task runs. A driver
        expecting many tasks per plugin implements this so a waiting host costs no thread.
        Raise :class:`~driversdk.errors.TaskNotFoundError` for an unknown task.
        """
        return False

    @abc.abstractmethod
    def stop_task(self, task_id: str, timeout: float, signal: str) -> None:
        """Send ``signal`` (driver default when empty), wait up to ``timeout`` s, then kill."""

    @abc.abstractmethod
    def destroy_task(self, task_id: str, force: bool) -> None:
        """Kill if running (when ``force``), release every resource, forget the task."""

    @abc.abstractmethod
    def inspect_task(self, task_id: str) -> TaskStatus: ...

    # --- optional calls ------------------------------------------------------------------

    def task_stats(self, task_id: str) -> TaskStats | None:
        """One resource-usage sample; None once the task has exited (ends the stream)."""
        raise NotSupportedError(self.name, "task stats")

    def signal_task(self, task_id: str, signal: str) -> None:
        raise NotSupportedError(self.name, "signalling tasks")

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        raise NotSupportedError(self.name, "exec")

    def exec_task_streaming(self, session: ExecSession) -> ExitResult:
        raise NotSupportedError(self.name, "streaming exec")

    def create_network(self, alloc_id: str, hostname: str) -> tuple[NetworkIsolationSpec, bool]:
        """Create (or find) the allocation's network namespace; bool = newly created."""
        raise NotSupportedError(self.name, "creating networks")

    def destroy_network(self, alloc_id: str, spec: NetworkIsolationSpec) -> None:
        raise NotSupportedError(self.name, "destroying networks")

    # --- events ----------------------------------------------------------------------------

    def emit_event(self, event: TaskEvent) -> None:
        """Publish a task event to every open TaskEvents stream."""
        with self._event_lock:
            listeners = list(self._event_listeners)
        for listener in listeners:
            listener(event)

    def add_event_listener(self, listener: Callable[[TaskEvent], None]) -> None:
        """Call ``listener(event)`` for every later :meth:`emit_event`.

        It runs on the emitting thread and must return quickly (hand the event over, no I/O);
        the SDK's TaskEvents streams listen this way, so an open stream holds no thread.
        """
        with self._event_lock:
            self._event_listeners.append(listener)

    def remove_event_listener(self, listener: Callable[[TaskEvent], None]) -> None:
        with self._event_lock:
            if listener in self._event_listeners:
                self._event_listeners.remove(listener)

    def subscribe_events(self) -> queue.Queue[TaskEvent]:
        """A queue receiving every later event, for a consumer in this process that reads events
        from a queue rather than through a listener."""
        subscriber: queue.Queue[TaskEvent] = queue.Queue()
        # Bound methods compare equal by object and function, so unsubscribe finds it again.
        self.add_event_listener(subscriber.put)
        return subscriber

    def unsubscribe_events(self, subscriber: queue.Queue[TaskEvent]) -> None:
        self.remove_event_listener(subscriber.put)

    def task_events(self) -> Iterator[TaskEvent]:  # pragma: no cover - convenience for in-process use
        subscriber = self.subscribe_events()
        try:
            while True:
                yield subscriber.get()
        finally:
            self.unsubscribe_events(subscriber)
