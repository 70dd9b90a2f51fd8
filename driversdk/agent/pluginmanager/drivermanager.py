"""The driver manager: one plugin instance per driver for the whole ``run`` process.

As Nomad's client keeps one instance manager per driver plugin: the plugin is launched on first
use (or taken over from validation, which launched it to read its schema), shared by every
allocation and job this process runs, its reattach config kept in ``state.db`` so a restarted
``run`` reattaches instead of launching a second one, dispensed again when it dies (one new
instance per death, shared by its tasks; each task's runner asks for it and recovers its own
task), and shut down when no allocation uses it. It only dispenses, reattaches and shuts down
plugins: it keeps no task.

Task events come on one stream per plugin and are handed to the allocation they belong to.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from driversdk.agent.events import Emit, RunEvent
from driversdk.agent.state.runstate import RunState
from driversdk.bundled import reinstall_hint
from driversdk.client import DriverClient, launch, reattach
from driversdk.errors import DriverSDKError
from driversdk.jobspec.clientconfig import ClientConfig
from driversdk.model import AgentConfig, ExitResult, TaskEvent
from driversdk.plugin.host import pid_alive, remove_dead_plugin_socket
from driversdk.plugin.log import ENV_LOG_FILE
from driversdk.plugin.reattach import ReattachConfig
from driversdk.plugin.verify import ReattachRefused

if TYPE_CHECKING:
    from driversdk.agent.validate import DriverFacts

AGENT_CONFIG = AgentConfig(14000, 14512)


class NoDriverPlugin(DriverSDKError):
    """No plugin is configured or bundled for a driver a job names."""


class WaitFailed(DriverSDKError):
    """WaitTask failed while the plugin lived on."""


class PluginExited(DriverSDKError):
    """The plugin a task's wait was on died under it (the task itself may run on)."""

    def __init__(self, plugin: DriverClient) -> None:
        super().__init__(f"the {plugin.name} driver plugin exited")
        self.plugin = plugin


class AgentShutdown(DriverSDKError):
    """The agent let its plugins go and leaves the tasks running for the next agent."""


@dataclass
class DriverHealth:
    """A driver as its last fingerprint left it: Nomad's node ``Drivers`` entry."""

    healthy: bool
    description: str
    attributes: dict[str, str] = field(default_factory=dict)
    updated: int = 0


class DriverManager:
    """The node's driver plugins: dispensed (reattached, or launched), fingerprinted, watched for
    death and shut down with their last user. Tasks are the task runners' own."""

    def __init__(
        self,
        client: ClientConfig,
        state: RunState,
        emit: Emit,
        spare: dict[str, DriverClient] | None = None,
    ) -> None:
        self.client = client
        self.state = state
        self.emit = emit
        # Plugins validation launched and configured: the first use of each takes it.
        self._spare: dict[str, DriverClient] = dict(spare or {})
        self._plugins: dict[str, DriverClient] = {}
        self._users: dict[str, int] = {}
        self._subscribers: dict[str, Callable[[TaskEvent], None]] = {}
        # Held while a plugin is launched or replaced: tasks that lost it together relaunch it once.
        self._lock = threading.RLock()
        self._closing = False
        self.facts: dict[str, DriverFacts] = {}
        self.health: dict[str, DriverHealth] = {}

    # --- instances -----------------------------------------------------------------------------

    def dispense(self, driver: str) -> DriverClient:
        """The driver's live plugin: reattached, taken from validation, or launched now."""
        with self._lock:
            current = self._plugins.get(driver)
            if current is not None and current.process.alive():
                return current
            if current is not None:  # died between uses: replaced once, as for a death a waiting task saw
                return self._replace(driver, current)
            plugin = self._reattach(driver)
            if plugin is None:
                plugin = self._launch(driver)
            else:
                spare = self._spare.pop(driver, None)
                if spare is not None:  # validation's instance is not needed: the reattached one runs the tasks
                    spare.kill()
            self._plugins[driver] = plugin
            self._relay_events(plugin)
            return plugin

    def acquire(self, driver: str) -> DriverClient:
        """Count one more user (an allocation) of the driver; see :meth:`release`."""
        with self._lock:
            plugin = self.dispense(driver)
            self._users[driver] = self._users.get(driver, 0) + 1
            return plugin

    def release(self, driver: str) -> None:
        """One user fewer; the last one shuts the plugin down, as Nomad's client does with a plugin it drops."""
        with self._lock:
            self._users[driver] = self._users.get(driver, 0) - 1
            if self._users[driver] > 0:
                return
            del self._users[driver]
            plugin = self._plugins.pop(driver, None)
            if plugin is not None:
                plugin.kill()
                self.state.plugin_gone(driver)
            self._shut_down_retired(driver)

    def fingerprint(self, driver: str) -> DriverHealth:
        """Launch (or reattach to) ``driver``'s plugin, held as a user for the manager's life, and
        read what it offers: healthy, with its attributes and facts, or unhealthy with the reason.
        An unhealthy plugin is let go at once (no task may use it, so it would only hold memory:
        raw_exec, disabled unless enabled, costs as much as a driver in use)."""
        from driversdk.agent.validate import facts_of, plugin_config_for

        try:
            plugin = self.acquire(driver)
        except DriverSDKError as err:
            health = DriverHealth(False, f"the {driver} plugin could not be started: {err}", updated=time.time_ns())
        else:
            try:
                _, skipped = plugin_config_for(driver, self.client, plugin)
                facts = facts_of(driver, plugin, skipped)
                healthy = facts.attributes.get(f"driver.{driver}") == "true"
                description = "Healthy" if healthy else _health_description(plugin)
                self.facts[driver] = facts
                health = DriverHealth(healthy, description, dict(facts.attributes), time.time_ns())
            except DriverSDKError as err:
                health = DriverHealth(False, f"the {driver} plugin did not answer: {err}", updated=time.time_ns())
            if not health.healthy:
                self.release(driver)  # a task it still runs after a restart dispenses it again
        self.health[driver] = health
        return health

    def running(self) -> dict[str, int]:
        """Driver → pid of its plugin process, for status and tests."""
        with self._lock:
            return {d: p.process.pid for d, p in self._plugins.items()}

    def _launch(self, driver: str) -> DriverClient:
        plugin = self._spare.pop(driver, None)
        if plugin is None:
            command = self.client.driver_command(driver)
            if command is None:
                raise NoDriverPlugin(f'no plugin is configured for driver "{driver}"' + reinstall_hint(driver))
            plugin = launch(command, name=driver, env=self._plugin_env(driver))
        try:
            plugin.set_config(self.client.plugin_config(driver), AGENT_CONFIG)
            plugin.init()
            # Not recorded (a full disk), a plugin would outlive the run with nobody knowing it.
            self.state.plugin_started(driver, plugin.process.reattach_config.to_json())
        except BaseException:
            plugin.kill()
            raise
        return plugin

    def _plugin_env(self, driver: str) -> dict[str, str]:
        """The plugin also logs to <data_dir>/logs/plugin-<driver>.log: a plugin outlives a killed
        host and is reattached by the next one, and its lines in between reach no reader's pipe."""
        logs = os.path.join(self.client.data_dir, "logs")
        try:
            os.makedirs(logs, mode=0o700, exist_ok=True)
        except OSError:
            return dict(os.environ)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", driver).lstrip(".")
        return {**os.environ, ENV_LOG_FILE: os.path.join(logs, f"plugin-{name}.log")}

    def _reattach(self, driver: str) -> DriverClient | None:
        """The plugin a killed run of this data dir left running, or one of the per-allocation
        plugins a run before the driver manager left (state migration 2)."""
        candidates = self.state.plugins_to_adopt(driver, pid_alive)
        for at, (old_pid, saved) in enumerate(candidates):
            plugin = self._try_reattach(driver, saved)
            if plugin is None:
                self.state.plugin_gone(driver, old_pid)
                continue
            self.state.plugin_adopted(driver, old_pid, saved)
            self._shut_down_redundant(driver, candidates[at + 1 :])
            return plugin
        for alloc_id, saved in self.state.retired_plugins(driver):
            plugin = self._try_reattach(driver, saved)
            self.state.retired_plugin_gone(alloc_id, driver)
            if plugin is not None:
                self.state.plugin_started(driver, saved)
                return plugin
        return None

    def _try_reattach(self, driver: str, saved: str) -> DriverClient | None:
        """The recorded plugin, reconnected to, or None: it is gone, or it is not provably the
        process that was launched (then said, and nothing is sent to it). Either way the caller
        drops the record and goes on as for a dead plugin: a new one, and RecoverTask."""
        try:
            config = ReattachConfig.from_json(saved)
        except (ValueError, KeyError, TypeError):
            return None  # a damaged record: nothing to reattach to
        try:
            plugin = reattach(config, name=driver)
        except ReattachRefused as refused:
            self.emit(RunEvent("driver", f"{refused}; a new plugin is launched instead", name=driver))
            return None
        except DriverSDKError:
            # It died with the run: a new one is launched and RecoverTask finds the tasks. Killed
            # with its host, it could not remove its socket dir, and nobody else knows of it.
            remove_dead_plugin_socket(config)
            return None
        self.emit(RunEvent("driver", "reattached to its running plugin", name=driver))
        return plugin

    def _shut_down_redundant(self, driver: str, others: list[tuple[int, str]]) -> None:
        """Plugins of other killed runs of this data dir: one instance runs (and recovers) every task
        of the driver, and the tasks outlive their plugin, so the rest would only outlive every run."""
        for old_pid, saved in others:
            if old_pid == os.getpid():
                continue
            try:
                config = ReattachConfig.from_json(saved)
            except (ValueError, KeyError, TypeError):
                self.state.plugin_gone(driver, old_pid)  # a damaged record: nothing to reach
                continue
            try:
                reattach(config, name=driver).kill()
            except ReattachRefused as refused:  # not provably the plugin launched: not ours to stop
                self.emit(RunEvent("driver", str(refused), name=driver))
            except DriverSDKError:
                remove_dead_plugin_socket(config)  # gone already, maybe with its socket dir left
            self.state.plugin_gone(driver, old_pid)

    def _shut_down_retired(self, driver: str) -> None:
        """Per-allocation plugins of an older run: their tasks were recovered through the shared
        instance (or are gone), so the processes only hold memory now."""
        for alloc_id, saved in self.state.retired_plugins(driver):
            try:
                config = ReattachConfig.from_json(saved)
            except (ValueError, KeyError, TypeError):
                self.state.retired_plugin_gone(alloc_id, driver)
                continue
            try:
                reattach(config, name=driver).kill()
            except ReattachRefused as refused:  # not ours to stop
                self.emit(RunEvent("driver", str(refused), name=driver))
            except DriverSDKError:
                remove_dead_plugin_socket(config)  # already gone, maybe with its socket dir left
            self.state.retired_plugin_gone(alloc_id, driver)

    # --- task events ---------------------------------------------------------------------------

    def subscribe(self, alloc_id: str, handler: Callable[[TaskEvent], None]) -> None:
        with self._lock:
            self._subscribers[alloc_id] = handler

    def unsubscribe(self, alloc_id: str) -> None:
        with self._lock:
            self._subscribers.pop(alloc_id, None)

    def _relay_events(self, plugin: DriverClient) -> None:
        """One stream per plugin instance, each event handed to its allocation (image pulls, OOM
        kills, …); the stream ends with the instance."""

        def relay() -> None:
            try:
                for event in plugin.task_events():
                    handler = self._subscribers.get(event.alloc_id)
                    if handler is not None:
                        handler(event)
            except DriverSDKError:
                pass  # the plugin went away: the stream ends with it

        threading.Thread(target=relay, daemon=True, name=f"task-events-{plugin.name}").start()

    # --- waits and plugin deaths ----------------------------------------------------------------

    def watch(
        self, plugin: DriverClient, task_id: str, on_outcome: Callable[[ExitResult | DriverSDKError], None]
    ) -> None:
        """WaitTask on ``plugin`` with no thread held while the task runs: ``on_outcome`` gets, exactly
        once and on a short-lived thread of its own (it may block), the exit, or :class:`PluginExited`
        (the plugin died under the wait), :class:`AgentShutdown` (the plugins are being let go with
        their tasks left running) or :class:`WaitFailed`. What follows is the task runner's to decide."""

        def settled(outcome: ExitResult | DriverSDKError) -> None:
            # gRPC's callback thread serves every pending call: nothing slow happens on it.
            threading.Thread(
                target=self._settle, args=(plugin, outcome, on_outcome), daemon=True, name="task-exit"
            ).start()

        try:
            plugin.watch_task(task_id, settled)
        except DriverSDKError as err:
            settled(err)

    def _settle(
        self,
        plugin: DriverClient,
        outcome: ExitResult | DriverSDKError,
        on_outcome: Callable[[ExitResult | DriverSDKError], None],
    ) -> None:
        if not isinstance(outcome, ExitResult):
            if self._closing:
                outcome = AgentShutdown(f"the {plugin.name} driver plugin was shut down with the agent")
            elif plugin.process.exited_within(1.0):
                outcome = PluginExited(plugin)
            else:
                outcome = WaitFailed(f"wait failed: {outcome}")
        on_outcome(outcome)

    def redispense(self, driver: str, dead: DriverClient) -> DriverClient:
        """The driver's plugin in place of ``dead``: launched now by the first task that saw the death,
        the same new instance for every other task of it (one launch per death)."""
        with self._lock:
            return self._replace(driver, dead)

    def _replace(self, driver: str, dead: DriverClient) -> DriverClient:
        """Called with the lock held."""
        current = self._plugins.get(driver)
        if current is not None and current is not dead and current.process.alive():
            return current
        dead.kill()  # reaps the process and removes its socket
        self.state.plugin_gone(driver)
        self._plugins.pop(driver, None)
        plugin = self._launch(driver)
        self._plugins[driver] = plugin
        self._relay_events(plugin)
        return plugin

    # --- shutdown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut down every plugin still held (an allocation that never released its driver, or
        validation's plugins no allocation needed). Every plugin is shut down before any record of
        them is removed: a record that cannot be removed (a full disk) is raised at the end."""
        with self._lock:
            self._closing = True
            held = list(self._plugins.items())
            self._plugins.clear()
            for _, plugin in held:
                plugin.kill()
            for plugin in self._spare.values():
                plugin.kill()
            self._spare.clear()
            for driver, _ in held:
                self.state.plugin_gone(driver)
                self._shut_down_retired(driver)


def _health_description(plugin: DriverClient) -> str:
    """The plugin's own words for why it is not healthy (its first fingerprint)."""
    try:
        stream = plugin.fingerprint()
        try:
            first = next(iter(stream))
        finally:
            close = getattr(stream, "close", None)  # a gRPC stream: cancelled once its first answer is in
            if close is not None:
                close()
    except (DriverSDKError, StopIteration):
        return "Unhealthy: the plugin sent no fingerprint"
    return str(first.health_description or first.health)
