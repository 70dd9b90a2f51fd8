"""The CLI's client of the agent's HTTP API: stdlib only (no grpc, no HCL), so a command that
talks to the agent loads nothing else.

The agent is found as Nomad's CLI finds it: ``-address`` or ``NOMAD_ADDR`` (``http://host:port``,
``https://…`` or ``unix:///path/to/agent.sock``), ``-token`` or ``NOMAD_TOKEN`` sent as
``X-Nomad-Token``; with neither, the local agent's socket: ``agent.sock`` in the data dir (the
client config's, ``/var/lib/driversdk`` by default), then the dev agent's.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from driversdk.errors import DriverSDKError

DEFAULT_DATA_DIR = "/var/lib/driversdk"
SOCKET_NAME = "agent.sock"


class AgentUnreachable(DriverSDKError):
    """No agent answers at the address."""


class APIRequestError(DriverSDKError):
    """The agent refused a request: its status code and its one-sentence answer."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def local_socket(data_dir: str | None = None) -> str | None:
    """The local agent's socket when one exists: the data dir's, else the dev agent's."""
    candidates = [os.path.join(data_dir or DEFAULT_DATA_DIR, SOCKET_NAME),
                  os.path.join(tempfile.gettempdir(), f"driversdk-dev-{os.getuid()}", SOCKET_NAME)]  # fmt: skip
    for path in candidates:
        if os.path.exists(path):
            return path
    return None


@dataclass
class AgentClient:
    address: str  # http://host:port, https://…, or unix:///path
    token: str = ""
    timeout: float | None = 30.0

    @classmethod
    def find(cls, address: str | None = None, token: str | None = None, data_dir: str | None = None) -> AgentClient:
        """The agent the command talks to (see the module's docstring); AgentUnreachable when
        no address is given and no local socket exists."""
        address = address or os.environ.get("NOMAD_ADDR") or ""
        if not address:
            path = local_socket(data_dir)
            if path is None:
                raise AgentUnreachable(
                    "no driversdk agent is running here (no agent.sock in the data dir); start one with "
                    "`driversdk agent -config FILE` (or `driversdk agent -dev`), or set NOMAD_ADDR"
                )
            address = "unix://" + path
        return cls(address, token if token is not None else os.environ.get("NOMAD_TOKEN", ""))

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        parts = urlsplit(self.address)
        if parts.scheme == "unix":
            return _UnixConnection(parts.path, timeout)
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname or "127.0.0.1", parts.port or 4646, timeout=timeout)
        if parts.scheme == "http":
            return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 4646, timeout=timeout)
        raise AgentUnreachable(f"agent address {self.address!r} must start with http://, https:// or unix://")

    def _open(
        self, method: str, path: str, query: dict[str, Any] | None, body: Any, timeout: float | None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        url = path + ("?" + urlencode({k: v for k, v in query.items() if v is not None}) if query else "")
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["X-Nomad-Token"] = self.token
        data = json.dumps(body).encode() if body is not None else None
        connection = self._connection(timeout)
        try:
            connection.request(method, url, body=data, headers=headers)
            response = connection.getresponse()
        except OSError as err:
            connection.close()
            raise AgentUnreachable(
                f"cannot reach the driversdk agent at {self.address}: {err.strerror or err}; is it running?"
            ) from None
        if response.status >= 400:
            text = response.read().decode("utf-8", "replace").strip()
            connection.close()
            raise APIRequestError(response.status, text or f"the agent answered {response.status}")
        return connection, response

    def request(
        self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None, *,
        timeout: float | None = None,
    ) -> tuple[Any, int]:  # fmt: skip
        """One call: the decoded JSON answer and the agent's index (X-Nomad-Index)."""
        connection, response = self._open(method, path, query, body, timeout or self.timeout)
        try:
            data = response.read()
            index = int(response.headers.get("X-Nomad-Index") or 0)
        finally:
            connection.close()
        return (json.loads(data) if data else None), index

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query or None)[0]

    def stream(self, path: str, **query: Any) -> Iterator[bytes]:
        """The body as it arrives (a followed log)."""
        connection, response = self._open("GET", path, query or None, None, None)
        try:
            while chunk := response.read1(65536):
                yield chunk
        finally:
            connection.close()


def job_path(job_id: str) -> str:
    return "/v1/job/" + quote(job_id, safe="")
