"""The plugin side of go-plugin: check the host, listen, handshake, serve until told to stop.

Facts this module must get right (driver-protocol §2 and §6): nothing on stdout before the
handshake line, which is printed only once the server listens; the health service answers
for "plugin"; GRPCController.Shutdown exits promptly; SIGINT is survived with a handler (never
SIG_IGN, which every task process would inherit); task processes never inherit the host's
stdout/stderr pipes; long-lived streams never starve the thread pool.

The server is ``grpc.aio`` on an asyncio event loop in the main thread: an open stream that
waits costs a coroutine, not a thread (driversdk.service runs the driver's synchronous
methods on a bounded pool).
"""

from __future__ import annotations

import contextlib
import grp
import io
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

from driversdk.plugin.handshake import (
    CORE_PROTOCOL_VERSION,
    ENV_CLIENT_CERT,
    ENV_PROTOCOL_VERSIONS,
    ENV_UNIX_SOCKET_DIR,
    ENV_UNIX_SOCKET_GROUP,
    MAGIC_COOKIE_KEY,
    MAGIC_COOKIE_VALUE,
    MAX_UNIX_PATH,
    Handshake,
    negotiate_app_version,
)
from driversdk.plugin.log import configure_plugin_logging, flush_plugin_logging

if TYPE_CHECKING:
    # grpc and the messages are imported at run time only once a host launched us (start-up cost).
    import asyncio

    import grpc
    from google.protobuf import empty_pb2

    from driversdk.pb import grpc_broker_pb2, grpc_controller_pb2, grpc_stdio_pb2

    Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]

log = logging.getLogger("driversdk.plugin")

MAX_MESSAGE_BYTES = 2**31 - 1

NOT_LAUNCHED_BY_HOST = (
    "This binary is a plugin. These are not meant to be executed directly: it is launched by a host "
    "such as a Nomad client (from its plugin_dir) or by driversdk. Please execute the program that "
    "consumes these plugins, which will load any plugins automatically."
)
AUTOMTLS_UNSUPPORTED = (
    "this plugin cannot serve go-plugin AutoMTLS (PLUGIN_CLIENT_CERT is set): go-plugin's P-521 "
    "certificates are beyond grpcio's TLS. Nomad never enables AutoMTLS; launch the plugin without it."
)


def _fail(message: str) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    raise SystemExit(1)


def check_host_environment() -> int:
    """Validate what the host put in our environment; returns the app protocol version."""
    if os.environ.get(MAGIC_COOKIE_KEY) != MAGIC_COOKIE_VALUE:
        _fail(NOT_LAUNCHED_BY_HOST)
    if os.environ.get(ENV_CLIENT_CERT):
        _fail(AUTOMTLS_UNSUPPORTED)
    offered = os.environ.get(ENV_PROTOCOL_VERSIONS)
    version = negotiate_app_version(offered)
    if version is None:
        _fail(
            f"this plugin speaks driver protocol version 2, but the host offered {ENV_PROTOCOL_VERSIONS}="
            f"{offered!r}: there is no version in common; upgrade the host or the plugin"
        )
    return version


class _SocketPlace:
    """Where the unix socket lives, and how to remove everything we created for it."""

    def __init__(self) -> None:
        base = os.environ.get(ENV_UNIX_SOCKET_DIR)
        if base:
            self.private_dir: str | None = None
            handle, path = tempfile.mkstemp(prefix="plugin", dir=base)
            os.close(handle)
            os.unlink(path)
            self.path = path
        else:
            # mkdtemp makes the directory 0700: only our user can reach the socket.
            self.private_dir = tempfile.mkdtemp(prefix="plugin-")
            self.path = os.path.join(self.private_dir, "plugin.sock")
        if len(self.path.encode()) > MAX_UNIX_PATH:
            self.remove()
            _fail(
                f"the plugin socket path {self.path!r} is longer than {MAX_UNIX_PATH} bytes, the unix socket "
                f"limit; set {ENV_UNIX_SOCKET_DIR} to a shorter directory"
            )

    def apply_group(self) -> None:
        group = os.environ.get(ENV_UNIX_SOCKET_GROUP)
        if not group:
            return
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        os.chown(self.path, -1, gid)
        os.chmod(self.path, 0o660)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self.private_dir:
            shutil.rmtree(self.private_dir, ignore_errors=True)


async def _add_go_plugin_services(server: grpc.aio.Server, stop: asyncio.Event) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1.health import aio as health_aio

    from driversdk.pb import (
        grpc_broker_pb2,
        grpc_broker_pb2_grpc,
        grpc_controller_pb2,
        grpc_controller_pb2_grpc,
        grpc_stdio_pb2,
        grpc_stdio_pb2_grpc,
    )

    health_servicer = health_aio.HealthServicer()
    for service in ("plugin", ""):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)

    class Controller(grpc_controller_pb2_grpc.GRPCControllerServicer):
        async def Shutdown(self, request: grpc_controller_pb2.Empty, context: Context) -> grpc_controller_pb2.Empty:
            log.info("shutdown requested by host")
            # Stop only once the reply is on its way, so the host sees a clean answer.
            # (types-grpcio declares the callback as a nominal class no function can match.)
            context.add_done_callback(lambda _: stop.set())  # type: ignore[arg-type]
            return grpc_controller_pb2.Empty()

    class Stdio(grpc_stdio_pb2_grpc.GRPCStdioServicer):
        async def StreamStdio(
            self, request: empty_pb2.Empty, context: Context
        ) -> AsyncIterator[grpc_stdio_pb2.StdioData]:
            # We relay nothing (Nomad discards it); hold the stream open until the host leaves
            # (grpc then cancels this coroutine) or we stop.
            await stop.wait()
            return
            yield grpc_stdio_pb2.StdioData()  # pragma: no cover - makes this an async generator

    class Broker(grpc_broker_pb2_grpc.GRPCBrokerServicer):
        async def StartStream(
            self, request_iterator: AsyncIterator[grpc_broker_pb2.ConnInfo], context: Context
        ) -> AsyncIterator[grpc_broker_pb2.ConnInfo]:
            # Nomad drivers never use the broker: drain what the host sends, answer nothing.
            async for _ in request_iterator:
                pass
            return
            yield grpc_broker_pb2.ConnInfo()  # pragma: no cover - makes this an async generator

    grpc_controller_pb2_grpc.add_GRPCControllerServicer_to_server(Controller(), server)
    grpc_stdio_pb2_grpc.add_GRPCStdioServicer_to_server(Stdio(), server)
    grpc_broker_pb2_grpc.add_GRPCBrokerServicer_to_server(Broker(), server)


def _detach_host_pipes() -> io.TextIOWrapper:
    """Keep the host's stderr for our logs only, and give fds 1 and 2 to /dev/null.

    Any process we start later (a task, a helper) then inherits /dev/null rather than the
    host's pipes, which would otherwise make the host's Kill() hang until that process exits.
    """
    log_fd = os.dup(2)  # os.dup makes the copy non-inheritable
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    stream = io.TextIOWrapper(io.FileIO(log_fd, "w", closefd=True), encoding="utf-8", line_buffering=True)
    sys.stderr = stream
    sys.stdout = stream  # a stray print() becomes a DEBUG line on the host, never a broken handshake
    return stream


def serve_plugin(
    register: Callable[[grpc.aio.Server], None],
    *,
    name: str,
    on_shutdown: Callable[[], None] | None = None,
    on_listening: Callable[[], None] | None = None,
) -> NoReturn:
    """Run a go-plugin gRPC server for a Nomad host and exit when it is done with us.

    ``register`` adds the plugin's own services to the ``grpc.aio`` server before it listens;
    their methods run on the event loop, so anything that blocks must go to a thread.
    ``on_listening`` is called on the loop once the handshake line is out; it must not block.
    """
    app_version = check_host_environment()
    import asyncio

    # The event loop runs in the main thread; grpc's aio server adds only its own few threads.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(_serve(register, name, on_shutdown, app_version, on_listening))
    # Not asyncio.run: its clean-up would wait on tasks and threads of streams the host abandoned,
    # and grpc's threads are not daemons. Everything of ours is already closed.
    os._exit(0)


async def _serve(
    register: Callable[[grpc.aio.Server], None],
    name: str,
    on_shutdown: Callable[[], None] | None,
    app_version: int,
    on_listening: Callable[[], None] | None = None,
) -> None:
    import asyncio

    import grpc

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_sigint() -> None:
        # A Ctrl-C on a foreground host reaches our process group too; only the host decides.
        log.debug("ignoring SIGINT; the host stops plugins with Shutdown or SIGTERM")

    # add_signal_handler installs a real handler (never SIG_IGN, which every task process would
    # inherit) and wakes the loop through its self-pipe however long it has been idle.
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    place = _SocketPlace()
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    try:
        await _add_go_plugin_services(server, stop)
        register(server)
        if server.add_insecure_port(f"unix:{place.path}") == 0:
            _fail(f"the plugin could not listen on unix socket {place.path!r}")
        await server.start()
        place.apply_group()
        # Liveness check: the host dials as soon as it reads the line.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(place.path)
        probe.close()
        line = Handshake(CORE_PROTOCOL_VERSION, app_version, "unix", place.path).format()
        os.write(1, (line + "\n").encode())
    except BaseException:
        await server.stop(0)
        place.remove()
        raise

    _detach_host_pipes()
    configure_plugin_logging(name)
    log.info("plugin started", extra={"address": place.path, "pid": os.getpid()})
    if on_listening is not None:
        on_listening()

    # The host going away is not a reason to stop (a host that was killed reattaches to recover
    # its tasks); only Shutdown or SIGTERM are.
    await stop.wait()
    log.info("plugin stopping")
    if on_shutdown is not None:
        try:
            # The driver's hook is synchronous and may block: the server keeps answering meanwhile.
            await asyncio.to_thread(on_shutdown)
        except Exception:
            log.exception("shutdown hook failed")
    # A short grace: in-flight unary calls finish within it, while the long-lived streams a host
    # keeps open (WaitTask, TaskEvents, Fingerprint) would hold a longer one for nothing.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(1.5):
            await server.stop(grace=0.1)
    place.remove()
    flush_plugin_logging()
    logging.shutdown()
