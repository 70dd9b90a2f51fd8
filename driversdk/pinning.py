"""Pin a path that someone else can change: resolve it beneath a root without following any
symlink, then bind-mount what was found onto a directory only we can write.

A path inside a tree that a task or a CSI plugin writes is only true at the instant it is
checked: between our check and the moment a runtime (dockerd, runc) resolves it again, a
directory can become a symlink to ``/``. The pin removes that second resolution. We open the
object itself (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or a walk one component at
a time with O_NOFOLLOW from the root's descriptor where the kernel has no openat2), and bind
``/proc/self/fd/N`` onto a fresh entry of a 0700 directory of ours. The pinned path names that
object however the tree around the original changes afterwards; whoever mounts it gets what we
checked.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import struct
from dataclasses import dataclass
from enum import Enum

from driversdk.errors import DriverSDKError
from driversdk.paths import show

# openat2(2) has one number on every architecture that has it (the syscall table was unified
# before it was added in 5.6).
_NR_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_OPEN_HOW = struct.Struct("=QQQ")  # struct open_how {flags, mode, resolve}

_MS_BIND = 0x1000
_MS_REC = 0x4000
_MNT_DETACH = 0x2
_UMOUNT_NOFOLLOW = 0x8

_O_PATH = os.O_PATH | os.O_CLOEXEC
_PRIVATE_MODE = 0o700

_libc = ctypes.CDLL(None, use_errno=True)


class PinError(DriverSDKError):
    """A path cannot be used or pinned. ``reason`` is a phrase for the caller's sentence (which
    names the task or volume); the message alone is a full sentence too."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason + ".")
        self.reason = reason


class Kind(Enum):
    DIRECTORY = "directory"
    FILE = "regular file"
    OTHER = "other"


def kind_of(fd: int) -> Kind:
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        return Kind.DIRECTORY
    if stat.S_ISREG(mode):
        return Kind.FILE
    return Kind.OTHER


def relative_beneath(root: str, path: str) -> str | None:
    """``path`` (absolute, or relative to ``root``) as a path relative to ``root``, taken
    lexically; None when it names something outside. "." is the root itself."""
    full = os.path.normpath(os.path.join(root, path))
    base = os.path.normpath(root)
    if full == base:
        return "."
    if not full.startswith(base.rstrip("/") + "/"):
        return None
    return full[len(base.rstrip("/")) + 1 :]


def _openat2(root_fd: int, rel: str) -> int | None:
    """An O_PATH descriptor of ``rel`` beneath ``root_fd`` with no symlink on the way; None when
    this kernel (or a seccomp filter) has no openat2. OSError as the kernel says."""
    if _NR_OPENAT2 is None:
        return None
    how = _OPEN_HOW.pack(_O_PATH, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = int(_libc.syscall(ctypes.c_long(_NR_OPENAT2), ctypes.c_int(root_fd), os.fsencode(rel), how,
                           ctypes.c_size_t(len(how))))  # fmt: skip
    if fd >= 0:
        return fd
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM, errno.E2BIG):
        return None
    raise OSError(err, os.strerror(err), rel)


_openat2_works = True


def _walk(root_fd: int, parts: list[str], create_dirs: bool, mode: int) -> int:
    """The fallback (and the way missing directories are made): one component at a time from the
    root's descriptor, each opened O_NOFOLLOW relative to its verified parent, never a symlink."""
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            try:
                child = os.open(part, _O_PATH | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create_dirs:
                    raise
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened and checked below like anything else
                child = os.open(part, _O_PATH | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
            st_mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(st_mode):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), "/".join(parts[: i + 1]))
            if i < len(parts) - 1 and not stat.S_ISDIR(st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/".join(parts[: i + 1]))
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(root: str, path: str, *, create_dirs: bool = False, mode: int = 0o755) -> int:
    """An O_PATH descriptor of ``path`` (absolute or relative to ``root``) beneath ``root``,
    reached without following a symlink anywhere below the root; the caller closes it.

    With ``create_dirs`` every missing component is made (``mode``) with mkdirat on its
    verified parent. Raises PinError with a reason phrase for a symlink, an escape, or a path
    that does not exist; ``root`` itself is trusted (the operator's)."""
    global _openat2_works
    rel = relative_beneath(root, path)
    if rel is None:
        raise PinError(f"{show(path, 4096)} is outside {root}")
    parts = [] if rel == "." else rel.split("/")
    if ".." in parts:
        raise PinError(f"{show(path, 4096)} leaves {root}")
    root_fd = os.open(os.path.realpath(root), _O_PATH | os.O_DIRECTORY)
    try:
        try:
            if _openat2_works:
                fd = _openat2(root_fd, rel)
                if fd is not None:
                    return fd
                _openat2_works = False
            return _walk(root_fd, parts, create_dirs, mode)
        except FileNotFoundError:
            if create_dirs and _openat2_works:
                return _walk(root_fd, parts, create_dirs, mode)
            raise PinError(f"{show(path, 4096)} does not exist") from None
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise PinError(f"{show(path, 4096)} passes through a symlink") from None
            if err.errno == errno.EXDEV:
                raise PinError(f"{show(path, 4096)} leaves {root}") from None
            if err.errno == errno.ENOTDIR:
                raise PinError(f"a component of {show(path, 4096)} is not a directory") from None
            raise
    finally:
        os.close(root_fd)


def private_dir(path: str, *, create: bool = True) -> str:
    """``path`` as a directory of ours no one else may enter (0700), made when missing (its
    parent must exist). Refused when it is a symlink, someone else's or open to others."""
    if create:
        try:
            os.mkdir(path, _PRIVATE_MODE)
        except FileExistsError:
            pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise PinError(f"{path} is not a private directory of uid {os.geteuid()} (a symlink, another's, or mode "
                       f"{stat.S_IMODE(info.st_mode):o}); remove it")  # fmt: skip
    return path


@dataclass(frozen=True)
class Pinned:
    path: str
    kind: Kind


def pin(fd: int, pin_dir: str, name: str) -> Pinned:
    """Bind what ``fd`` refers to (with the mounts below it) onto ``pin_dir``/``name``, a fresh
    entry of a private dir (see :func:`private_dir`); returns the pinned path."""
    kind = kind_of(fd)  # the caller decides which kinds it pins: anything but a directory gets a file entry
    dir_fd = os.open(pin_dir, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if kind is Kind.DIRECTORY:
            os.mkdir(name, _PRIVATE_MODE, dir_fd=dir_fd)
        else:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dir_fd))  # fmt: skip
        target = f"/proc/self/fd/{dir_fd}/{name}"
        if _libc.mount(os.fsencode(f"/proc/self/fd/{fd}"), os.fsencode(target), None, _MS_BIND | _MS_REC, None):
            err = ctypes.get_errno()
            _remove_entry(dir_fd, name)
            raise OSError(err, f"bind-mounting the pin: {os.strerror(err)}", target)
    finally:
        os.close(dir_fd)
    return Pinned(os.path.join(pin_dir, name), kind)


def _remove_entry(dir_fd: int, name: str) -> None:
    try:
        info = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        os.rmdir(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def unpin(path: str) -> None:
    """Unmount a pin and remove its entry; a pin already gone is fine. The mount is detached
    (with the mounts below it): a container that bound the pin keeps its own mount."""
    encoded = os.fsencode(path)
    while _libc.umount2(encoded, _MNT_DETACH | _UMOUNT_NOFOLLOW) == 0:
        pass  # stacked pins at one path (a pin made twice): take them all
    err = ctypes.get_errno()
    if err not in (errno.EINVAL, errno.ENOENT):
        raise OSError(err, f"unmounting the pin: {os.strerror(err)}", path)
    parent, name = os.path.split(path)
    try:
        dir_fd = os.open(parent, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        _remove_entry(dir_fd, name)
    finally:
        os.close(dir_fd)


def remove_private_dir(path: str) -> None:
    """Remove an empty pin dir; one still holding pins (or gone) stays as it is."""
    try:
        os.rmdir(path)
    except OSError:
        pass
