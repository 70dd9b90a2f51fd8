"""The agent's settings: the client config (``data_dir``, ``client {}``, ``plugin {}``) plus what
Nomad's agent file says about its HTTP listener and ACLs (``bind_addr``, ``addresses { http }``,
``ports { http }``, ``acl { enabled }``), read from the same file.

The API listens on a unix socket under the data dir (0600) always; a TCP listener only when the
file asks for one. Without ACLs a TCP listener is refused unless it is on a loopback address and
the operator says so (``-allow-unauthenticated-loopback``): anyone who can reach the port could
otherwise run any command as the agent's user.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from driversdk.errors import ConfigError
from driversdk.jobspec.clientconfig import ClientConfig, load_client

# Nomad's default HTTP port.
DEFAULT_HTTP_PORT = 4646
SOCKET_NAME = "agent.sock"


class AgentConfigError(ConfigError):
    """The agent config asks for a listener or an ACL setting the agent cannot give."""


@dataclass(frozen=True)
class TCPListener:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass
class AgentSettings:
    client: ClientConfig
    tcp: TCPListener | None = None
    acl_enabled: bool = False
    dev: bool = False
    # A dev agent's data dir is its own, made for it and removed when it exits.
    ephemeral_data_dir: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def data_dir(self) -> str:
        return self.client.data_dir

    @property
    def socket_path(self) -> str:
        return os.path.join(self.client.data_dir, SOCKET_NAME)

    def check(self, allow_unauthenticated_loopback: bool) -> None:
        """Refuse a TCP listener anyone could use to run commands on this node."""
        if self.tcp is None or self.acl_enabled:
            return
        if not self.tcp.loopback:
            raise AgentConfigError(
                f"the HTTP API would listen on {self.tcp.host}:{self.tcp.port} without ACLs, and anyone who can reach "
                "it could run any job on this node; add acl { enabled = true } to the agent config, or listen on "
                "127.0.0.1 only"
            )
        if not allow_unauthenticated_loopback:
            raise AgentConfigError(
                f"the HTTP API would listen on {self.tcp.host}:{self.tcp.port} without ACLs, where every local user "
                "could run jobs as the agent's user; add acl { enabled = true } to the agent config, or start the "
                "agent with -allow-unauthenticated-loopback if every local user may"
            )


def dev_data_dir() -> str:
    """Where a ``-dev`` agent keeps its state: a directory of this user's under the temp dir, the
    same path each time so the CLI finds the dev agent's socket without being told."""
    return os.path.join(tempfile.gettempdir(), f"driversdk-dev-{os.getuid()}")


def load_settings(path: str | None, *, dev: bool = False) -> AgentSettings:
    """The agent's settings from its config file (none: defaults; ``dev``: the dev agent's)."""
    client = load_client(path) if path is not None else ClientConfig()
    settings = AgentSettings(client=client, dev=dev)
    if dev and (path is None or not _sets_data_dir(path)):
        client.data_dir = dev_data_dir()
        settings.ephemeral_data_dir = True
    if path is not None:
        _http_settings(path, settings)
    return settings


def _sets_data_dir(path: str) -> bool:
    from driversdk.jobspec.clientconfig import _parse

    return "data_dir" in _parse(path)


def _single(value: Any) -> dict[str, Any]:
    """A block as pyhcl gives it: a dict, or a list of one dict per occurrence (merged, later wins)."""
    if isinstance(value, list):
        merged: dict[str, Any] = {}
        for item in value:
            if isinstance(item, dict):
                merged.update(item)
        return merged
    return value if isinstance(value, dict) else {}


def _http_settings(path: str, settings: AgentSettings) -> None:
    from driversdk.jobspec.clientconfig import _parse

    data = _parse(path)
    addresses = _single(data.get("addresses"))
    ports = _single(data.get("ports"))
    acl = _single(data.get("acl"))
    enabled = acl.get("enabled", False)
    if not isinstance(enabled, bool):
        raise AgentConfigError(f"{path}: acl.enabled must be true or false, not {enabled!r}")
    settings.acl_enabled = enabled
    host = addresses.get("http", data.get("bind_addr"))
    port = ports.get("http")
    if host is None and port is None:
        return  # no TCP listener asked for: the unix socket only
    if host is None:
        host = "127.0.0.1"
    if not isinstance(host, str) or not host:
        raise AgentConfigError(f"{path}: addresses.http (or bind_addr) must be an address in quotes, not {host!r}")
    if port is None:
        port = DEFAULT_HTTP_PORT
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise AgentConfigError(f"{path}: ports.http must be a port number (0-65535), not {port!r}")
    settings.tcp = TCPListener(host, port)
