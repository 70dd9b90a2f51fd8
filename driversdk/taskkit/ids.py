"""Host user ids: Nomad's ``denied_host_uids`` / ``denied_host_gids`` range strings and the check
that a task's user (with its primary and supplementary groups) falls outside them.

Used by the exec and raw_exec drivers.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

from driversdk.errors import ConfigError

MAX_ID = 2**32 - 1


@dataclass(frozen=True)
class IdRanges:
    """A parsed range string such as ``"0,10-20"``; empty denies nothing."""

    text: str
    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def parse(cls, text: str | None, field: str) -> IdRanges:
        text = (text or "").strip()
        if not text:
            return cls("", ())
        ranges: list[tuple[int, int]] = []
        for part in text.split(","):
            low_s, sep, high_s = part.strip().partition("-")
            try:
                low = int(low_s, 10)
                high = int(high_s, 10) if sep else low
            except ValueError:
                raise ConfigError(
                    f"plugin config {field} {text!r}: {part.strip()!r} is not an id or a range; "
                    'use ids and ranges separated by commas, such as "0,10-20"'
                ) from None
            if not (0 <= low <= MAX_ID and 0 <= high <= MAX_ID):
                raise ConfigError(f"plugin config {field} {text!r}: {part.strip()!r} is outside 0-{MAX_ID}")
            if low > high:
                raise ConfigError(
                    f"plugin config {field} {text!r}: in {part.strip()!r} the lower bound is greater than the upper"
                )
            ranges.append((low, high))
        return cls(text, tuple(ranges))

    def __contains__(self, value: int) -> bool:
        return any(low <= value <= high for low, high in self.ranges)


@dataclass(frozen=True)
class HostUser:
    """A task user resolved on the host."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    """Supplementary groups (the primary gid excluded)."""
    home: str


def lookup_user(user: str, *, task: str, default: str = "") -> HostUser:
    """The host user for a task ``user``: a name or a numeric uid. Empty means ``default`` (a
    user name) when given, else the plugin's own user."""
    if not user and default:
        try:
            entry = pwd.getpwnam(default)
        except KeyError:
            raise ConfigError(
                f"task {task!r} names no user, so it would run as {default!r}, but this host has no user "
                f"{default!r}; create it or set the task's user"
            ) from None
        return _host_user(entry)
    try:
        if not user:
            entry = pwd.getpwuid(os.geteuid())
        elif user.isdigit():
            entry = pwd.getpwuid(int(user))
        else:
            entry = pwd.getpwnam(user)
    except (KeyError, ValueError):
        raise ConfigError(
            f"task {task!r}: user {user!r} does not exist on this host; create it or set another user"
        ) from None
    return _host_user(entry)


def _host_user(entry: pwd.struct_passwd) -> HostUser:
    groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != entry.pw_gid)
    return HostUser(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


def check_user_allowed(user: HostUser, denied_uids: IdRanges, denied_gids: IdRanges, *, task: str, plugin: str) -> None:
    """Refuse a user whose uid, primary gid or a supplementary gid the plugin config denies.

    The sentence names the task, the user, the id and the ``plugin`` option an operator changes."""
    if user.uid in denied_uids:
        raise ConfigError(
            f"task {task!r}: running as user {user.name!r} (uid {user.uid}) is not allowed on this client: the "
            f"plugin's denied_host_uids ({denied_uids.text!r}) contains it; set the task's user to "
            f'another one, or change denied_host_uids in the {plugin} plugin config (denied_host_uids = "" '
            "denies no uid)"
        )
    for gid in (user.gid, *user.groups):
        if gid in denied_gids:
            try:
                name = grp.getgrgid(gid).gr_name
            except KeyError:
                name = str(gid)
            raise ConfigError(
                f"task {task!r}: running as user {user.name!r} (uid {user.uid}) is not allowed on this client: its "
                f"group {name!r} (gid {gid}) is in the plugin's denied_host_gids ({denied_gids.text!r}); "
                f"set the task's user to one outside those groups, or change denied_host_gids in the {plugin} "
                'plugin config (denied_host_gids = "" denies no gid)'
            )
