"""Driver plugins started before a job file is parsed.

Parsing a job (the HCL2 parser's imports, the parse, the evaluation) takes about as long as a
plugin takes to boot, and ``driversdk validate`` / ``run`` cannot ask a plugin anything before
both are done. So once the client config is read, the drivers a job file names literally
(``driver = "docker"``) have their plugins started — the command the client config gives for
each, nothing from the job passed to them — and the parse runs while they boot. Validation then
takes the started plugin for a driver the parsed job really uses with the same command; whatever
it does not take (the line was in a heredoc, the job was refused first) is killed unused.

A guess never decides anything: the parsed job does. Only names that are a plain plugin name
(letters, digits, ``_``, ``-``) are looked at, so no text of the job reaches a path or a command.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from driversdk.errors import DriverSDKError

if TYPE_CHECKING:
    from driversdk.client import DriverClient
    from driversdk.plugin.host import StartingPlugin
    from driversdk.runner.clientconfig import ClientConfig

# ``driver = "docker"`` in HCL, ``"driver": "docker"`` (or ``"Driver"``) in a JSON job.
_DRIVER_LITERAL = re.compile(r'(?m)^\s*"?[Dd]river"?\s*[=:]\s*"([A-Za-z0-9_-]{1,64})"')
# A job file larger than this is not scanned (the parse reads it anyway): a guess is not worth
# reading megabytes twice.
SCAN_LIMIT = 1 << 20


def named_drivers(text: str) -> list[str]:
    """The driver names a job's text gives literally, first mention first, each once."""
    return list(dict.fromkeys(_DRIVER_LITERAL.findall(text)))


class Prelaunched:
    """Plugins started for the drivers named in job files, waiting to be taken by validation."""

    def __init__(self, checks_only: bool = False, linger: float = 0.0) -> None:
        self._started: dict[str, tuple[list[str], StartingPlugin | DriverClient]] = {}
        self.checks_only = checks_only
        self.linger = linger

    @classmethod
    def for_jobs(
        cls, paths: Iterable[str], client: ClientConfig, checks_only: bool = False, linger: float = 0.0
    ) -> Prelaunched:
        """Start the plugin of every driver the files name whose command the client config knows.
        Nothing here fails: an unreadable file or a plugin that cannot be started is left for the
        parse and the real start to report. ``checks_only``: the plugins will only be asked for
        their schemas, config and fingerprint (``driversdk validate``), never to start a task.
        ``linger`` (``driversdk run``): a bundled plugin an earlier run of this data dir kept is
        taken instead of starting one, and one started is launched to be kept in its turn
        (:mod:`driversdk.runner.linger`)."""
        started = cls(checks_only, linger)
        names: list[str] = []
        for path in paths:
            try:
                with open(path, "rb") as f:
                    raw = f.read(SCAN_LIMIT + 1)
            except OSError:
                continue
            if len(raw) <= SCAN_LIMIT:
                names += named_drivers(raw.decode("utf-8", errors="replace"))
        for name in dict.fromkeys(names):
            command = client.driver_command(name)
            if checks_only and client.runs_bundled(name):
                continue  # validation asks a bundled driver in its own process (driversdk.runner.inprocess)
            if command is not None:
                started._start(name, command, client)
        return started

    def _start(self, driver: str, command: list[str], client: ClientConfig) -> None:
        from driversdk.plugin.host import spawn_plugin
        from driversdk.runner.linger import kept_for

        idle_exit = None if self.checks_only else kept_for(client, driver, self.linger)
        kept = self._kept(driver, client) if idle_exit is not None else None
        if kept is not None:
            self._started[driver] = (command, kept)
            return
        try:
            self._started[driver] = (
                command,
                spawn_plugin(command, name=driver, checks_only=self.checks_only, idle_exit=idle_exit),
            )
        except DriverSDKError:
            pass  # the real start says why, with the job's context

    def _kept(self, driver: str, client: ClientConfig) -> DriverClient | None:
        """The plugin an earlier run kept for ``driver``, if one may be used. A state.db that cannot
        be read now is not this step's to report: the run opens it again and says why."""
        import sqlite3

        from driversdk.runner.linger import take_idle
        from driversdk.runner.runstate import RunState

        try:
            state = RunState(client.data_dir)
        except (DriverSDKError, sqlite3.Error, OSError):
            return None
        try:
            return take_idle(client, driver, state, self.linger)
        except (DriverSDKError, sqlite3.Error, OSError):
            return None
        finally:
            state.close()

    def take(self, driver: str, command: list[str]) -> StartingPlugin | DriverClient | None:
        """The plugin started (or kept by an earlier run) for ``driver`` if it runs ``command``;
        one with another command is stopped (the caller starts the right one)."""
        entry = self._started.pop(driver, None)
        if entry is None:
            return None
        started_command, plugin = entry
        if started_command == command:
            return plugin
        _stop(plugin)
        return None

    def abandon(self) -> None:
        """Stop every plugin nobody took (a kept one too: the run was refused, and the next run
        starts afresh)."""
        while self._started:
            _, (_, plugin) = self._started.popitem()
            _stop(plugin)

    def __len__(self) -> int:
        return len(self._started)


def _stop(plugin: StartingPlugin | DriverClient) -> None:
    from driversdk.plugin.host import StartingPlugin

    if isinstance(plugin, StartingPlugin):
        plugin.abandon()
    else:
        plugin.kill()


def start_early(
    paths: list[str], client_path: str | None, checks_only: bool = False
) -> tuple[ClientConfig, Prelaunched] | None:
    """For a command's first steps, before the parser and the validator are imported: read the
    client config and start the plugins the job files name. None when the client config cannot be
    read; the caller's own load then reports why, as it always does."""
    from driversdk.runner.clientconfig import load_client

    try:
        client = load_client(client_path)
    except DriverSDKError:
        return None
    return client, Prelaunched.for_jobs(paths, client, checks_only)
