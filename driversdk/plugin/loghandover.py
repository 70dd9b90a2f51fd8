"""A plugin's log lines go to the host that uses it now, not only to the one that launched it.

go-plugin hands a plugin's stderr to the host that starts it, as a pipe: the host reads the hclog
lines from it. A plugin outlives that host when a later one reattaches to it (a runner recovering
its tasks, or taking over a plugin kept between runs): its lines would then go to a pipe nobody
reads. So a driversdk plugin serving in its own private socket dir also listens there on
:data:`HANDOVER_SOCKET`; a host that reattaches connects and passes, with SCM_RIGHTS, the write end
of a pipe of its own, which the plugin puts in place of its log descriptor. The plugin confirms
with one byte. Only a peer of the plugin's own uid is served (SO_PEERCRED; the dir is 0700 too).

This is a driversdk extension beside the go-plugin protocol: a host that does not know it (Nomad)
never connects, and a host that finds no such socket (another SDK's plugin) keeps the old pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import TextIO

from driversdk.peercred import peer_uid

HANDOVER_SOCKET = "stderr.sock"
# How long a connected host has to send its descriptor.
_RECEIVE_TIMEOUT = 5.0

log = logging.getLogger(__name__)


def handover_path(plugin_socket: str) -> str:
    """Where the plugin whose gRPC socket is ``plugin_socket`` takes a new log pipe."""
    return os.path.join(os.path.dirname(plugin_socket), HANDOVER_SOCKET)


async def serve_log_handover(directory: str, stream: TextIO) -> None:
    """Take new log pipes on ``directory``/stderr.sock until cancelled; ``stream`` is the log
    stream whose descriptor each one replaces (it stays the same object, so every handler keeps
    writing to it)."""
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    path = os.path.join(directory, HANDOVER_SOCKET)
    try:
        listener.bind(path)
        listener.listen(4)
        listener.setblocking(False)
        while True:
            conn, _ = await loop.sock_accept(listener)
            with conn:
                await _take_pipe(loop, conn, stream)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


async def _take_pipe(loop: asyncio.AbstractEventLoop, conn: socket.socket, stream: TextIO) -> None:
    if peer_uid(conn) != os.geteuid():
        log.warning("refused a log handover from another user")
        return
    readable: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(conn.fileno(), wake)
    try:
        async with asyncio.timeout(_RECEIVE_TIMEOUT):
            await readable
        _, fds, _, _ = socket.recv_fds(conn, 1, 1)
    except (TimeoutError, OSError):
        return
    finally:
        loop.remove_reader(conn.fileno())
    if not fds:
        return
    pipe = fds[0]
    try:
        stream.flush()  # what is buffered belongs to the host before
        # In place of the descriptor the stream writes to: every handler keeps its stream.
        os.dup2(pipe, stream.fileno(), inheritable=False)
    finally:
        os.close(pipe)
    with contextlib.suppress(OSError):
        conn.send(b"\x01")
    log.debug("log lines now go to a new host")
