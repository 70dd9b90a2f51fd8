"""Read /proc/<pid>/mountinfo: which mount a path lives on, and how that mount propagates.

Docker and runc refuse an rslave/rshared bind mount whose source sits on a private mount, and
only say so once the container is being created. Reading mountinfo lets us say it first.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from driversdk.errors import DriverSDKError

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\040, \\011, \\012, \\134."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    parent_id: int
    major_minor: str
    root: str
    mount_point: str
    options: tuple[str, ...]
    optional: tuple[str, ...]
    fs_type: str
    source: str
    super_options: tuple[str, ...]

    @property
    def shared(self) -> bool:
        return any(f.startswith("shared:") for f in self.optional)

    @property
    def slave(self) -> bool:
        return any(f.startswith("master:") for f in self.optional)

    @property
    def unbindable(self) -> bool:
        return "unbindable" in self.optional

    @property
    def propagation(self) -> str:
        """'shared', 'slave', 'shared,slave', 'unbindable' or 'private' (as findmnt prints)."""
        kinds = []
        if self.shared:
            kinds.append("shared")
        if self.slave:
            kinds.append("slave")
        if self.unbindable:
            kinds.append("unbindable")
        return ",".join(kinds) or "private"


class MountinfoError(DriverSDKError, ValueError):
    """mountinfo that does not parse (also a ValueError, so a caller that catches ValueError for a
    bad value catches it)."""


def parse_line(line: str) -> MountEntry:
    fields = line.rstrip("\n").split(" ")
    try:
        sep = fields.index("-", 6)
        return MountEntry(
            mount_id=int(fields[0]),
            parent_id=int(fields[1]),
            major_minor=fields[2],
            root=unescape(fields[3]),
            mount_point=unescape(fields[4]),
            options=tuple(fields[5].split(",")),
            optional=tuple(fields[6:sep]),
            fs_type=fields[sep + 1],
            source=unescape(fields[sep + 2]),
            super_options=tuple(fields[sep + 3].split(",")) if len(fields) > sep + 3 else (),
        )
    except (ValueError, IndexError):
        raise MountinfoError(f"unrecognised mountinfo line {line.strip()!r}") from None


def read_mountinfo(pid: int | str = "self") -> list[MountEntry]:
    with open(f"/proc/{pid}/mountinfo") as fh:
        return [parse_line(line) for line in fh if line.strip()]


def mount_points(pid: int | str = "self") -> frozenset[str]:
    """Every mount point in mountinfo, unescaped: the one field :func:`is_mount_point` needs,
    taken from one read without parsing the rest of each line (a hot path of CSI mounts)."""
    with open(f"/proc/{pid}/mountinfo") as fh:
        data = fh.read()
    points = set()
    for line in data.splitlines():
        if not line.strip():
            continue
        fields = line.split(" ", 5)
        if len(fields) < 6:
            raise MountinfoError(f"unrecognised mountinfo line {line.strip()!r}")
        points.add(unescape(fields[4]) if "\\" in fields[4] else fields[4])
    return frozenset(points)


# statx(2), which Python 3.11 does not wrap: glibc 2.28+ has it; the kernel sets
# STATX_ATTR_MOUNT_ROOT since 5.8 and says so in stx_attributes_mask.
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_NO_AUTOMOUNT = 0x800
_AT_STATX_DONT_SYNC = 0x4000
_STATX_ATTR_MOUNT_ROOT = 0x2000
_STATX_SIZE = 256  # struct statx is padded to 256 bytes for growth
_ATTRIBUTES_AT = 8  # __u64 stx_attributes
_ATTRIBUTES_MASK_AT = 56  # __u64 stx_attributes_mask


def _load_statx() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    loaded: Callable[..., int] = fn
    return loaded


_statx = _load_statx()


def statx_mount_root(path: str) -> bool | None:
    """Whether ``path`` is the root of a mount, from statx's STATX_ATTR_MOUNT_ROOT; None when
    statx cannot tell (no statx in libc or the kernel, a kernel before 5.8, or the path gives an
    error other than "does not exist").

    Unlike comparing st_dev with the parent's, this sees a bind mount of a directory of the same
    filesystem. It costs one system call, where a mountinfo read grows with the mount table.
    The last component is not followed (a symlink is no mount root), nor automounted, and
    AT_STATX_DONT_SYNC keeps a network filesystem's root from being asked for fresh attributes.
    A path that does not exist is no mount: nothing is mounted where it leads. (mountinfo can
    still list a mount hidden under a later mount on a parent, which no path reaches.)"""
    if _statx is None:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    flags = _AT_SYMLINK_NOFOLLOW | _AT_NO_AUTOMOUNT | _AT_STATX_DONT_SYNC
    # The mask asks for no fields: the mount-root attribute comes with every answer.
    if _statx(_AT_FDCWD, os.fsencode(path), flags, 0, buf) != 0:
        err = ctypes.get_errno()
        return False if err in (errno.ENOENT, errno.ENOTDIR) else None
    (attributes,) = struct.unpack_from("=Q", buf, _ATTRIBUTES_AT)
    (known,) = struct.unpack_from("=Q", buf, _ATTRIBUTES_MASK_AT)
    if not known & _STATX_ATTR_MOUNT_ROOT:
        return None
    return bool(attributes & _STATX_ATTR_MOUNT_ROOT)


def is_mounted_at(path: str) -> bool:
    """Whether something is mounted exactly at the resolved ``path``: statx when it can tell,
    else one read of mountinfo."""
    verdict = statx_mount_root(path)
    return verdict if verdict is not None else path in mount_points()


def is_mount_point(path: str, entries: list[MountEntry] | None = None) -> bool:
    """Whether something is mounted exactly at ``path``.

    The kernel reports a mount point fully resolved (no symlinks, no ``..``) and with space,
    tab, newline and backslash octal-escaped; read_mountinfo undoes the escapes, so resolving
    ``path`` the same way makes the two comparable. Pass ``entries`` to test many paths
    against one read of mountinfo (or test resolved paths against one :func:`mount_points`).
    """
    real = os.path.realpath(path)
    if entries is None:
        return real in mount_points()
    return any(e.mount_point == real for e in entries)


def find_mount(path: str, entries: list[MountEntry] | None = None) -> MountEntry:
    """The mount ``path`` lives on: the longest matching mount point, the last one if stacked."""
    real = os.path.realpath(path)
    best: MountEntry | None = None
    for entry in entries if entries is not None else read_mountinfo():
        mp = entry.mount_point
        contains = real == mp or real.startswith(mp.rstrip("/") + "/") or mp == "/"
        # ">=": a later mount stacked on the same point hides the earlier one.
        if contains and (best is None or len(mp) >= len(best.mount_point)):
            best = entry
    if best is None:  # pragma: no cover - "/" always matches
        raise MountinfoError(f"no mount found for {path!r}")
    return best
