"""The agent's HTTP listeners: a unix socket under the data dir (0600, so only the agent's user,
root here, can talk to it) and, when the agent config asks, a TCP address. Each request is read
into a :class:`Request` and handed to the handler :class:`Listeners` is given (the agent's is
:func:`driversdk.agent.api.routes.handle`); on TCP with ACLs on, a request without a valid token gets
403 before any handler sees it. Nothing here knows a route."""

from __future__ import annotations

import json
import os
import queue
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from driversdk.errors import DriverSDKError

if TYPE_CHECKING:
    from driversdk.agent.agent import Agent

# A request body larger than this is refused (413): a job is kilobytes, not megabytes.
MAX_BODY = 8 * 1024 * 1024


class APIError(DriverSDKError):
    """A request refused with Nomad's status code and a one-sentence body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: bytes
    token: str
    over_tcp: bool
    # Every name=value of the query in order: a name may be given more than once (?topic=a&topic=b).
    pairs: list[tuple[str, str]] = field(default_factory=list)

    def all(self, name: str) -> list[str]:
        return [value for key, value in self.pairs if key == name]

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("true", "1", "yes")

    def json(self) -> Any:
        if not self.body:
            raise APIError(400, "Request body is empty; send the JSON object the endpoint takes")
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as err:
            raise APIError(400, f"Failed to decode request body: {err}") from None


@dataclass
class Response:
    status: int = 200
    body: Any = None  # JSON-able, or bytes sent as they are
    headers: dict[str, str] = field(default_factory=dict)
    stream: Iterator[bytes] | None = None  # sent chunked (logs with follow)
    content_type: str = "application/json"


Handler = Callable[["Agent", Request], Response]


# The scheduling priority (nice) of the threads answering the API. Starting allocations keeps every
# core busy (runc, the plugins, the agent's own start threads: a run queue of 15-20 on two cores
# while a count = 100 job starts), and at the same priority a request waited its turn behind all of
# it, 10-20x its idle time. Only a process with CAP_SYS_NICE may raise a priority; others keep 0.
API_NICE = -10


def _before_the_work() -> None:
    """Put the calling thread ahead of the work the agent drives (its own thread only: Linux keeps
    a nice value per thread)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), API_NICE)
    except OSError:
        pass  # not permitted (not root): answered at the default priority


def _serve(server: socketserver.BaseServer) -> None:
    """The accepting thread; the request threads it starts inherit its priority."""
    _before_the_work()
    server.serve_forever(poll_interval=0.2)


# Threads answering requests at once, at most: a blocking query or a followed log holds one for
# as long as it waits. Past this, a connection waits for a thread to come free.
MOST_REQUEST_THREADS = 512


class _RequestThreads:
    """The threads that answer connections, kept for the next one once they are done.

    A thread started per connection made every request wait for its new thread to be scheduled
    and to take the interpreter lock before a byte was read (the accepting thread waits for that,
    too, before it accepts the next connection): a tenth of a millisecond on an idle agent, and
    milliseconds while allocations start and every core is busy. A kept thread is already waiting
    on the queue. Threads are daemons: an agent stopping does not wait for a blocking query."""

    def __init__(self, most: int = MOST_REQUEST_THREADS) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._count = 0
        self._most = most

    def submit(self, work: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # a kept thread takes it
                grow = False
            else:
                grow = self._count < self._most
                self._count += grow
        self._jobs.put((work, args))
        if grow:
            threading.Thread(target=self._loop, daemon=True, name="http-request").start()

    def _loop(self) -> None:
        while True:
            work, args = self._jobs.get()
            try:
                work(*args)
            except Exception:  # process_request_thread reports its own; nothing may end a kept thread
                pass
            with self._lock:
                self._idle += 1


class _KeptThreadsMixIn(socketserver.ThreadingMixIn):
    """ThreadingMixIn whose connections are answered on kept threads (:class:`_RequestThreads`)."""

    daemon_threads = True
    _threads_kept: _RequestThreads

    def process_request(self, request: Any, client_address: Any) -> None:
        kept = getattr(self, "_threads_kept", None)
        if kept is None:
            kept = self._threads_kept = _RequestThreads()
        kept.submit(self.process_request_thread, request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server_version = "driversdk-agent"
    protocol_version = "HTTP/1.1"
    agent: Agent
    over_tcp = False
    handler: Handler  # what answers a request (set with the agent by Listeners.start)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are not logged line by line; errors are, by the handlers

    def address_string(self) -> str:
        return "unix" if not self.over_tcp else str(self.client_address[0])

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            # Answered, not raised: an exception here would print a traceback into the agent's log.
            self.close_connection = True
            self._send(Response(400, "Content-Length must be a number of bytes"))
            return
        if length > MAX_BODY:
            self._send(Response(413, f"Request body is larger than {MAX_BODY} bytes"))
            return
        body = self.rfile.read(length) if length > 0 else b""
        token = self.headers.get("X-Nomad-Token") or ""
        auth = self.headers.get("Authorization") or ""
        if not token and auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        request = Request(self.command, parts.path, dict(pairs), body, token, self.over_tcp, pairs)
        self._send(self.handler(self.agent, request))

    def _send(self, response: Response) -> None:
        if response.stream is not None:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Transfer-Encoding", "chunked")
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.end_headers()
            try:
                for chunk in response.stream:
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            finally:
                close = getattr(response.stream, "close", None)
                if close is not None:
                    close()
            return
        if isinstance(response.body, bytes):
            data = response.body
        elif isinstance(response.body, str) and response.status >= 400:
            data = response.body.encode()  # Nomad's error bodies are plain text
            response.content_type = "text/plain; charset=utf-8"
        else:
            data = json.dumps(response.body).encode()
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in response.headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _serve


class _UnixHTTPServer(_KeptThreadsMixIn, socketserver.UnixStreamServer):
    allow_reuse_address = False

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, _ = self.socket.accept()
        return conn, ("unix", 0)


class Listeners:
    def __init__(self, agent: Agent, handler: Handler) -> None:
        self.agent = agent
        self.handler = handler
        self._servers: list[socketserver.BaseServer] = []
        self.tcp_address: tuple[str, int] | None = None

    def start(self) -> None:
        settings = self.agent.settings
        answer = staticmethod(self.handler)  # a plain function in the class dict would be bound as a method
        handler = type("UnixHandler", (_Handler,), {"agent": self.agent, "over_tcp": False, "handler": answer})
        path = settings.socket_path
        _remove_stale_socket(path)
        old = os.umask(0o177)  # the socket is born 0600: no moment in which others may connect
        try:
            unix = _UnixHTTPServer(path, handler)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._servers.append(unix)
        if settings.tcp is not None:
            tcp_handler = type("TCPHandler", (_Handler,), {"agent": self.agent, "over_tcp": True, "handler": answer})
            family = socket.AF_INET6 if ":" in settings.tcp.host else socket.AF_INET
            server_class = type("TCPServer", (_KeptThreadsMixIn, ThreadingHTTPServer), {"address_family": family})
            tcp = server_class((settings.tcp.host, settings.tcp.port), tcp_handler)
            self.tcp_address = (str(tcp.server_address[0]), int(tcp.server_address[1]))
            self._servers.append(tcp)
        for server in self._servers:
            threading.Thread(target=_serve, args=(server,), daemon=True, name="http").start()

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        try:
            os.unlink(self.agent.settings.socket_path)
        except FileNotFoundError:
            pass


def _remove_stale_socket(path: str) -> None:
    """A socket left by an agent that was killed: the data dir lock says no agent holds it now."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    import stat

    if not stat.S_ISSOCK(info.st_mode):
        from driversdk.errors import ConfigError

        raise ConfigError(f"{path} exists and is not a socket; remove it so the agent can listen there")
    os.unlink(path)
