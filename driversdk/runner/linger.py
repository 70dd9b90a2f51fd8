"""Bundled plugins kept between runs of one data dir.

A ``driversdk run`` that is done with a bundled driver's plugin (docker, exec, raw_exec at their
bundled commands) does not stop it: it records it in ``state.db`` as idle, and the next run of
the same data dir with the same plugin command and config takes it over instead of booting a new
interpreter and reloading the driver (the docker SDK alone is ~0.2 s). This is Nomad's model, where
the client keeps its plugins and reattaches to them, for a runner that is a command and not an
agent. The plugin is launched with :data:`~driversdk.plugin.handshake.ENV_IDLE_EXIT`, so once no
run has used it for the linger time it stops by itself; a plugin with tasks or networks left (its
run was killed) is never idle and waits to be reattached, as before.

``DRIVERSDK_LINGER`` sets the time as a Go duration ("5m", the default; "0" keeps nothing).
Only bundled plugins are kept: a plugin of the operator's own may not know the idle exit, and it
would then live on forever.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING

from driversdk.codeid import code_identity
from driversdk.durations import parse_duration
from driversdk.errors import DriverSDKError

if TYPE_CHECKING:
    from driversdk.client import DriverClient
    from driversdk.runner.clientconfig import ClientConfig
    from driversdk.runner.runstate import RunState

ENV_LINGER = "DRIVERSDK_LINGER"
DEFAULT_LINGER = "5m"


def linger_seconds() -> float:
    """How long a finished run keeps its bundled plugins for the next one; 0 keeps none. A value
    that is not a duration raises ConfigError naming the variable."""
    raw = os.environ.get(ENV_LINGER, "").strip() or DEFAULT_LINGER
    return parse_duration(raw, ENV_LINGER)


def kept_for(client: ClientConfig, driver: str, linger: float) -> float | None:
    """The idle exit to launch ``driver``'s plugin with: the linger time for a bundled plugin at
    its bundled command, None for every other plugin (launched as Nomad launches it)."""
    return linger if linger > 0 and client.runs_bundled(driver) else None


def fingerprint(client: ClientConfig, driver: str) -> str:
    """What a kept plugin was started from and configured with: a run with another command or
    plugin config must not use it (it would run tasks under the old config), nor one after the
    code changed (an upgrade, or an edit of a checkout: it would run the old code)."""
    what = {"command": client.driver_command(driver), "config": client.plugin_config(driver), "code": code_identity()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=repr).encode()).hexdigest()


def take_idle(client: ClientConfig, driver: str, state: RunState, linger: float) -> DriverClient | None:
    """A kept plugin of ``driver`` this run may use, or None. Kept plugins that cannot be used
    any more are dealt with on the way: one that stopped (its idle time ran out) is forgotten and
    its socket dir removed if it could not remove it; one kept under another command or config is
    stopped, since nothing will ever take it."""
    if kept_for(client, driver, linger) is None:
        return None
    from driversdk.client import reattach
    from driversdk.plugin.host import ReattachConfig, remove_dead_plugin_socket

    wanted = fingerprint(client, driver)
    for saved, kept_with in state.idle_plugins(driver):
        if not state.take_idle_plugin(saved):
            continue  # another run of this data dir took it first
        try:
            config = ReattachConfig.from_json(saved)
        except (ValueError, KeyError, TypeError):
            continue  # a damaged row: nothing to reattach to
        try:
            plugin = reattach(config, name=driver)
        except DriverSDKError:
            remove_dead_plugin_socket(config)
            continue
        if kept_with != wanted:
            plugin.kill()
            continue
        plugin.process.idle_exit = linger
        return plugin
    return None


def stop_kept(state: RunState) -> list[str]:
    """Stop now every plugin the runs of this data dir kept (``driversdk stop-kept``); the drivers
    of those that were still running. Each is taken off the list first, so no run starting
    meanwhile takes a plugin being stopped."""
    from driversdk.client import reattach
    from driversdk.plugin.host import ReattachConfig, remove_dead_plugin_socket

    stopped = []
    for driver, saved, _since in state.kept_plugins():
        if not state.take_idle_plugin(saved):
            continue  # a run took it meanwhile: it is that run's now
        try:
            config = ReattachConfig.from_json(saved)
        except (ValueError, KeyError, TypeError):
            continue
        try:
            reattach(config, name=driver).kill()
        except DriverSDKError:
            remove_dead_plugin_socket(config)  # it had stopped by itself
            continue
        stopped.append(driver)
    return stopped
