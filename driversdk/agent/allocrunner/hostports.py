"""What holds a port on this host, for :mod:`driversdk.agent.allocrunner.portalloc`.

- :func:`sockets`: the kernel's own socket tables (``/proc/self/net/{tcp,tcp6,udp,udp6}``) of the
  runner's network namespace, the one its forwarding rules live in: a port is held by any TCP or
  UDP socket of any address and family, listening, connected or only bound (a DNS stub on
  127.0.0.53, a listener on ``::1``). A trial bind would miss those: with ``SO_REUSEADDR`` it
  succeeds beside them. A TCP socket in TIME_WAIT holds nothing (no process owns it, and a
  server's next bind succeeds beside it), so a stopped task's port can be taken again at once.
- :func:`locked`: the ports every live ``driversdk run`` on this host has handed out, whatever its
  data dir, in one record under a host-wide lock: a port given to an allocation holds before
  anything listens on it. Entries name the run's pid and its start time, so a dead run's entries
  (or a reused pid) expire by themselves.

The record lives in ``/run/driversdk/ports`` (root's, mode 0700; a user's own dir under the temp
dir otherwise), opened without following symlinks; a dir another user owns is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import stat
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from driversdk.errors import ConfigError

TABLES = (("TCP", "tcp"), ("TCP", "tcp6"), ("UDP", "udp"), ("UDP", "udp6"))
TCP_TIME_WAIT = "06"
HELD = "held.json"


class HostPortsUnsafe(ConfigError):
    """The host-wide port record's directory is not private to this user."""


@dataclass(frozen=True)
class Holder:
    """A socket holding a port: its protocol and address as an operator writes them."""

    proto: str
    address: str


@dataclass(frozen=True)
class Entry:
    """A port a live run handed to one of its allocations."""

    pid: int
    start: int
    alloc: str


def _address(text: str) -> str:
    """An address as /proc/net prints it (32-bit words in host byte order) → ``127.0.0.53`` / ``[::1]``."""
    words = [int(text[i : i + 8], 16) for i in range(0, len(text), 8)]
    packed = b"".join(struct.pack("=I", w) for w in words)
    if len(packed) == 4:
        return str(ipaddress.IPv4Address(packed))
    return f"[{ipaddress.IPv6Address(packed)}]"


def sockets() -> dict[int, Holder]:
    """Every port a TCP or UDP socket holds in this process's network namespace."""
    out: dict[int, Holder] = {}
    for proto, name in TABLES:
        try:
            with open(f"/proc/self/net/{name}") as fh:
                lines = fh.read().splitlines()[1:]
        except FileNotFoundError:
            continue  # a kernel without IPv6
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or (proto == "TCP" and fields[3] == TCP_TIME_WAIT):
                continue
            address, _, port_hex = fields[1].partition(":")
            port = int(port_hex, 16)
            if port and port not in out:
                out[port] = Holder(proto, _address(address))
    return out


# --- the host-wide record -----------------------------------------------------------------------


def record_dir() -> str:
    if os.geteuid() == 0:
        return "/run/driversdk/ports"
    return os.path.join(tempfile.gettempdir(), f"driversdk-{os.geteuid()}", "ports")


def _private(path: str, mode: int) -> None:
    """``path`` a real directory of ours that no one else may write in (made with ``mode``)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise HostPortsUnsafe(
            f"{path}, where driversdk records the ports its runs hand out, is not a directory of this user's "
            "(a symlink, a file or another user's); remove it so driversdk can make its own"
        )
    if stat.S_IMODE(info.st_mode) & ~mode:
        os.chmod(path, mode)  # ours: made private again


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    # Field 22 (starttime), counted after the command name, which may hold spaces and ")".
    return int(text.rsplit(")", 1)[1].split()[19])


def me() -> tuple[int, int]:
    pid = os.getpid()
    return pid, _start_time(pid) or 0


def _alive(entry: Entry) -> bool:
    return _start_time(entry.pid) == entry.start


def _read(dfd: int) -> dict[int, Entry]:
    try:
        fd = os.open(HELD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return {}
    with os.fdopen(fd) as fh:
        try:
            raw = json.load(fh)
        except ValueError:
            return {}  # only we write it, whole, by rename: not reached but by hand
    out: dict[int, Entry] = {}
    if isinstance(raw, dict):
        for port, value in raw.items():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                out[int(port)] = Entry(int(value["pid"]), int(value["start"]), str(value["alloc"]))
    return out


def _write(dfd: int, held: dict[int, Entry]) -> None:
    text = json.dumps({str(p): {"pid": e.pid, "start": e.start, "alloc": e.alloc} for p, e in sorted(held.items())})
    tmp = f"{HELD}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, HELD, src_dir_fd=dfd, dst_dir_fd=dfd)


@contextlib.contextmanager
def locked() -> Iterator[dict[int, Entry]]:
    """The live runs' ports, under the host-wide lock; what the caller leaves in the dict when
    the block ends without an exception is written back."""
    path = record_dir()
    _private(os.path.dirname(path), 0o755)
    _private(path, 0o700)
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        lock = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            read = _read(dfd)
            held = {port: entry for port, entry in read.items() if _alive(entry)}
            yield held
            if held != read:  # dead runs' entries pruned, or the caller's changes
                _write(dfd, held)
        finally:
            os.close(lock)  # releases the flock
    finally:
        os.close(dfd)
