"""What the run client and the run server say to each other, and where they meet.

One unix stream socket per process context (driversdk.codeid.context_key), in the user's private
cache dir. Each message is a 4-byte big-endian length and a JSON object. The client's request
carries its stdin, stdout, stderr and working directory as file descriptors (SCM_RIGHTS) with the
first message; the run's own process answers with its pid, then its exit. The server adds the
exit of a run that was killed by a signal (which could not say so itself).

Only the standard library's small modules: the client loads this before anything else.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from typing import Any

from driversdk.errors import DriverSDKError

PROTOCOL = 1
# Request fields: "protocol", "key" (the client's context key), "argv0", "argv", "env", "umask";
# or "protocol" and "stop": true, which makes the server take no new run and exit after its runs.
FDS = 4  # stdin, stdout, stderr, the working directory (an O_PATH|O_DIRECTORY descriptor)
MAX_MESSAGE = 4 << 20  # an environment is rarely above 100 KiB; anything this big is refused
MAX_UNIX_PATH = 107


class WireError(DriverSDKError):
    """A message that is not one of ours (truncated, too large, not JSON)."""


def socket_path(directory: str, key: str) -> str | None:
    """The socket of the server for ``key`` in ``directory``; None when the path cannot be a unix
    socket's (too long)."""
    path = os.path.join(directory, f"run-{key[:32]}.sock")
    return path if len(os.fsencode(path)) <= MAX_UNIX_PATH else None


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    body = json.dumps(message).encode()
    frame = struct.pack(">I", len(body)) + body
    if fds:
        sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(frame)


def receive(sock: socket.socket, want_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors that came with it; (None, []) at end of stream. Raises
    WireError for anything malformed (descriptors received are closed first)."""
    fds: list[int] = []
    header = b""
    while len(header) < 4:
        space = socket.CMSG_SPACE(want_fds * array.array("i").itemsize) if want_fds and not fds else 0
        data, ancillary, _, _ = sock.recvmsg(4 - len(header), space)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                fds.extend(got)
        if not data:
            _close(fds)
            if header:
                raise WireError("the message ended inside its length")
            return None, []
        header += data
    (length,) = struct.unpack(">I", header)
    if length > MAX_MESSAGE:
        _close(fds)
        raise WireError(f"a message of {length} bytes is larger than {MAX_MESSAGE}")
    body = bytearray()
    while len(body) < length:
        chunk = sock.recv(min(length - len(body), 1 << 16))
        if not chunk:
            _close(fds)
            raise WireError("the message ended early")
        body += chunk
    try:
        message = json.loads(body)
    except ValueError as err:
        _close(fds)
        raise WireError(f"the message is not JSON: {err}") from None
    if not isinstance(message, dict):
        _close(fds)
        raise WireError("the message is not a JSON object")
    return message, fds


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def stop_servers(directory: str) -> int:
    """Ask every run server listening in ``directory`` to stop (after the runs it has under way);
    the number asked."""
    asked = 0
    try:
        names = [n for n in os.listdir(directory) if n.startswith("run-") and n.endswith(".sock")]
    except OSError:
        return 0
    for name in names:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(5)
            sock.connect(os.path.join(directory, name))
            send(sock, {"protocol": PROTOCOL, "stop": True})
            asked += 1
        except OSError:
            pass
        finally:
            sock.close()
    return asked
