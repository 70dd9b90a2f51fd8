"""Who is at the other end of a unix socket: the kernel's SO_PEERCRED, which a peer cannot forge.

For a connection to a listening socket, the kernel records the credentials of the process that
called listen(): the pid and uid of whoever serves the socket, whatever the path led to."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class PeerCred:
    pid: int
    uid: int
    gid: int


def peer_cred(sock: socket.socket) -> PeerCred:
    """The pid, uid and gid of the process at the other end of the connected unix socket ``sock``."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return PeerCred(int(pid), int(uid), int(gid))
