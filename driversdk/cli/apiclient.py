"""The CLI's client of the agent's HTTP API: stdlib only (no grpc, no HCL), so a command that
talks to the agent loads nothing else.

The agent is found as Nomad's CLI finds it: ``-address`` or ``NOMAD_ADDR`` (``http://host:port``,
``https://…`` or ``unix:///path/to/agent.sock``), ``-token`` or ``NOMAD_TOKEN`` sent as
``X-Nomad-Token``; with neither, the local agent's socket: ``agent.sock`` in the data dir (the
client config's, ``/var/lib/driversdk`` by default), then the dev agent's.
"""

from __future__ import annotations

import _socket
import json
import os
import stat

from driversdk.errors import DriverSDKError

# Not typing.TYPE_CHECKING: a verb's whole run is a few milliseconds, typing ~2 of them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any
    from urllib.parse import SplitResult

DEFAULT_DATA_DIR = "/var/lib/driversdk"
SOCKET_NAME = "agent.sock"
# An answer's head (status line and headers) larger than this is not the agent's.
MAX_HEAD = 64 * 1024


class AgentUnreachable(DriverSDKError):
    """No agent answers at the address."""


class APIRequestError(DriverSDKError):
    """The agent refused a request: its status code and its one-sentence answer."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def _temp_dir() -> str:
    """The temp dir as Python's tempfile chooses it (TMPDIR, TEMP, TMP, else /tmp), without
    importing tempfile: a CLI verb's whole run is a few milliseconds."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = os.environ.get(name)
        if value and os.path.isdir(value):
            return os.path.abspath(value)
    return "/tmp"


def local_socket(data_dir: str | None = None) -> str | None:
    """The local agent's socket when one exists: the data dir's, else the dev agent's."""
    candidates = [os.path.join(data_dir or DEFAULT_DATA_DIR, SOCKET_NAME),
                  os.path.join(_temp_dir(), f"driversdk-dev-{os.getuid()}", SOCKET_NAME)]  # fmt: skip
    for path in candidates:
        if os.path.exists(path) and _ours_alone(os.path.dirname(path)):
            return path
    return None


def _ours_alone(folder: str) -> bool:
    """Whether a socket's directory is a real directory of this user that no one else may write:
    the dev agent's sits in the shared temp dir, where another user could have planted a socket
    of their own to receive this user's jobs and token."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


class _Response:
    """One HTTP/1.1 answer read off a socket: status, headers, and the body as it arrives
    (Content-Length, chunked, or until the agent closes)."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        head = self._until(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise OSError(f"not an HTTP answer: {lines[0][:80]!r}")
        self.status = int(parts[1])
        self.headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self._buffer += data
        return bool(data)

    def _until(self, mark: bytes) -> bytes:
        while mark not in self._buffer:
            if len(self._buffer) > MAX_HEAD or not self._fill():
                raise OSError("the agent closed the connection before answering")
        head, _, self._buffer = self._buffer.partition(mark)
        return head

    def chunks(self) -> Iterator[bytes]:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self._until(b"\r\n").split(b";")[0] or b"0", 16)
                if size == 0:
                    return
                while len(self._buffer) < size + 2:
                    if not self._fill():
                        raise OSError("the agent closed the connection in the middle of an answer")
                yield self._buffer[:size]
                self._buffer = self._buffer[size + 2 :]
        length = self.headers.get("content-length")
        if length is not None:
            left = int(length)
            while len(self._buffer) < left:
                if not self._fill():
                    raise OSError("the agent closed the connection in the middle of an answer")
            yield self._buffer[:left]
            return
        while True:
            if self._buffer:
                yield self._buffer
                self._buffer = b""
            if not self._fill():
                return

    def read(self) -> bytes:
        return b"".join(self.chunks())


class AgentClient:
    def __init__(self, address: str, token: str = "", timeout: float | None = 30.0) -> None:
        self.address = address  # http://host:port, https://…, or unix:///path
        self.token = token
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"AgentClient({self.address!r})"  # never the token

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

    def _connect(self, timeout: float | None) -> tuple[_socket.socket, str]:
        """A connected socket and the Host header for it.

        The C module's socket (``_socket``): the ``socket`` module around it builds its enums at
        import, ~2 ms of a verb; only TLS (``ssl``) needs the wrapper."""
        parts = _split(self.address)
        if parts.scheme == "unix":
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            target: Any = parts.path
            host = "localhost"
        elif parts.scheme in ("http", "https"):
            port = parts.port or 4646
            host = f"{parts.hostname or '127.0.0.1'}:{port}"
            infos = _socket.getaddrinfo(parts.hostname or "127.0.0.1", port, 0, _socket.SOCK_STREAM)
            family, _, _, _, target = infos[0]
            if parts.scheme == "https":
                return self._connect_tls(family, target, parts.hostname, timeout), host
            sock = _socket.socket(family, _socket.SOCK_STREAM)
        else:
            raise AgentUnreachable(f"agent address {self.address!r} must start with http://, https:// or unix://")
        sock.settimeout(timeout)
        try:
            sock.connect(target)
        except BaseException:
            sock.close()
            raise
        return sock, host

    @staticmethod
    def _connect_tls(family: int, target: Any, hostname: str | None, timeout: float | None) -> _socket.socket:
        # Only for an agent behind TLS: ssl (and the socket module it wraps) cost a verb more than its work.
        import socket
        import ssl

        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(target)
            return ssl.create_default_context().wrap_socket(sock, server_hostname=hostname)
        except BaseException:
            sock.close()
            raise

    def _open(
        self, method: str, path: str, query: dict[str, Any] | None, body: Any, timeout: float | None
    ) -> _Response:
        url = path + ("?" + _query_string(query) if query else "")
        data = json.dumps(body).encode() if body is not None else b""
        try:
            sock, host = self._connect(timeout)
        except OSError as err:
            raise AgentUnreachable(
                f"cannot reach the driversdk agent at {self.address}: {err.strerror or err}; is it running?"
            ) from None
        head = [f"{method} {url} HTTP/1.1", f"Host: {host}", "Connection: close", "User-Agent: driversdk",
                f"Content-Length: {len(data)}", "Content-Type: application/json"]  # fmt: skip
        if self.token:
            head.append(f"X-Nomad-Token: {self.token}")
        try:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
            response = _Response(sock)
        except OSError as err:
            sock.close()
            raise AgentUnreachable(
                f"cannot reach the driversdk agent at {self.address}: {err.strerror or err}; is it running?"
            ) from None
        if response.status >= 400:
            try:
                text = response.read().decode("utf-8", "replace").strip()
            finally:
                sock.close()
            raise APIRequestError(response.status, text or f"the agent answered {response.status}")
        return response

    def request(
        self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None, *,
        timeout: float | None = None,
    ) -> tuple[Any, int]:  # fmt: skip
        """One call: the decoded JSON answer and the agent's index (X-Nomad-Index)."""
        response = self._open(method, path, query, body, timeout or self.timeout)
        try:
            data = response.read()
        finally:
            response.sock.close()
        return (json.loads(data) if data else None), int(response.headers.get("x-nomad-index") or 0)

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query or None)[0]

    def stream(self, path: str, **query: Any) -> Iterator[bytes]:
        """The body as it arrives (a followed log)."""
        response = self._open("GET", path, query or None, None, None)
        try:
            yield from response.chunks()
        finally:
            response.sock.close()


class _UnixAddress:
    """A ``unix:///path`` address as urlsplit reads it: the scheme and the path."""

    scheme = "unix"
    hostname: str | None = None
    port: int | None = None

    def __init__(self, path: str) -> None:
        self.path = path


# What urlsplit would change or cut in an address: leading blanks and control characters, tab and
# newlines, a query or fragment; an address with none of them is read here without urllib.
_URL_SPECIAL = frozenset("?#\t\r\n")


def _split(address: str) -> SplitResult | _UnixAddress:
    """``urlsplit(address)``; a plain ``unix:///path`` without importing urllib (~2 ms of a verb)."""
    if address.startswith("unix:///") and not _URL_SPECIAL.intersection(address):
        return _UnixAddress(address[len("unix://") :])
    from urllib.parse import urlsplit

    return urlsplit(address)


# Characters quote() never escapes: an id made of them alone is its own path segment.
_ALWAYS_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def quote_segment(text: str) -> str:
    """``urllib.parse.quote(text, safe="")``, without importing urllib for an id that needs no escape."""
    if _ALWAYS_SAFE.issuperset(text):
        return text
    from urllib.parse import quote

    return quote(text, safe="")


def _query_string(query: dict[str, Any]) -> str:
    """``urlencode`` of the items that are not None; without importing urllib when no key or value
    needs escaping (ids, numbers, flags)."""
    pairs = []
    for key, value in query.items():
        if value is None:
            continue
        text = value if isinstance(value, str) else str(value) if isinstance(value, int) else None
        if text is None or not (_ALWAYS_SAFE.issuperset(key) and _ALWAYS_SAFE.issuperset(text)):
            from urllib.parse import urlencode

            return urlencode({k: v for k, v in query.items() if v is not None})
        pairs.append(f"{key}={text}")
    return "&".join(pairs)


def job_path(job_id: str) -> str:
    return "/v1/job/" + quote_segment(job_id)
