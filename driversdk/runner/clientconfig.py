"""The client (agent) config: data dir, host volumes, and the driver plugins with their config.

Besides Nomad's ``plugin_dir`` + ``plugin "<name>" { args, config }`` we accept
``command = [...]`` in a plugin block, so any program can be a driver; the bundled docker and
exec drivers need neither.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driversdk.runner.hclload import labelled, load_hcl, single
from driversdk.runner.problems import Problem, ValidationFailed

BUNDLED = {
    "docker": [sys.executable, "-m", "drivers.docker"],
    "exec": [sys.executable, "-m", "drivers.exec"],
}


@dataclass(frozen=True)
class HostVolume:
    name: str
    path: str
    read_only: bool = False


@dataclass
class PluginBlock:
    name: str
    command: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientConfig:
    file: str = ""
    data_dir: str = "/var/lib/driversdk"
    plugin_dir: str = ""
    host_volumes: dict[str, HostVolume] = field(default_factory=dict)
    plugins: dict[str, PluginBlock] = field(default_factory=dict)

    def driver_command(self, driver: str) -> list[str] | None:
        block = self.plugins.get(driver)
        if block is not None and block.command:
            return list(block.command)
        args = block.command[1:] if block and block.command else []
        if self.plugin_dir:
            candidate = os.path.join(self.plugin_dir, driver)
            if os.access(candidate, os.X_OK):
                return [candidate, *args]
        if driver in BUNDLED:
            return list(BUNDLED[driver])
        return None

    def plugin_config(self, driver: str) -> dict[str, Any]:
        block = self.plugins.get(driver)
        return dict(block.config) if block else {}


def load_client(path: str | Path | None) -> ClientConfig:
    if path is None:
        return ClientConfig()
    file = str(path)
    data = load_hcl(path)
    problems: list[Problem] = []
    cfg = ClientConfig(file=file)
    cfg.data_dir = str(data.get("data_dir") or cfg.data_dir)
    cfg.plugin_dir = str(data.get("plugin_dir") or "")
    client = single(data.get("client"))
    for name, body in labelled(data.get("host_volume")) + labelled(client.get("host_volume")):
        if not body.get("path"):
            problems.append(
                Problem(file, "Missing path in host_volume config; set path", field=f'host_volume "{name}"')
            )
            continue
        # As Nomad merges config files: a later host_volume with the same name replaces the earlier.
        cfg.host_volumes[name] = HostVolume(name, str(body["path"]), bool(body.get("read_only")))
    for name, body in labelled(data.get("plugin")):
        command = body.get("command") or []
        args = body.get("args") or []
        if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
            problems.append(Problem(file, "command must be a list of strings", field=f'plugin "{name}"'))
            command = []
        cfg.plugins[name] = PluginBlock(name, [*command, *args] if command else [], single(body.get("config")))
    if problems:
        raise ValidationFailed(problems)
    return cfg
