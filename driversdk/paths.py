"""Names that become path components, and paths that must stay under a root.

Every name a job, client or volume file gives us (job, group, task, volume label, volume id,
plugin id, ...) is treated as hostile: the runner joins them under its data dir, so one "..",
"/" or NUL would let a job file write or delete outside it.  :func:`check_name` is the one
place that decides what a safe name is (validate refuses with its sentence before anything
runs); :func:`resolve_under` is the second line of defence at the point where a path is built.
"""

from __future__ import annotations

import os

from driversdk.errors import DriverSDKError

# NAME_MAX on Linux (and every filesystem the runner writes to): longer components fail with
# ENAMETOOLONG at mkdir time, after part of the job has already started.
NAME_MAX = 255
PATH_MAX = 4096

# How much of a hostile value a message shows: enough to recognise it, never 5000 characters.
_SHOWN = 60


class UnsafePathError(DriverSDKError):
    """A path built from job, client or volume data would leave the directory it belongs under."""


def show(value: str, limit: int = _SHOWN) -> str:
    """The value quoted for a message: control characters escaped, values over ``limit`` shortened
    (paths pass PATH_MAX: an operator needs all of a path to find it)."""
    text = value if len(value) <= limit else value[:limit] + "..."
    # repr escapes NUL, newlines and other control characters, so a name cannot forge extra
    # lines or terminal sequences in the operator's output.
    quoted = repr(text)
    return '"' + quoted[1:-1].replace('"', '\\"') + '"' if quoted[0] == "'" else quoted


def _has_control(value: str) -> bool:
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F or 0x80 <= ord(ch) < 0xA0 for ch in value)


def check_name(value: object, field: str) -> str | None:
    """Why ``value`` is not a single safe path component, as a sentence naming ``field``; else None."""
    if not isinstance(value, str):
        return f"{field} must be a string, not {type(value).__name__}"
    if value == "":
        return f"{field} is empty; give it a name (it becomes a directory name)"
    if value in (".", ".."):
        return f"{field} {show(value)} is not a usable name: it would point at a directory, not name a new one"
    if "\x00" in value:
        return f"{field} {show(value)} contains a NUL character, which cannot be part of a file name"
    if "/" in value:
        return f'{field} {show(value)} contains "/"; it must be a single name, not a path'
    if _has_control(value):
        return f"{field} {show(value)} contains control characters; use printable characters only"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        # Lone surrogates (e.g. from a "\udc80" escape) cannot be written as a file name.
        return f"{field} {show(value)} is not valid Unicode text"
    if size > NAME_MAX:
        return f"{field} is {size} bytes long; names become directory names and may be at most {NAME_MAX} bytes"
    return None


def resolve_under(root: str, *parts: str, what: str) -> str:
    """``root``/``parts`` with symlinks resolved, refused unless it stays inside ``root``.

    ``what`` names the path for the operator (e.g. 'the alloc dir of task "web"').  Absolute
    parts are refused rather than silently replacing ``root`` the way os.path.join would.
    """
    for part in parts:
        if "\x00" in part:
            raise UnsafePathError(f"{what}: {show(part)} contains a NUL character; refusing to build the path")
        if os.path.isabs(part):
            raise UnsafePathError(f"{what}: {show(part)} is an absolute path where a name under {root} was expected")
    real_root = os.path.realpath(root)
    # realpath resolves every existing symlink along the way, so a link planted inside root that
    # points outside it is caught here, not only literal ".." components.
    target = os.path.realpath(os.path.join(real_root, *parts))
    if target != real_root and os.path.commonpath([real_root, target]) != real_root:
        raise UnsafePathError(
            f"{what} resolves to {target}, outside {real_root}; refusing to use it "
            "(check for '..' in names or a symlink pointing elsewhere)"
        )
    return target
