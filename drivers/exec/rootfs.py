"""Making a task's root directory a mount point of its own, on the host, when a mount needs rshared.

runc makes the mount that holds the bundle's root private inside the container (pivot_root
refuses shared parents). When that mount also holds a bidirectional volume's source (a host
where "/" is shared and holds both), the volume's bind would drop out of the host's peer group
and stop propagating. A self-bind of the root dir gives runc a mount of our own to privatise
instead, as an image driver's overlay mount does. It is unmounted on destroy. It keeps the
propagation of its parent on the host on purpose: had we made it private, copies it propagated
to peer namespaces at bind time would survive our unmount.
"""

from __future__ import annotations

import ctypes
import os
import shutil

from driversdk.errors import DriverError
from driversdk.mountinfo import is_mount_point, read_mountinfo

MS_BIND = 0x1000
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, flags: int) -> None:
    if _libc.mount(source.encode(), target.encode(), None, flags, None) != 0:
        code = ctypes.get_errno()
        raise DriverError(f"failed to bind the task root {target!r} onto itself: {os.strerror(code)}", recoverable=True)


def bind_self(rootfs: str) -> None:
    _mount(rootfs, rootfs, MS_BIND)


def unmount(rootfs: str) -> None:
    """Detach the self-bind (and anything stacked on it); no-op when it is not mounted."""
    while is_mount_point(rootfs):
        if _libc.umount2(rootfs.encode(), MNT_DETACH) != 0:
            code = ctypes.get_errno()
            raise DriverError(f"failed to unmount the task root {rootfs!r}: {os.strerror(code)}; unmount it by hand")


def remove_task_dir(path: str) -> None:
    """rm -r of a task dir, refusing to descend into anything still mounted below it."""
    if not os.path.exists(path):
        return
    # Compared as the kernel reports mount points: resolved, so a symlinked state dir still matches.
    real = os.path.realpath(path)
    prefix = real.rstrip("/") + "/"
    mounted = [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(prefix) or e.mount_point == real]
    if mounted:
        raise DriverError(
            f"refusing to remove task dir {path!r}: {', '.join(sorted(mounted))} still mounted below it; "
            "unmount them and destroy the task again"
        )
    shutil.rmtree(path)
