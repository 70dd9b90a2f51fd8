"""Mount propagation modes and the rules a mount must follow before a task starts.

This module is the one place that knows what ``private`` / ``host-to-task`` /
``bidirectional`` mean on Linux and which requests can never work.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from driversdk.errors import ConfigError
from driversdk.mountinfo import MountEntry, find_mount, read_mountinfo


class Propagation(Enum):
    """A volume_mount ``propagation_mode``; the value is the wire string."""

    PRIVATE = "private"
    HOST_TO_TASK = "host-to-task"
    BIDIRECTIONAL = "bidirectional"

    @property
    def linux(self) -> str:
        """The recursive bind-mount propagation flag the mode maps to."""
        return _LINUX_PROPAGATION[self]

    @property
    def needs_shared_source(self) -> bool:
        """rslave and rshared only work when the host source is on a shared or slave mount."""
        return self is not Propagation.PRIVATE

    @classmethod
    def parse(cls, text: str) -> Propagation:
        """Parse a wire string; the empty string means private. Raises UnknownPropagationError."""
        if text == "":
            return cls.PRIVATE
        for mode in cls:
            if mode.value == text:
                return mode
        raise UnknownPropagationError(text)


_LINUX_PROPAGATION = {
    Propagation.PRIVATE: "rprivate",
    Propagation.HOST_TO_TASK: "rslave",
    Propagation.BIDIRECTIONAL: "rshared",
}


class UnknownPropagationError(ConfigError, ValueError):
    """A propagation mode outside the three Nomad accepts: operator config, INVALID_ARGUMENT on
    the wire. Also a ValueError, so a caller that catches ValueError for a bad value catches it."""

    def __init__(self, text: str) -> None:
        choices = ", ".join(repr(m.value) for m in Propagation)
        super().__init__(f"unknown propagation_mode {text!r}: use one of {choices} (empty means 'private')")
        self.text = text


@dataclass(frozen=True)
class Mount:
    """One host path bound into a task."""

    task_path: str
    host_path: str
    readonly: bool = False
    propagation: Propagation = Propagation.PRIVATE
    selinux_label: str = ""
    request_name: str = ""
    """The host volume name or the CSI volume request name this mount came from."""


# --- validation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MountRequest:
    """One ``volume_mount`` of a task, resolved against the group's ``volume`` request.

    ``read_only`` is already the OR of the host volume's, the volume request's and the
    volume_mount's flags, as Nomad computes it; ``propagation`` is the raw jobspec string.
    """

    volume: str
    destination: str
    host_path: str
    kind: str = "host"  # "host" or "csi"
    propagation: str = ""
    read_only: bool = False
    selinux_label: str = ""


@dataclass(frozen=True)
class MountProblem:
    """One reason a mount cannot work, as a sentence an operator can act on."""

    task: str
    volume: str
    field: str
    message: str

    def __str__(self) -> str:
        return self.message


class MountValidationError(ConfigError):
    """Every problem found with a task's mounts, reported at once."""

    def __init__(self, problems: Sequence[MountProblem]) -> None:
        self.problems = list(problems)
        super().__init__(" ".join(_sentence(p.message) for p in self.problems))


def _sentence(text: str) -> str:
    return text if text.endswith(".") else text + "."


def check_mounts(
    requests: Sequence[MountRequest],
    *,
    task: str,
    driver: str,
    mount_configs: int,
    check_host: bool = True,
    mountinfo: list[MountEntry] | None = None,
) -> list[Mount]:
    """Turn a task's mount requests into driver Mounts, or raise with every problem found.

    ``mount_configs`` is the driver's advertised MountConfigSupport (0 = all, 1 = none).
    With ``check_host`` the host side is checked too: the source exists, and for
    host-to-task / bidirectional it sits on a shared or slave mount.
    """
    problems: list[MountProblem] = []
    if requests and mount_configs == 1:
        for kind, what in (("host", "host volumes"), ("csi", "CSI")):
            names = [r.volume for r in requests if r.kind == kind]
            if names:
                problems.append(
                    MountProblem(
                        task,
                        names[0],
                        "driver",
                        f'task driver "{driver}" for "{task}" does not support {what}: '
                        f"{_names(names)} cannot be mounted; run the task with a driver that supports "
                        "mounts (docker, exec) or remove its volume_mount blocks",
                    )
                )
    mounts: list[Mount] = []
    seen: dict[str, str] = {}
    for req in requests:
        where = f'task "{task}" volume "{req.volume}"'
        try:
            propagation = Propagation.parse(req.propagation)
        except UnknownPropagationError:
            problems.append(
                MountProblem(
                    task,
                    req.volume,
                    "propagation_mode",
                    f'{where}: unknown propagation_mode "{req.propagation}"; use "private", "host-to-task" '
                    'or "bidirectional"',
                )
            )
            propagation = Propagation.PRIVATE
        if not req.destination.startswith("/"):
            problems.append(
                MountProblem(
                    task,
                    req.volume,
                    "destination",
                    f'{where}: destination "{req.destination}" must be an absolute path inside the task, '
                    'such as "/data"',
                )
            )
        dest = os.path.normpath(req.destination) if req.destination else req.destination
        if dest in seen:
            problems.append(
                MountProblem(
                    task,
                    req.volume,
                    "destination",
                    f'task "{task}": volumes "{seen[dest]}" and "{req.volume}" both mount at "{dest}"; give each '
                    "volume_mount its own destination",
                )
            )
        else:
            seen[dest] = req.volume
        if propagation is Propagation.BIDIRECTIONAL and req.read_only:
            problems.append(
                MountProblem(
                    task,
                    req.volume,
                    "propagation_mode",
                    f'{where}: propagation_mode "bidirectional" needs a read-write mount, but the mount is '
                    "read-only; set read_only = false on the volume and its volume_mount, or keep it read-only "
                    'with propagation_mode = "private"',
                )
            )
        mount = Mount(
            task_path=req.destination,
            host_path=req.host_path,
            readonly=req.read_only,
            propagation=propagation,
            selinux_label=req.selinux_label,
            request_name=req.volume,
        )
        mounts.append(mount)
    if check_host:
        problems.extend(_host_problems(mounts, task, mountinfo, read_write_rule=False))
    if problems:
        raise MountValidationError(problems)
    return mounts


def _names(names: Sequence[str]) -> str:
    quoted = [f'"{n}"' for n in names]
    return ("volume " if len(quoted) == 1 else "volumes ") + ", ".join(quoted)


def check_host_preconditions(
    mounts: Sequence[Mount], *, task: str, mountinfo: list[MountEntry] | None = None
) -> list[MountProblem]:
    """What a runtime would only discover while creating the task: a missing source, a
    read-only bidirectional mount, an rslave/rshared source on a private mount."""
    return _host_problems(mounts, task, mountinfo, read_write_rule=True)


def _host_problems(
    mounts: Sequence[Mount], task: str, mountinfo: list[MountEntry] | None, *, read_write_rule: bool
) -> list[MountProblem]:
    problems: list[MountProblem] = []
    entries: list[MountEntry] | None = mountinfo
    for m in mounts:
        volume = m.request_name or m.task_path
        where = f'task "{task}" volume "{volume}"'
        if not m.host_path or not os.path.exists(m.host_path):
            problems.append(
                MountProblem(
                    task,
                    volume,
                    "host_path",
                    f'{where}: host path "{m.host_path}" does not exist; create it or fix the host_volume path '
                    "in the client config",
                )
            )
            continue
        if read_write_rule and m.propagation is Propagation.BIDIRECTIONAL and m.readonly:
            problems.append(
                MountProblem(
                    task,
                    volume,
                    "propagation_mode",
                    f'{where}: propagation_mode "bidirectional" needs a read-write mount, but the mount is '
                    'read-only; set read_only = false, or keep it read-only with propagation_mode = "private"',
                )
            )
        if m.propagation.needs_shared_source:
            if entries is None:
                entries = read_mountinfo()
            entry = find_mount(m.host_path, entries)
            if not (entry.shared or entry.slave):
                problems.append(
                    MountProblem(
                        task,
                        volume,
                        "propagation_mode",
                        f'{where}: propagation_mode "{m.propagation.value}" ({m.propagation.linux}) needs the host '
                        f'source "{m.host_path}" on a shared or slave mount, but it sits on "{entry.mount_point}", '
                        f"which is {entry.propagation}; make that path a shared mount on the host: "
                        f'`{shared_mount_command(m.host_path, entry)}` (or use propagation_mode = "private")',
                    )
                )
    return problems


def shared_mount_command(path: str, entry: MountEntry | None) -> str:
    """The narrowest host change that puts ``path`` on a shared mount: a bind of the path onto
    itself made shared (or, when the path is a mount point already, that mount made shared);
    never the whole host (``mount --make-rshared /``). ``entry`` None: the path does not exist."""
    p = shlex.quote(path)
    if entry is None:
        return f"mkdir -p {p} && mount --bind {p} {p} && mount --make-shared {p}"
    if os.path.realpath(path) == entry.mount_point:
        return f"mount --make-shared {p}"
    return f"mount --bind {p} {p} && mount --make-shared {p}"


def ensure_mounts_usable(mounts: Sequence[Mount], *, task: str) -> None:
    """For drivers: re-check the Mounts a host sent before creating anything; raises if unusable."""
    problems = check_host_preconditions(mounts, task=task)
    if problems:
        raise MountValidationError(problems)
