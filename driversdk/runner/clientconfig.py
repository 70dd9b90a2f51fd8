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

from driversdk.paths import PATH_MAX, check_name, show
from driversdk.runner.hclload import is_blocks, labelled, load_hcl
from driversdk.runner.problems import Problem, ValidationFailed

BUNDLED = {
    "docker": [sys.executable, "-m", "drivers.docker"],
    "exec": [sys.executable, "-m", "drivers.exec"],
    "raw_exec": [sys.executable, "-m", "drivers.raw_exec"],
}


@dataclass(frozen=True)
class HostVolume:
    name: str
    path: str  # as written in the client config, for messages
    read_only: bool = False
    # ``path`` with symlinks resolved once, when the config is loaded: what gets mounted, so a
    # link swapped after validation cannot redirect the mount.
    resolved: str = ""

    @property
    def host_path(self) -> str:
        return self.resolved or self.path


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


_PLUGIN_KEYS = {"command", "args", "config"}
_HOST_VOLUME_KEYS = {"path", "read_only"}


def _shown(value: Any) -> str:
    return show(value) if isinstance(value, str) else show(repr(value))[1:-1]


def _body(value: Any) -> dict[str, Any] | None:
    """One block's body; None when ``value`` is not a block (``config = 5``)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if is_blocks(value):
        merged: dict[str, Any] = {}
        for block in value:
            merged.update(block)
        return merged
    return None


def _absolute(value: Any, what: str) -> str | None:
    """Why ``value`` is not an absolute path string, or None."""
    if not isinstance(value, str):
        return f"{what} must be an absolute path in quotes, not {_shown(value)}"
    if "\x00" in value:
        return f"{what} {show(value, PATH_MAX)} contains a NUL character"
    if not os.path.isabs(value):
        shown = show(value, PATH_MAX)
        return f"{what} {shown} must be an absolute path (it would depend on the directory driversdk runs in)"
    return None


def _host_volume(file: str, name: str, body: dict[str, Any], problems: list[Problem]) -> HostVolume | None:
    where = f"host_volume {show(name)}"
    before = len(problems)
    problem = check_name(name, "the host volume name")
    if problem is not None:
        problems.append(Problem(file, problem, field=where))
    for key in sorted(set(body) - _HOST_VOLUME_KEYS):
        problems.append(Problem(file, f"unsupported argument {key!r}; use path and read_only", field=where))
    read_only = body.get("read_only", False)
    if not isinstance(read_only, bool):
        problems.append(Problem(file, f"read_only must be true or false, not {_shown(read_only)}", field=where))
    path = body.get("path")
    if path is None or path == "":
        problems.append(Problem(file, "Missing path in host_volume config; set path", field=where))
        return None
    problem = _absolute(path, "path")
    if problem is not None:
        problems.append(Problem(file, problem, field=where))
        return None
    # Resolved once, here: validate shows the target and run mounts exactly what was shown.
    resolved = os.path.realpath(path)
    if resolved == "/":
        via = "" if os.path.normpath(path) == "/" else " (through a symlink)"
        problems.append(
            Problem(
                file,
                f"path {show(path, PATH_MAX)} resolves to /{via}, the host's whole filesystem; refusing to mount it "
                "into tasks: point the host volume at a directory",
                field=where,
            )
        )
    if len(problems) > before:
        return None
    return HostVolume(name, path, read_only, resolved)


def _plugin(file: str, name: str, body: dict[str, Any], problems: list[Problem]) -> PluginBlock | None:
    where = f"plugin {show(name)}"
    before = len(problems)
    for key in sorted(set(body) - _PLUGIN_KEYS):
        problems.append(
            Problem(file, f"unsupported argument or block {key!r}; use command, args and config {{ … }}", field=where)
        )
    lists: dict[str, list[str]] = {}
    for key in ("command", "args"):
        value = body.get(key)
        if value is None:
            lists[key] = []
        elif isinstance(value, list) and all(isinstance(c, str) and "\x00" not in c for c in value):
            lists[key] = list(value)
        else:
            problems.append(Problem(file, f"{key} must be a list of strings, not {_shown(value)}", field=where))
    config = _body(body.get("config"))
    if config is None:
        problems.append(
            Problem(file, f"config must be a block (config {{ … }}), not {_shown(body.get('config'))}", field=where)
        )
    if len(problems) > before or config is None:
        return None
    command = lists["command"]
    return PluginBlock(name, [*command, *lists["args"]] if command else [], config)


def load_client(path: str | Path | None) -> ClientConfig:
    """Read a client config; every value of the wrong type is refused, never coerced or defaulted."""
    if path is None:
        return ClientConfig()
    file = str(path)
    data = load_hcl(path)
    problems: list[Problem] = []
    cfg = ClientConfig(file=file)
    if "data_dir" in data:
        problem = _absolute(data["data_dir"], "data_dir")
        if problem is not None:
            problems.append(Problem(file, problem))
        else:
            cfg.data_dir = data["data_dir"]
    if data.get("plugin_dir") is not None:
        problem = _absolute(data["plugin_dir"], "plugin_dir")
        if problem is not None:
            problems.append(Problem(file, problem))
        else:
            cfg.plugin_dir = data["plugin_dir"]
    client = _body(data.get("client"))
    if client is None:
        problems.append(Problem(file, f"client must be a block (client {{ … }}), not {_shown(data.get('client'))}"))
        client = {}
    for key, blocks in (("host_volume", data.get("host_volume")), ("client.host_volume", client.get("host_volume"))):
        if blocks is not None and not is_blocks(blocks):
            problems.append(Problem(file, f'{key} must be blocks (host_volume "<name>" {{ path = … }})'))
    for key in ("plugin",):
        if data.get(key) is not None and not is_blocks(data[key]):
            problems.append(Problem(file, f'{key} must be blocks (plugin "<name>" {{ … }})'))
    for name, body in labelled(data.get("host_volume")) + labelled(client.get("host_volume")):
        volume = _host_volume(file, name, body, problems)
        if volume is not None:
            # As Nomad merges config files: a later host_volume with the same name replaces the earlier.
            cfg.host_volumes[name] = volume
    for name, body in labelled(data.get("plugin")):
        block = _plugin(file, name, body, problems)
        if block is not None:
            cfg.plugins[name] = block
    if problems:
        raise ValidationFailed(problems)
    return cfg
