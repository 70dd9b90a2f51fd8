"""Who is at the other end of a unix socket: the kernel's SO_PEERCRED, which a peer cannot forge.

Our private sockets (a plugin's, the run server's) are only ever served and used by our own user;
the directories they live in are meant to keep everyone else out, and this is checked as well."""

from __future__ import annotations

import socket
import struct

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of the connected unix socket ``sock``."""
    _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(uid)
