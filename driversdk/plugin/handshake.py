"""The go-plugin handshake: the constants a Nomad host and its plugins agree on, and the line.

The plugin prints one line on stdout once its gRPC server listens:
``CORE|APP|NETWORK|ADDRESS|PROTOCOL[|SERVERCERT]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from driversdk.errors import HandshakeError

MAGIC_COOKIE_KEY = "NOMAD_PLUGIN_MAGIC_COOKIE"
MAGIC_COOKIE_VALUE = "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255"
CORE_PROTOCOL_VERSION = 1
# Nomad's driver protocol version (1 was the pre-0.9 net/rpc executor).
APP_PROTOCOL_VERSION = 2
# Nomad's plugin API version for drivers; PluginInfo must list it.
DRIVER_API_VERSION = "v0.1.0"
PROTOCOL_GRPC = "grpc"

ENV_PROTOCOL_VERSIONS = "PLUGIN_PROTOCOL_VERSIONS"
ENV_UNIX_SOCKET_DIR = "PLUGIN_UNIX_SOCKET_DIR"
ENV_UNIX_SOCKET_GROUP = "PLUGIN_UNIX_SOCKET_GROUP"
ENV_CLIENT_CERT = "PLUGIN_CLIENT_CERT"
ENV_MIN_PORT = "PLUGIN_MIN_PORT"
ENV_MAX_PORT = "PLUGIN_MAX_PORT"
# Ours, not go-plugin's: set to "1" on a plugin a host launches only to ask for its schemas, its
# config and a fingerprint (`driversdk validate`), never to start a task. A driver may then skip
# warming up what only tasks need; a task call that comes anyway still works, only slower.
ENV_CHECKS_ONLY = "DRIVERSDK_PLUGIN_CHECKS_ONLY"

# sun_path is 108 bytes including the terminating NUL.
MAX_UNIX_PATH = 107


@dataclass(frozen=True)
class Handshake:
    core_version: int
    app_version: int
    network: str
    address: str
    protocol: str = PROTOCOL_GRPC
    server_cert: str = ""

    def format(self) -> str:
        """The line a plugin prints (without the newline); no sixth field unless a cert is set."""
        fields = [str(self.core_version), str(self.app_version), self.network, self.address, self.protocol]
        if self.server_cert:
            fields.append(self.server_cert)
        return "|".join(fields)

    @classmethod
    def parse(cls, line: str, *, accepted_versions: tuple[int, ...] = (APP_PROTOCOL_VERSION,)) -> Handshake:
        """Parse and check a plugin's handshake line the way go-plugin's host does."""
        text = line.strip()
        parts = text.split("|")
        if len(parts) < 4:
            raise HandshakeError(
                f"unrecognized remote plugin message {text[:200]!r}: this usually means the program is not a "
                "plugin, or it printed to stdout before the handshake"
            )
        try:
            core = int(parts[0])
            app = int(parts[1])
        except ValueError:
            raise HandshakeError(
                f"unrecognized remote plugin message {text[:200]!r}: the protocol versions are not numbers"
            ) from None
        if core != CORE_PROTOCOL_VERSION:
            raise HandshakeError(
                f"incompatible core API version with plugin: plugin speaks {core}, host speaks {CORE_PROTOCOL_VERSION}"
            )
        if app not in accepted_versions:
            raise HandshakeError(
                f"incompatible API version with plugin: plugin chose {app}, host accepts "
                f"{', '.join(map(str, accepted_versions))}"
            )
        network, address = parts[2], parts[3]
        if network not in ("unix", "tcp"):
            raise HandshakeError(f"plugin offered an unknown network {network!r}; expected unix or tcp")
        protocol = parts[4] if len(parts) > 4 and parts[4] else "netrpc"
        if protocol != PROTOCOL_GRPC:
            raise HandshakeError(
                f"plugin speaks protocol {protocol!r}, but only {PROTOCOL_GRPC!r} is allowed (Nomad drivers are gRPC)"
            )
        cert = parts[5] if len(parts) > 5 else ""
        return cls(core, app, network, address, protocol, cert)


def negotiate_app_version(env_value: str | None) -> int | None:
    """Pick our app protocol version from the host's list; None when there is none in common."""
    if not env_value:
        # go-plugin treats a missing list as "the handshake's own version".
        return APP_PROTOCOL_VERSION
    offered = set()
    for item in env_value.split(","):
        item = item.strip()
        if item.isdigit():
            offered.add(int(item))
    return APP_PROTOCOL_VERSION if APP_PROTOCOL_VERSION in offered else None
