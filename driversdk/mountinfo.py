"""Read /proc/<pid>/mountinfo: which mount a path lives on, and how that mount propagates.

Docker and runc refuse an rslave/rshared bind mount whose source sits on a private mount, and
only say so once the container is being created. Reading mountinfo lets us say it first.
"""

from __future__ import annotations

import os
import re
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
    """mountinfo that does not parse (a ValueError too, as it always was)."""


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
