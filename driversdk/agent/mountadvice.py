"""One sentence per host-volume mount that cannot work: its root cause and the one change that
resolves it without leading to the next error.

A host volume's mount can fail for reasons that interact: the client config makes the volume
read-only, the job asks for ``bidirectional`` (which needs read-write), the host path is missing,
or it sits on a private mount (``host-to-task`` and ``bidirectional`` need a shared or slave one).
Advice given for one reason alone sends an operator in circles ("set read_only = false" → "the
client makes it read-only" → "run mount --make-rshared /"); here all of them are weighed at once
and the change named is one that, applied as written, validates. A host-side change names the
volume's own path, never the whole host (``mount --make-rshared /``).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from driversdk.mountinfo import MountEntry, find_mount
from driversdk.mounts import Propagation, UnknownPropagationError, shared_mount_command


@dataclass(frozen=True)
class HostMount:
    """One task volume_mount of a host volume, with where each read-only flag comes from."""

    volume: str  # the group's volume request name
    source: str  # the client's host_volume name
    host_path: str
    propagation: str
    client_read_only: bool
    request_read_only: bool
    mount_read_only: bool


def advise(mount: HostMount, entries: list[MountEntry]) -> tuple[str, bool] | None:
    """The one problem of this mount, as a sentence; None when it can work. The flag says the
    sentence already asks for ``read_only = true`` on the volume request (so a separate
    placement problem saying the same is not added)."""
    try:
        mode = Propagation.parse(mount.propagation)
    except UnknownPropagationError:
        return None  # the static rules refuse it
    path = mount.host_path
    exists = bool(path) and os.path.exists(path)
    entry = find_mount(path, entries) if exists else None
    propagates = entry is not None and (entry.shared or entry.slave)
    read_only = mount.client_read_only or mount.request_read_only or mount.mount_read_only
    make_shared = shared_mount_command(path, entry)
    if mode is Propagation.BIDIRECTIONAL and read_only:
        return _bidirectional_read_only(mount, exists, propagates, make_shared)
    if not exists:
        if mode.needs_shared_source:
            return (
                f'host path "{path}" of host volume "{mount.source}" does not exist; create it as a shared mount, '
                f'which propagation_mode "{mode.value}" ({mode.linux}) needs: `{make_shared}` (or fix the '
                f'host_volume "{mount.source}" path in the client config)',
                False,
            )
        return (
            f'host path "{path}" of host volume "{mount.source}" does not exist; create it (`mkdir -p '
            f'{shlex.quote(path)}`) or fix the host_volume "{mount.source}" path in the client config',
            False,
        )
    if mode.needs_shared_source and not propagates:
        assert entry is not None
        return (
            f'propagation_mode "{mode.value}" ({mode.linux}) needs the host path "{path}" of host volume '
            f'"{mount.source}" on a shared or slave mount, but it sits on "{entry.mount_point}", which is '
            f"{entry.propagation}; make that path a shared mount: `{make_shared}` (or use propagation_mode = "
            '"private")',
            False,
        )
    return None


def _bidirectional_read_only(mount: HostMount, exists: bool, propagates: bool, make_shared: str) -> tuple[str, bool]:
    create = "" if exists else f'create "{mount.host_path}" (`mkdir -p {shlex.quote(mount.host_path)}`) and '
    if mount.client_read_only:
        # The job cannot make the volume writable: bidirectional cannot work with it at all.
        also = "" if mount.request_read_only else f', and set read_only = true on volume "{mount.volume}"'
        if propagates:
            change = f'use propagation_mode = "host-to-task", which works read-only{also} ("private" works too'
        else:
            change = (
                f'use propagation_mode = "private"{also} ("host-to-task" works read-only too once '
                f'"{mount.host_path}" is a shared mount: `{make_shared}`'
            )
        return (
            f'propagation_mode "bidirectional" cannot work with host volume "{mount.source}": the client config '
            f"makes it read-only and bidirectional needs a read-write mount; {create}{change}; bidirectional only "
            f'with read_only = false on host_volume "{mount.source}" in the client config)',
            not mount.request_read_only,
        )
    asks = [f'volume "{mount.volume}"'] if mount.request_read_only else []
    asks += ["this volume_mount"] if mount.mount_read_only else []
    cause = (
        f'propagation_mode "bidirectional" needs a read-write mount, but {" and ".join(asks)} '
        f"{'ask' if len(asks) > 1 else 'asks'} for it read-only"
    )
    where = " and ".join(f"{a} (remove read_only = true)" for a in asks)
    if propagates:
        return f"{cause}; {create}make it read-write on {where}, or keep it read-only with propagation_mode = " + (
            '"host-to-task"'
        ), False
    return (
        f'{cause}; {create}keep it read-only with propagation_mode = "private" (bidirectional also needs '
        f'"{mount.host_path}" on a shared mount: `{make_shared}`)',
        False,
    )
