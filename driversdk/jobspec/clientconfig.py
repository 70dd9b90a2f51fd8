"""The client (agent) config: data dir, host volumes, and the driver plugins with their config.

Nomad writes agent configs in HCL1 (quoted and dotted keys such as
``"docker.privileged.enabled" = "true"``); they are read with pyhcl, a maintained HCL1 parser,
so a whole agent file loads: what the runner has no use for (server, consul, vault, telemetry,
acl, ports, …) is listed in one note. Every option of Nomad's docker and exec plugin config is
known (:mod:`driversdk.jobspec.nomadopts`); an unknown one is a problem with did-you-mean.

Besides Nomad's ``plugin_dir`` + ``plugin "<name>" { args, config }`` we accept
``command = [...]`` in a plugin block, so any program can be a driver; the bundled docker and
exec drivers need neither.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from driversdk.bundled import bundled_driver
from driversdk.jobspec.hclload import HCLFileError, read_text
from driversdk.jobspec.nomadopts import PLUGIN_OPTIONS
from driversdk.jobspec.problems import Problem, ValidationFailed
from driversdk.paths import PATH_MAX, check_name, show

# The bundled drivers with a ``state_dir`` option, and where under the data dir theirs is by default
# (not ``plugins/``: that is where Nomad's plugin_dir defaults to, whose entries are plugin binaries).
STATE_DIR_DRIVERS = ("exec", "raw_exec")
DRIVER_STATE_DIR = "driver-state"
# Nomad's client defaults (structs.DefaultMinDynamicPort / DefaultMaxDynamicPort).
DEFAULT_MIN_DYNAMIC_PORT = 20000
DEFAULT_MAX_DYNAMIC_PORT = 32000


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
    # What the node is called and where it is (Nomad's agent ``name``, ``datacenter``, ``region``,
    # ``client.node_class``, ``client.node_pool``, ``client.meta``): ``${node.*}``, ``${meta.*}``.
    name: str = ""
    datacenter: str = "dc1"
    region: str = "global"
    node_class: str = ""
    node_pool: str = "default"
    meta: dict[str, str] = field(default_factory=dict)
    # Nomad's ``client.min_dynamic_port`` / ``max_dynamic_port``: where dynamic ports come from.
    min_dynamic_port: int = DEFAULT_MIN_DYNAMIC_PORT
    max_dynamic_port: int = DEFAULT_MAX_DYNAMIC_PORT
    # Nomad's ``client.reserved { reserved_ports }``: never given to a group, static or dynamic.
    reserved_ports: frozenset[int] = frozenset()
    reserved_ports_text: str = ""
    # Nomad's client garbage collection of terminal allocations (driversdk.agent.allocgc), with
    # Nomad's defaults; gc_interval in seconds.
    gc_max_allocs: int = 50
    gc_disk_usage_threshold: float = 80.0
    gc_inode_usage_threshold: float = 70.0
    gc_interval: float = 60.0
    # What the file holds that the runner has no use for, said once.
    notes: list[str] = field(default_factory=list)

    def driver_command(self, driver: str) -> list[str] | None:
        block = self.plugins.get(driver)
        if block is not None and block.command:
            return list(block.command)
        args = block.command[1:] if block and block.command else []
        if self.plugin_dir:
            candidate = os.path.join(self.plugin_dir, driver)
            if os.access(candidate, os.X_OK):
                return [candidate, *args]
        bundled = bundled_driver(driver)
        return bundled.command() if bundled is not None else None

    def runs_bundled(self, driver: str) -> bool:
        """Whether ``driver`` is one that ships with driversdk, left at its bundled command (not
        replaced by a plugin_dir binary or a ``command`` of the operator's own)."""
        bundled = bundled_driver(driver)
        return bundled is not None and self.driver_command(driver) == bundled.command()

    def plugin_config(self, driver: str) -> dict[str, Any]:
        """The ``config {}`` the plugin is given: the operator's, and for a bundled driver that keeps
        state of its own, ``state_dir`` under the data dir when the operator did not set one (SetConfig's
        agent config carries no data dir, so the host says it in the plugin config)."""
        block = self.plugins.get(driver)
        config = dict(block.config) if block else {}
        if driver in STATE_DIR_DRIVERS and not config.get("state_dir") and self.runs_bundled(driver):
            config["state_dir"] = self.driver_state_dir(driver)
        return config

    def driver_state_dir(self, driver: str) -> str:
        return os.path.join(os.path.abspath(self.data_dir), DRIVER_STATE_DIR, driver)


_PLUGIN_KEYS = {"command", "args", "config"}
_HOST_VOLUME_KEYS = {"path", "read_only"}
# Nomad agent options the runner does not use (command/agent/config.go and its docs).
_AGENT_KEYS = frozenset(
    [
        "region",
        "datacenter",
        "name",
        "log_level",
        "log_json",
        "log_file",
        "log_rotate_duration",
        "log_rotate_bytes",
        "log_rotate_max_files",
        "log_include_location",
        "bind_addr",
        "enable_debug",
        "ports",
        "addresses",
        "advertise",
        "server",
        "acl",
        "audit",
        "consul",
        "vault",
        "telemetry",
        "tls",
        "sentinel",
        "autopilot",
        "ui",
        "limits",
        "leave_on_interrupt",
        "leave_on_terminate",
        "enable_syslog",
        "syslog_facility",
        "disable_update_check",
        "disable_anonymous_signature",
        "http_api_response_headers",
        "reporting",
        "keyring",
        "plugin_dir",
        "data_dir",
        "client",
        "plugin",
        "host_volume",
    ]
)
# Keys Nomad's agent accepts at the top level without using them there: HCL1 reports the keys of
# nested blocks (client.meta, server.retry_join, …) as unknown top-level keys too, so Nomad drops
# these names from its unknown-key check, and a file that writes one at the top level loads (the
# value is ignored). Refusing them would refuse configs that Nomad runs.
_LEAKED_KEYS = frozenset(
    ["options", "meta", "chroot_env", "servers", "server_join", "template", "enabled_schedulers", "start_join",
     "retry_join", "datadog_tags", "license", "service_identity", "task_identity", "default_identity"]
)  # fmt: skip
_CLIENT_KEYS = frozenset(
    [
        "enabled",
        "state_dir",
        "alloc_dir",
        "alloc_mounts_dir",
        "servers",
        "server_join",
        "node_class",
        "node_pool",
        "options",
        "meta",
        "network_interface",
        "preferred_address_family",
        "cpu_total_compute",
        "cpu_disable_dotnet",
        "reservable_cores",
        "memory_total_mb",
        "disk_total_mb",
        "disk_free_mb",
        "reserved",
        "host_volume",
        "host_network",
        "cni_path",
        "cni_config_dir",
        "bridge_network_name",
        "bridge_network_subnet",
        "bridge_network_subnet_ipv6",
        "bridge_network_hairpin_mode",
        "gc_interval",
        "gc_disk_usage_threshold",
        "gc_inode_usage_threshold",
        "gc_max_allocs",
        "gc_parallel_destroys",
        "gc_volumes_on_node_gc",
        "no_host_uuid",
        "artifact",
        "template",
        "chroot_env",
        "max_kill_timeout",
        "drain_on_shutdown",
        "cgroup_parent",
        "disable_remote_exec",
        "min_dynamic_port",
        "max_dynamic_port",
        "network_speed",
        "nomad_service_discovery",
        "host_volumes_dir",
        "host_volume_plugin_dir",
        "common_plugin_dir",
        "cpu_total_compute",
        "users",
        "consul",
        "vault",
        "fingerprint_options",
    ]
)


def _shown(value: Any) -> str:
    return show(value) if isinstance(value, str) else show(repr(value))[1:-1]


def _body(value: Any) -> dict[str, Any] | None:
    """One block's body; None when ``value`` is not a block (``config = 5``)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) for b in value):
        merged: dict[str, Any] = {}
        for block in value:
            merged.update(block)
        return merged
    return None


def hcl1_bool(value: Any) -> bool | None:
    """A bool as Nomad's agent config decoder (HCL1) reads one: true or false, or a string or
    number that says so ("true", "FALSE", "1", 0); None for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str | int) and not isinstance(value, bool):
        text = str(value).strip('"').lower()
        if text in ("1", "true"):
            return True
        if text in ("0", "false"):
            return False
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
    read_only = hcl1_bool(body.get("read_only", False))
    if read_only is None:
        problems.append(
            Problem(
                file,
                f"read_only must be true or false, not {_shown(body.get('read_only'))} (Nomad also reads "
                '"true", "false", 1 and 0)',
                field=where,
            )
        )
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
    return HostVolume(name, path, bool(read_only), resolved)


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


def _labelled(value: Any) -> list[tuple[str, dict[str, Any]]] | None:
    """Labelled blocks as pyhcl reads them ({name: body}, or a list of those when a block type is
    repeated inside another block); None when ``value`` is not blocks (``host_volume = 5``)."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out: list[tuple[str, dict[str, Any]]] = []
    for item in items:
        if not isinstance(item, dict):
            return None
        for label, body in item.items():
            if isinstance(body, list):
                out += [(str(label), b) for b in body if isinstance(b, dict)]
            elif isinstance(body, dict):
                out.append((str(label), body))
            else:
                return None
    return out


def _plugin_options(file: str, name: str, config: dict[str, Any], problems: list[Problem]) -> None:
    """Every option of Nomad's plugin config (docker, exec) is known; others are problems."""
    known = PLUGIN_OPTIONS.get(name)
    if known is None:
        return  # a third-party driver's options are its own business (its schema checks them)

    def walk(body: dict[str, Any], options: dict[str, Any], path: str) -> None:
        for key, value in body.items():
            if key not in options:
                close = get_close_matches(key, list(options), n=1)
                hint = f'; did you mean "{close[0]}"?' if close else "; remove it or check its spelling"
                where = f" in {path}" if path else ""
                problems.append(
                    Problem(
                        file,
                        f'unknown option {key!r}{where} for driver "{name}"{hint}',
                        field=f"plugin {show(name)} config.{path + '.' if path else ''}{key}",
                    )
                )
                continue
            nested = options[key]
            if isinstance(nested, dict):
                for inner in value if isinstance(value, list) else [value]:
                    if isinstance(inner, dict):
                        walk(inner, nested, f"{path}.{key}" if path else key)

    walk(config, known, "")


def _parse(path: str | Path) -> dict[str, Any]:
    """An agent config file read as HCL1, as Nomad reads it (pyhcl's ``hcl.loads``, on the
    process's one parser, its tables cached, and what a text parses to kept for the next command
    that reads it: :mod:`driversdk.jobspec.parsecache`)."""
    from driversdk.jobspec.parsecache import hcl1_loads

    text = read_text(path)
    try:
        data = hcl1_loads(text, keep=True)
    except ImportError as err:
        # pyhcl itself is missing or broken: the runner extra (the caller names it), not the file's fault.
        raise ImportError(f"pyhcl (module 'hcl') does not import: {err}", name="hcl") from err
    except Exception as err:  # pyhcl raises ValueError (and lexer errors) for any syntax problem
        from driversdk.jobspec.hcl.syntax import describe_hcl1

        facts = describe_hcl1(str(err), text)
        where = ":".join(str(p) for p in (path, facts.line, facts.column) if p)
        raise HCLFileError(f"{where}: {facts.sentence()}", str(path), facts.line or 0) from None
    if not isinstance(data, dict):
        raise HCLFileError(f"{path}: this HCL file has no body of arguments and blocks")
    return data


_NODE_KEYS = ("name", "datacenter", "region")
_CLIENT_NODE_KEYS = ("node_class", "node_pool", "meta", "min_dynamic_port", "max_dynamic_port", "reserved")
# Nomad's ``client.reserved`` keys besides reserved_ports: resources a scheduler keeps back.
_RESERVED_UNUSED = ("cpu", "cores", "memory", "disk")


def _node(file: str, data: dict[str, Any], client: dict[str, Any], cfg: ClientConfig, problems: list[Problem]) -> None:
    """The node's name, place and meta, and the dynamic port range, as Nomad's agent reads them."""
    for key, where, source in (
        ("name", "name", data),
        ("datacenter", "datacenter", data),
        ("region", "region", data),
        ("node_class", "client.node_class", client),
        ("node_pool", "client.node_pool", client),
    ):
        value = source.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            problems.append(Problem(file, f"{where} must be a string in quotes, not {_shown(value)}", field=where))
        elif value or key in ("name", "node_class"):
            setattr(cfg, key, value)
    meta = _body(client.get("meta"))
    if meta is None or not all(isinstance(v, str | int | float | bool) for v in meta.values()):
        problems.append(
            Problem(file, 'client.meta must be a block of strings (meta { rack = "r1" })', field="client.meta")
        )
    else:
        cfg.meta = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in meta.items()}
    ports: dict[str, int] = {}
    for key in ("min_dynamic_port", "max_dynamic_port"):
        value = client.get(key)
        if value is None:
            continue
        number = int(value) if isinstance(value, str) and value.isdigit() else value
        if isinstance(number, bool) or not isinstance(number, int) or not 0 < number < 65536:
            problems.append(
                Problem(
                    file, f"client.{key} must be a port number (1-65535), not {_shown(value)}", field=f"client.{key}"
                )
            )
            continue
        ports[key] = number
        setattr(cfg, key, number)
    _reserved(file, client, cfg, problems)
    if cfg.min_dynamic_port > cfg.max_dynamic_port and ports:
        problems.append(
            Problem(
                file,
                f"client.min_dynamic_port ({cfg.min_dynamic_port}) must not be greater than client.max_dynamic_port "
                f"({cfg.max_dynamic_port})",
                field="client.min_dynamic_port",
            )
        )


_GC_KEYS = ("gc_max_allocs", "gc_disk_usage_threshold", "gc_inode_usage_threshold", "gc_interval")


def _gc(file: str, client: dict[str, Any], cfg: ClientConfig, problems: list[Problem]) -> None:
    """The garbage collection options Nomad's client takes (``client { gc_max_allocs = 50 … }``)."""
    from driversdk.durations import parse_duration
    from driversdk.errors import ConfigError

    count = client.get("gc_max_allocs")
    if count is not None:
        number = int(count) if isinstance(count, str) and count.isdigit() else count
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            problems.append(
                Problem(
                    file,
                    f"client.gc_max_allocs must be a number of allocations (1 or more), not {_shown(count)}",
                    field="client.gc_max_allocs",
                )
            )
        else:
            cfg.gc_max_allocs = number
    for key in ("gc_disk_usage_threshold", "gc_inode_usage_threshold"):
        value = client.get(key)
        if value is None:
            continue
        try:
            percent = float(value) if not isinstance(value, bool) else -1.0
        except (TypeError, ValueError):
            percent = -1.0
        if not 0 <= percent <= 100:
            problems.append(
                Problem(file, f"client.{key} must be a percentage (0-100), not {_shown(value)}", field=f"client.{key}")
            )
        else:
            setattr(cfg, key, percent)
    interval = client.get("gc_interval")
    if interval is not None:
        try:
            seconds = parse_duration(interval, "client.gc_interval")
        except ConfigError as err:
            problems.append(Problem(file, str(err), field="client.gc_interval"))
        else:
            if seconds <= 0:
                problems.append(
                    Problem(
                        file,
                        f'client.gc_interval {interval!r} must be more than zero, such as "1m"',
                        field="client.gc_interval",
                    )
                )
            else:
                cfg.gc_interval = seconds


def parse_port_ranges(text: str) -> frozenset[int] | None:
    """Nomad's port list syntax (``"22,80,8500-8600"``) → the ports, or None when it is not one."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        first, dash, last = part.partition("-")
        if not first.strip().isdigit() or (dash and not last.strip().isdigit()):
            return None
        low, high = int(first), int(last) if dash else int(first)
        if not 0 < low <= high <= 65535:
            return None
        out.update(range(low, high + 1))
    return frozenset(out)


def _reserved(file: str, client: dict[str, Any], cfg: ClientConfig, problems: list[Problem]) -> None:
    """``client.reserved``: the ports no group gets; the resources it may also keep back are noted."""
    if client.get("reserved") is None:
        return
    body = _body(client.get("reserved"))
    if body is None:
        problems.append(
            Problem(
                file, 'client.reserved must be a block (reserved { reserved_ports = "22,80" })', field="client.reserved"
            )
        )
        return
    for key in body:
        if key in _RESERVED_UNUSED:
            cfg.notes.append(f"{file}: not used by driversdk: client.reserved.{key}")
        elif key != "reserved_ports":
            close = get_close_matches(key, ["reserved_ports", *_RESERVED_UNUSED], n=1)
            hint = f'; did you mean "{close[0]}"?' if close else "; remove it or check its spelling"
            problems.append(
                Problem(file, f"unknown client.reserved option {key!r}{hint}", field=f"client.reserved.{key}")
            )
    text = body.get("reserved_ports")
    if text is None:
        return
    ports = parse_port_ranges(text) if isinstance(text, str) else None
    if ports is None:
        problems.append(
            Problem(
                file,
                f"client.reserved.reserved_ports must be ports and ranges of 1-65535 in quotes, such as "
                f'"22,80,8500-8600", not {_shown(text)}',
                field="client.reserved.reserved_ports",
            )
        )
        return
    cfg.reserved_ports = ports
    cfg.reserved_ports_text = text


def load_client(path: str | Path | None) -> ClientConfig:
    """Read a client config; every value of the wrong type is refused, never coerced or defaulted."""
    if path is None:
        return ClientConfig()
    file = str(path)
    data = _parse(path)
    problems: list[Problem] = []
    cfg = ClientConfig(file=file)
    unused = []
    for key in data:
        if key in ("data_dir", "plugin_dir", "client", "plugin", "host_volume", *_NODE_KEYS):
            continue
        if key in _AGENT_KEYS or key in _LEAKED_KEYS:
            unused.append(key)
            continue
        close = get_close_matches(key, sorted(_AGENT_KEYS), n=1)
        hint = f'; did you mean "{close[0]}"?' if close else "; remove it or check its spelling"
        problems.append(Problem(file, f"unknown agent option {key!r}{hint}", field=key))
    if "data_dir" in data:
        problem = _absolute(data["data_dir"], "data_dir")
        if problem is not None:
            problems.append(Problem(file, problem, field="data_dir"))
        else:
            cfg.data_dir = data["data_dir"]
    if data.get("plugin_dir") is not None:
        problem = _absolute(data["plugin_dir"], "plugin_dir")
        if problem is not None:
            problems.append(Problem(file, problem, field="plugin_dir"))
        else:
            cfg.plugin_dir = data["plugin_dir"]
    client = _body(data.get("client"))
    if client is None:
        problems.append(
            Problem(file, f"client must be a block (client {{ … }}), not {_shown(data.get('client'))}", field="client")
        )
        client = {}
    for key in client:
        if key in ("host_volume", *_CLIENT_NODE_KEYS, *_GC_KEYS):
            continue
        if key in _CLIENT_KEYS:
            unused.append(f"client.{key}")
            continue
        close = get_close_matches(key, sorted(_CLIENT_KEYS), n=1)
        hint = f'; did you mean "{close[0]}"?' if close else "; remove it or check its spelling"
        problems.append(Problem(file, f"unknown client option {key!r}{hint}", field=f"client.{key}"))
    _node(file, data, client, cfg, problems)
    _gc(file, client, cfg, problems)
    volumes: list[tuple[str, dict[str, Any]]] = []
    for key, blocks in (("host_volume", data.get("host_volume")), ("client.host_volume", client.get("host_volume"))):
        found = _labelled(blocks)
        if found is None:
            problems.append(Problem(file, f'{key} must be blocks (host_volume "<name>" {{ path = … }})', field=key))
        else:
            volumes += found
    plugins = _labelled(data.get("plugin"))
    if plugins is None:
        problems.append(Problem(file, 'plugin must be blocks (plugin "<name>" { … })', field="plugin"))
        plugins = []
    for name, body in volumes:
        volume = _host_volume(file, name, body, problems)
        if volume is not None:
            # As Nomad merges config files: a later host_volume with the same name replaces the earlier.
            cfg.host_volumes[name] = volume
    for name, body in plugins:
        block = _plugin(file, name, body, problems)
        if block is not None:
            _plugin_options(file, name, block.config, problems)
            cfg.plugins[name] = block
    if unused:
        cfg.notes.append(f"{file}: not used by driversdk: {', '.join(unused)}")
    if problems:
        raise ValidationFailed(problems)
    return cfg
