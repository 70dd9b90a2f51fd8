"""The engine reads a fingerprint makes, straight over the engine's unix socket.

A fingerprint asks the engine three things (``GET /version``, ``/info``, ``/networks/bridge``) and
the health watcher pings it; none of that needs the docker SDK, which a plugin then does not have
to load before its first fingerprint (``driversdk validate`` never needs it). This speaks the
same HTTP/1.1 the SDK speaks over the same socket, with the standard library's client.

Only a local unix socket is probed this way, as the SDK would reach it (the plugin config's
``endpoint``, else ``DOCKER_HOST``, else ``/var/run/docker.sock``); an engine behind TCP, TLS or
SSH is fingerprinted through the SDK, which knows those transports.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from driversdk.errors import DriverError

DEFAULT_SOCKET = "/var/run/docker.sock"
UNIX_SCHEME = "unix://"


class ProbeError(DriverError):
    """The engine did not answer, or answered with an error status (the fingerprint reports it
    as an undetected or unhealthy engine, as it does when the SDK cannot reach it)."""


def engine_socket(endpoint: str | None, environ: Mapping[str, str]) -> str | None:
    """The unix socket the SDK would reach the engine on; None for any other transport."""
    target = endpoint or environ.get("DOCKER_HOST", "") or UNIX_SCHEME + DEFAULT_SOCKET
    if not target.startswith(UNIX_SCHEME):
        return None
    path = target[len(UNIX_SCHEME) :]
    return path if path.startswith("/") else None


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class EngineProbe:
    """``version()``, ``info()``, ``inspect_network()`` and ``ping()`` as the SDK's APIClient has
    them, for :func:`drivers.docker.fingerprint.fingerprint` and the health watcher."""

    def __init__(self, socket_path: str, timeout: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def _get(self, path: str) -> bytes:
        conn = _UnixHTTPConnection(self.socket_path, self.timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as err:
            raise ProbeError(f"GET {path} on {self.socket_path}: {err}") from None
        finally:
            conn.close()
        if response.status != 200:
            raise ProbeError(f"GET {path} on {self.socket_path}: {response.status} {body[:200]!r}")
        return body

    def _json(self, path: str) -> dict[str, Any]:
        try:
            value = json.loads(self._get(path))
        except ValueError as err:
            raise ProbeError(f"GET {path} on {self.socket_path}: not JSON ({err})") from None
        if not isinstance(value, dict):
            raise ProbeError(f"GET {path} on {self.socket_path}: not a JSON object")
        return value

    def version(self) -> dict[str, Any]:
        return self._json("/version")

    def info(self) -> dict[str, Any]:
        return self._json("/info")

    def inspect_network(self, name: str) -> dict[str, Any]:
        return self._json("/networks/" + quote(name, safe=""))

    def ping(self) -> bool:
        return self._get("/_ping") == b"OK"
