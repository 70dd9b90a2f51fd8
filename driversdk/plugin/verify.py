"""Whether a recorded plugin is still the process its host launched, before a byte is sent to it.

A reattach record (pid, process start time, socket path) outlives the plugin it names: the plugin
may have exited, its pid may have been reused, its socket dir removed and made again by someone
else, the path swapped for a symlink. Reattaching hands the listener task handles (task config,
environment, credentials), so the listener must be proved to be the very process that was
launched, by facts the kernel gives and nobody else can change:

- the pid is ours to signal (EPERM: another user's process, never ours), runs with our uid (root
  may signal anyone, so its credentials are read too) and started at the recorded time (field 22
  of ``/proc/<pid>/stat``), so it is not a reused pid;
- every directory on the way to the socket is walked with ``O_PATH|O_NOFOLLOW``, none a symlink,
  none writable by another user unless sticky (as /tmp), the last a directory of ours, mode 0700,
  holding a socket of ours;
- the listener at that socket, by SO_PEERCRED, is that pid and our uid;
- the path dialled (for the check and by gRPC, which may dial again) goes through the descriptor
  of the directory that was checked, ``/proc/self/fd/<fd>/<name>``: a rename or a new directory at
  the recorded path after the check changes nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from dataclasses import dataclass

from driversdk.errors import PluginError
from driversdk.plugin.reattach import ReattachConfig


class PluginGone(PluginError):
    """The recorded plugin process has exited, or no longer serves its socket: launch a new one."""


class ReattachRefused(PluginError):
    """A recorded plugin is not provably the process its host launched: nothing is sent to it."""


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (field 22 of /proc/<pid>/stat); None when
    there is no such process. The comm field may hold spaces and parentheses: the fields are read
    after its last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text.rsplit(b")", 1)[-1].split()
    # fields[0] is field 3 (state), so field 22 is fields[19].
    return int(fields[19]) if len(fields) > 19 else None


@dataclass
class CheckedSocket:
    """The socket of a verified plugin, reachable only through the checked directory's descriptor;
    :meth:`close` once the channel dialled through :attr:`path` is closed."""

    dir_fd: int
    name: str

    @property
    def path(self) -> str:
        return f"/proc/self/fd/{self.dir_fd}/{self.name}"

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


def _process_uids(pid: int) -> tuple[int, ...] | None:
    """The real, effective, saved and filesystem uids of ``pid`` (/proc/<pid>/status), or None."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return tuple(int(u) for u in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None


def _process_is_ours(config: ReattachConfig, name: str) -> None:
    pid = config.pid
    reused = (
        f"refused to reattach to plugin {name!r}: process {pid} belongs to another user, so it is not the plugin "
        "this host launched (its pid was reused)"
    )
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise PluginGone(f"cannot reattach to plugin {name!r}: process {pid} is gone; launch it again") from None
    except PermissionError:  # never alive-and-ours: a process of ours is ours to signal
        raise ReattachRefused(reused) from None
    # root may signal anyone: whose process it is comes from its credentials.
    uids = _process_uids(pid)
    if uids is None:
        raise PluginGone(f"cannot reattach to plugin {name!r}: process {pid} is gone; launch it again")
    if any(uid != os.geteuid() for uid in uids):
        raise ReattachRefused(reused)
    started = process_start_time(pid)
    if started is None:
        raise PluginGone(f"cannot reattach to plugin {name!r}: process {pid} is gone; launch it again")
    if config.start_time and started != config.start_time:
        raise ReattachRefused(
            f"refused to reattach to plugin {name!r}: process {pid} started at tick {started}, not at tick "
            f"{config.start_time} as the plugin launched with that pid did (its pid was reused)"
        )


def _refuse_dir(name: str, address: str, why: str) -> ReattachRefused:
    return ReattachRefused(f"refused to reattach to plugin {name!r}: its socket {address} {why}")


def _open_checked_dir(address: str, name: str) -> int:
    """The socket's directory, opened component by component from / without following a symlink;
    each component checked on its own descriptor, so what is checked is what is used."""
    euid = os.geteuid()
    directory = os.path.dirname(address)
    parts = [p for p in directory.split("/") if p]
    if not os.path.isabs(address) or any(p in (".", "..") for p in parts):
        raise _refuse_dir(name, address, "is not an absolute, normalised path")
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    walked = ""
    try:
        for index, part in enumerate(parts):
            walked += "/" + part
            try:
                child = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                raise PluginGone(
                    f"cannot reattach to plugin {name!r}: its socket dir {walked} is gone; launch it again"
                ) from None
            except OSError:  # ENOTDIR, ELOOP: a symlink or not a directory
                why = f"is reached through {walked}, which is not a real directory"
                raise _refuse_dir(name, address, why) from None
            os.close(fd)
            fd = child
            info = os.fstat(fd)
            last = index == len(parts) - 1
            if last:
                if info.st_uid != euid:
                    raise _refuse_dir(name, address, f"is in a directory owned by uid {info.st_uid}, not by {euid}")
                if stat.S_IMODE(info.st_mode) != 0o700:
                    raise _refuse_dir(
                        name, address, f"is in a directory of mode {stat.S_IMODE(info.st_mode):o}, not 700"
                    )
            elif info.st_uid not in (0, euid):
                raise _refuse_dir(name, address, f"is under {walked}, owned by uid {info.st_uid}")
            elif info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
                raise _refuse_dir(name, address, f"is under {walked}, which other users may write to")
        if not parts:
            raise _refuse_dir(name, address, "is not in a directory of its own")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_plugin_socket(config: ReattachConfig, name: str, timeout: float) -> CheckedSocket:
    """Prove that ``config`` names a live plugin this user launched, listening where it said.
    Raises :class:`PluginGone` when it is not there any more (launch a new one) and
    :class:`ReattachRefused` when something else is (send it nothing)."""
    if config.network != "unix":
        raise ReattachRefused(
            f"refused to reattach to plugin {name!r}: it was recorded on network {config.network!r}, where the "
            "listener cannot be identified"
        )
    _process_is_ours(config, name)
    address = config.address
    dir_fd = _open_checked_dir(address, name)
    checked = CheckedSocket(dir_fd, os.path.basename(address))
    try:
        _check_listener(config, name, checked, timeout)
    except BaseException:
        checked.close()
        raise
    return checked


def _check_listener(config: ReattachConfig, name: str, checked: CheckedSocket, timeout: float) -> None:
    from driversdk.peercred import peer_cred

    address = config.address
    try:
        entry = os.stat(checked.name, dir_fd=checked.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise PluginGone(f"cannot reattach to plugin {name!r}: its socket {address} is gone; launch it again") from None
    if not stat.S_ISSOCK(entry.st_mode) or entry.st_uid != os.geteuid():
        raise _refuse_dir(name, address, "is not a socket of this user's")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.settimeout(timeout)
        try:
            probe.connect(checked.path)
        except OSError as err:
            raise PluginGone(
                f"cannot reattach to plugin {name!r}: its socket {address} does not accept connections "
                f"({err.strerror}); launch it again"
            ) from None
        peer = peer_cred(probe)
    finally:
        with contextlib.suppress(OSError):
            probe.close()
    if peer.uid != os.geteuid():
        raise _refuse_dir(name, address, f"is served by uid {peer.uid}, not by this user ({os.geteuid()})")
    if peer.pid != config.pid:
        raise _refuse_dir(name, address, f"is served by process {peer.pid}, not by the plugin's process {config.pid}")
