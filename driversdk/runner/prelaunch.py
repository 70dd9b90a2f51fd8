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

    def __init__(self, checks_only: bool = False) -> None:
        self._started: dict[str, tuple[list[str], StartingPlugin]] = {}
        self.checks_only = checks_only

    @classmethod
    def for_jobs(cls, paths: Iterable[str], client: ClientConfig, checks_only: bool = False) -> Prelaunched:
        """Start the plugin of every driver the files name whose command the client config knows.
        Nothing here fails: an unreadable file or a plugin that cannot be started is left for the
        parse and the real start to report. ``checks_only``: the plugins will only be asked for
        their schemas, config and fingerprint (``driversdk validate``), never to start a task."""
        started = cls(checks_only)
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
                started._start(name, command)
        return started

    def _start(self, driver: str, command: list[str]) -> None:
        from driversdk.plugin.host import spawn_plugin

        try:
            self._started[driver] = (command, spawn_plugin(command, name=driver, checks_only=self.checks_only))
        except DriverSDKError:
            pass  # the real start says why, with the job's context

    def take(self, driver: str, command: list[str]) -> StartingPlugin | None:
        """The plugin started for ``driver`` if it runs ``command``; one started with another
        command is killed (the caller starts the right one)."""
        entry = self._started.pop(driver, None)
        if entry is None:
            return None
        started_command, plugin = entry
        if started_command == command:
            return plugin
        plugin.abandon()
        return None

    def abandon(self) -> None:
        """Kill and reap every plugin nobody took."""
        while self._started:
            _, (_, plugin) = self._started.popitem()
            plugin.abandon()

    def __len__(self) -> int:
        return len(self._started)


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
