"""The node volume manager: stage once per volume and usage, publish per allocation, tear down
idempotently, and remember enough in SQLite to finish a teardown after a restart.

Paths follow Nomad's layout. ``host_root`` is ``<state>/csi/<type>/<plugin id>`` on the host;
the plugin sees the same tree at ``plugin_root`` (its ``stage_publish_base_dir``):

    staging  <root>/staging/<namespace>/<volume id>/<usage>
    publish  <root>/per-alloc/<alloc id>/<volume id>/<usage>

A staging path outlives its unstage, as in Nomad: one per (volume, usage), so their number is
bounded by the volumes a node has staged, and staging the volume again costs no directories
(three mkdirs and three rmdirs per cycle, each waiting on the file system's journal). The
publish side is per allocation and unbounded, so it goes with every unpublish. What stays is
swept by :func:`sweep_mount_root` when the plugin's last instance on the node stops.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TypeVar

from driversdk.agent.csi.state import StateStore, UsageRow
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.csi.model import AccessMode, AttachmentMode, MountOptions, Secrets, Volume, VolumeCapability
from driversdk.mountinfo import is_mount_point, is_mounted_at, mount_points, read_mountinfo
from driversdk.paths import resolve_under
from driversdk.pb import csi_pb2
from driversdk.pinning import Kind, PinError, kind_of, open_beneath, pin, private_dir, unpin

log = logging.getLogger("driversdk.csi")

_T = TypeVar("_T")
_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 0x2
_MAX_STACKED_MOUNTS = 8  # a path a plugin mounted over more than once: each layer goes
_PUBLISH = csi_pb2.ControllerServiceCapability.RPC.PUBLISH_UNPUBLISH_VOLUME


@dataclass(frozen=True)
class UsageOptions:
    """How one allocation uses a volume; together they form the ``<usage>`` path element."""

    access_mode: AccessMode
    attachment_mode: AttachmentMode
    read_only: bool = False
    mount_options: MountOptions | None = None

    @cached_property
    def key(self) -> str:
        # Cached: every path, row and state query of an operation names it. (cached_property
        # writes the instance __dict__ directly, which a frozen dataclass allows.)
        return VolumeCapability(self.access_mode, self.attachment_mode).usage(self.read_only)

    def capability(self, volume: Volume) -> VolumeCapability:
        base = volume.mount_options or MountOptions()
        return VolumeCapability(self.access_mode, self.attachment_mode, base.merged(self.mount_options))


@dataclass(frozen=True)
class _Paths:
    """One operation's four paths, resolved once at its start (each resolution walks the tree)."""

    real_root: str
    host_stage: str
    plugin_stage: str
    host_target: str
    plugin_target: str


@dataclass(frozen=True)
class MountInfo:
    source: str
    """The published target on the host, in the plugin's tree."""
    pinned: str = ""
    """What a task mounts: the target as it was verified after the publish, bound onto a
    private dir of ours (see :func:`pin_path`); the plugin can no longer change what it names."""


# The pins of a plugin's published targets live beside its mount root, outside the tree the
# plugin is given, in a 0700 dir of ours: ``<state>/csi/<type>/.pins-<plugin id>``.
PIN_DIR_PREFIX = ".pins-"


def pin_root(host_root: str) -> str:
    real_root = os.path.realpath(host_root).rstrip("/")
    return os.path.join(os.path.dirname(real_root), PIN_DIR_PREFIX + os.path.basename(real_root))


def pin_path(host_root: str, volume: Volume, alloc_id: str, usage: UsageOptions) -> str:
    """Where one allocation's use of a volume is pinned: a digest of what names it, so no name
    from a volume file becomes a path component."""
    key = "\0".join((volume.namespace, volume.id, alloc_id, usage.key))
    return os.path.join(pin_root(host_root), hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32])


def is_pin(path: str) -> bool:
    """Whether ``path`` is a pin made by :func:`pin_path` (a source saved before pins were not)."""
    return os.path.basename(os.path.dirname(path)).startswith(PIN_DIR_PREFIX)


def release_pin(path: str) -> None:
    """Unmount and remove a pin; one already gone is fine."""
    unpin(path)


def _volume_json(volume: Volume, usage: UsageOptions) -> str:
    return json.dumps(
        {
            "id": volume.id,
            "plugin_id": volume.plugin_id,
            "namespace": volume.namespace,
            "external_id": volume.external_id,
            "access_mode": usage.access_mode.value,
            "attachment_mode": usage.attachment_mode.value,
            "read_only": usage.read_only,
        },
        sort_keys=True,
    )


def _plain_path(real_root: str, parts: tuple[str, ...]) -> str | None:
    """``real_root``/``parts`` when that is already its own resolution: each part one plain
    name and no existing component a symlink (lstat each, where os.path.realpath would lstat
    every component from "/" and resolve_under calls it twice). None: resolve it fully."""
    if any(part in ("", ".", "..") or "/" in part or "\x00" in part for part in parts):
        return None
    path = real_root.rstrip("/")
    for i, part in enumerate(parts):
        path = f"{path}/{part}"
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            # Nothing exists below here, so no symlink either; the rest joins as it is named.
            return os.path.join(path, *parts[i + 1 :])
        except OSError:
            return None
        if stat.S_ISLNK(mode):
            return None  # maybe planted by the plugin: resolve_under decides where it leads
    return path


@contextmanager
def _dir_work(volume: Volume, plugin_id: str, call: str, doing: str, path: str) -> Iterator[None]:
    """A directory the CO makes or removes in the plugin's tree for ``call``: a failure (a file
    where a directory belongs, a target the plugin left files in) is a sentence naming the volume
    and the path, not a bare OSError. The tree is the plugin's to write, so a plugin or a crash
    left it so."""
    try:
        yield
    except OSError as err:
        raise CSIError(
            f'volume "{volume.id}": cannot {doing} {path} ({err.strerror or err}): the tree of CSI plugin '
            f'"{plugin_id}" holds something else there; remove it',
            code="OK",
            call=call,
            volume=volume.id,
        ) from None


def _makedirs(path: str) -> None:
    """os.makedirs (0700), retried when another volume's teardown removes a shared parent
    ("staging", a namespace, an alloc's directory) between its steps."""
    for attempt in range(3):
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


# The layout's own directories under a plugin's mount root: fixed names that hold nothing of a
# volume, made by the first mount and kept (as Nomad keeps them) rather than made and removed again
# by every mount and unmount. Everything below them that a volume or an allocation names goes.
LAYOUT_DIRS = ("staging", "per-alloc")


def _remove_empty_below(leaf: str, real_root: str) -> None:
    """Remove ``leaf`` and its empty parents, down to the layout dir it is under (kept), or to
    the root when it is under none (a tree the resolver found through a symlink inside the root)."""
    for name in LAYOUT_DIRS:
        kept = os.path.join(real_root, name)
        if leaf.startswith(kept + "/"):
            NodeVolumeManager._remove_empty_from(leaf, kept)
            return
    NodeVolumeManager._remove_empty_from(leaf, real_root)


# How deep the layout names directories below a mount root: staging/<namespace>/<volume>/<usage>
# and per-alloc/<alloc>/<volume>/<usage>. Anything deeper is the plugin's, or a volume's content.
_LAYOUT_DEPTH = 4


def sweep_mount_root(root: str) -> None:
    """Remove the empty directories of the layout under a plugin's mount root, and the root when
    that leaves it empty: what staging paths outlived their unstage, what a crash left.

    For when the plugin's last instance on the node is gone. Only the layout's four levels are
    looked at; a mount point (a volume still staged or published: its content is a volume's) is
    never entered nor removed, a symlink never followed (directories are opened relative to
    their parent's descriptor, O_NOFOLLOW), and rmdir leaves whatever is not empty."""
    real_root = os.path.realpath(root)
    try:
        root_fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # no root (never started, or swept already)
    try:
        busy = {p for p in mount_points() if p == real_root or p.startswith(real_root + "/")}
        if real_root in busy:
            return
        _sweep_below(root_fd, real_root, busy, _LAYOUT_DEPTH)
    finally:
        os.close(root_fd)
    try:
        os.rmdir(real_root)
    except OSError:
        pass  # not empty: a mount, a plugin's file, a directory deeper than the layout
    try:
        os.rmdir(pin_root(real_root))
    except OSError:
        pass  # a pin still held (a volume still published), or none made


def _sweep_below(dir_fd: int, path: str, busy: set[str], depth: int) -> None:
    """Remove the empty directories below ``path`` (open as ``dir_fd``), ``depth`` levels down."""
    if depth == 0:
        return
    with os.scandir(dir_fd) as entries:
        names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    for name in names:
        child = f"{path}/{name}"
        if child in busy:
            continue  # a mount point: a volume's content is below it (a mount deeper keeps this one)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            continue  # swapped for a symlink, or gone
        try:
            _sweep_below(fd, child, busy, depth - 1)
        finally:
            os.close(fd)
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError:
            pass  # not empty, or a mount point after all (EBUSY)


_VOLUME_LOCKS: dict[tuple[str, str, str], threading.Lock] = {}  # (plugin, namespace, volume): a few per node
_VOLUME_LOCKS_GUARD = threading.Lock()


class NodeVolumeManager:
    def __init__(
        self,
        client: CSIClient,
        *,
        plugin_id: str,
        host_root: str,
        store: StateStore,
        requires_staging: bool,
        plugin_root: str | None = None,
    ) -> None:
        self.client = client
        self.plugin_id = plugin_id
        self.host_root = host_root
        self.plugin_root = plugin_root or host_root
        self.store = store
        self.requires_staging = requires_staging
        self._guard = threading.Lock()
        self._dir_pool: ThreadPoolExecutor | None = None

    def _beside_rpc(self, fn: Callable[[], _T]) -> Future[_T]:
        """Run directory work on the other side of the tree while an RPC is in flight: on a disk,
        mkdir and rmdir wait for the journal, and the plugin's own work takes milliseconds.
        Callers wait for the result before they return, so no operation leaves work behind."""
        with self._guard:
            if self._dir_pool is None:
                self._dir_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"csi-dirs-{self.plugin_id}")
            return self._dir_pool.submit(fn)

    def close(self) -> None:
        """End the directory workers: every operation waited for its own work, so none is
        running, and the pool's threads must not be left for the interpreter's exit to join."""
        with self._guard:
            pool, self._dir_pool = self._dir_pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _lock(self, volume: Volume) -> threading.Lock:
        # One operation at a time per (namespace, volume), as the spec asks of a CO: across the
        # managers of this process too (a claim's mount and the run's volume watcher releasing a
        # past claim of the same volume each make one, and the release's unstage must not run
        # between the mount's "staged already" and its publish).
        with _VOLUME_LOCKS_GUARD:
            return _VOLUME_LOCKS.setdefault((self.plugin_id, volume.namespace, volume.id), threading.Lock())

    def staging_paths(self, volume: Volume, usage: UsageOptions) -> tuple[str, str]:
        return self._paths(f'the staging path of volume "{volume.id}"', "staging", volume.namespace, volume.id,
                           usage.key)  # fmt: skip

    def publish_paths(self, volume: Volume, alloc_id: str, usage: UsageOptions) -> tuple[str, str]:
        return self._paths(f'the publish path of volume "{volume.id}"', "per-alloc", alloc_id, volume.id, usage.key)

    def _paths(self, what: str, *parts: str, real_root: str | None = None) -> tuple[str, str]:
        """The host path and the plugin's view of it. Names come from volume files and the plugin's
        tree is writable by the plugin, so the host side is resolved and must stay under the root."""
        real_root = real_root or os.path.realpath(self.host_root)
        plain = _plain_path(real_root, parts)
        if plain is not None:
            return plain, os.path.join(self.plugin_root, *parts)
        host = resolve_under(self.host_root, *parts, what=what)
        return host, os.path.join(self.plugin_root, os.path.relpath(host, real_root))

    def _op_paths(self, volume: Volume, alloc_id: str, usage: UsageOptions) -> _Paths:
        real_root = os.path.realpath(self.host_root)
        host_stage, plugin_stage = self._paths(
            f'the staging path of volume "{volume.id}"', "staging", volume.namespace, volume.id, usage.key,
            real_root=real_root,
        )  # fmt: skip
        host_target, plugin_target = self._paths(
            f'the publish path of volume "{volume.id}"', "per-alloc", alloc_id, volume.id, usage.key,
            real_root=real_root,
        )  # fmt: skip
        return _Paths(real_root, host_stage, plugin_stage, host_target, plugin_target)

    def _usage_row(self, volume: Volume, alloc_id: str, usage: UsageOptions, phase: str) -> UsageRow:
        return UsageRow(
            self.plugin_id, volume.namespace, volume.id, usage.key, alloc_id, phase, _volume_json(volume, usage)
        )

    # --- mount ---------------------------------------------------------------------------------

    def mount(
        self,
        volume: Volume,
        alloc_id: str,
        usage: UsageOptions,
        publish_context: Mapping[str, str] | None = None,
    ) -> MountInfo:
        context = dict(publish_context or {})
        capability = usage.capability(volume)
        with self._lock(volume):
            # Resolved before anything is recorded: a path the plugin's tree makes unsafe (a
            # symlink out of the root) refuses the mount with nothing to undo, no "mounting" use
            # left to hold the stage of the volume's other allocations.
            paths = self._op_paths(volume, alloc_id, usage)
            row = self._usage_row(volume, alloc_id, usage, "mounting")
            self.store.set_usage(row)
            staged_here = False
            host_stage, plugin_stage = paths.host_stage, paths.plugin_stage
            host_target, plugin_target = paths.host_target, paths.plugin_target

            def prepare_target() -> bool:
                """Make the target's parent; whether the target is published already (staging
                does not touch it)."""
                parent = os.path.dirname(host_target)
                with _dir_work(volume, self.plugin_id, "NodePublishVolume", "make the target's parent", parent):
                    _makedirs(parent)
                return is_mounted_at(host_target)

            try:
                # Staged again unless recorded *and* still a mount, as Nomad stages unless the path
                # is one: a plugin restarted without its records, or a mount gone behind our back,
                # needs it, and NodeStageVolume is idempotent (a plugin whose stage is mere
                # bookkeeping, never a mount, is asked every time and answers OK).
                if self.requires_staging and not (
                    self.store.staged(self.plugin_id, volume.namespace, volume.id, usage.key)
                    and is_mounted_at(host_stage)
                ):
                    with _dir_work(volume, self.plugin_id, "NodeStageVolume", "make the staging path", host_stage):
                        _makedirs(host_stage)
                    # The publish side is prepared while NodeStageVolume runs.
                    prepared = self._beside_rpc(prepare_target)
                    try:
                        self.client.node_stage(volume, plugin_stage, capability, context)
                    finally:
                        wait([prepared])  # never let the cleanup below race a mkdir
                    # Recorded with the mount (finish_mount), or by the cleanup below.
                    staged_here = True
                    published = prepared.result()
                else:
                    published = prepare_target()
                if not published:

                    def publish() -> None:
                        self.client.node_publish(
                            volume,
                            plugin_stage if self.requires_staging else "",
                            plugin_target,
                            capability,
                            usage.read_only,
                            context,
                        )

                    try:
                        publish()
                    except CSIError as err:
                        if not (self.requires_staging and not staged_here and err.code == "FAILED_PRECONDITION"):
                            raise
                        # Its stage is a mount but the plugin no longer knows it (restarted without
                        # its records): staged again (idempotent), published once more.
                        log.warning(
                            f'volume "{volume.id}": CSI plugin "{self.plugin_id}" refused NodePublishVolume as '
                            f"not staged ({err}); staging it again"
                        )
                        self.client.node_stage(volume, plugin_stage, capability, context)
                        staged_here = True
                        publish()
                try:
                    pinned = self._verify_and_pin(volume, alloc_id, usage, paths)
                except BaseException:
                    self._undo_publish(volume, paths)
                    raise
            except BaseException:
                # Leave nothing behind: this alloc's use is gone, and a stage made for it alone too.
                left = self.store.drop_usage(self.plugin_id, volume.namespace, volume.id, usage.key, alloc_id)
                if staged_here:
                    # Others use it (their stage was never recorded), or the unstage fails: record
                    # the stage, so the next mount reuses it and the last teardown unstages it.
                    keep = left > 0
                    if not keep:
                        try:
                            self._unstage(volume, paths)
                        except CSIError:
                            keep = True
                    if keep:
                        self.store.set_staged(self.plugin_id, volume.namespace, volume.id, usage.key, True)
                _remove_empty_below(paths.host_target, paths.real_root)
                if left == 0 and not self.store.staged(self.plugin_id, volume.namespace, volume.id, usage.key):
                    # Nothing stages through it (a plugin whose stage is bookkeeping leaves it no
                    # mount point, so rmdir alone would not tell): what this mount made goes.
                    _remove_empty_below(paths.host_stage, paths.real_root)
                raise
            self.store.finish_mount(replace(row, phase="mounted"), staged=staged_here)
            return MountInfo(source=host_target, pinned=pinned)

    def _verify_and_pin(self, volume: Volume, alloc_id: str, usage: UsageOptions, paths: _Paths) -> str:
        """The published target, opened beneath the mount root with no symlink on the way, must be
        a directory (a file or device for a block volume); it is bound onto its pin, which is what
        a task gets. Checked after every publish, a new one or one found in place."""
        host_target = paths.host_target
        block = usage.attachment_mode is AttachmentMode.BLOCK_DEVICE
        where = f'volume "{volume.id}": CSI plugin "{self.plugin_id}" published it at {host_target}'
        pinned = pin_path(self.host_root, volume, alloc_id, usage)
        try:
            fd = open_beneath(paths.real_root, os.path.relpath(host_target, paths.real_root))
        except PinError as err:
            raise CSIError(
                f"{where}, but {err.reason}: a target must be the directory the CO named, so the volume is "
                "unpublished and not handed to the task; check the plugin",
                code="OK",
                call="NodePublishVolume",
                volume=volume.id,
            ) from None
        try:
            kind = kind_of(fd)
            if (kind is Kind.DIRECTORY) == block:
                wanted = "a file or device (block volume)" if block else "a directory"
                raise CSIError(
                    f"{where}, but the target is no {wanted}: the volume is unpublished and not handed to the task; "
                    "check the plugin",
                    code="OK",
                    call="NodePublishVolume",
                    volume=volume.id,
                )
            try:
                private_dir(os.path.dirname(pinned))
                release_pin(pinned)  # a pin of an earlier mount of this use (a restore): made anew
                return pin(fd, os.path.dirname(pinned), os.path.basename(pinned)).path
            except (OSError, PinError) as err:
                raise CSIError(
                    f"{where}, but it cannot be pinned at {pinned} ({getattr(err, 'strerror', None) or err}); "
                    "the volume is unpublished",
                    code="OK",
                    call="NodePublishVolume",
                    volume=volume.id,
                ) from None
        finally:
            os.close(fd)

    def _undo_publish(self, volume: Volume, paths: _Paths) -> None:
        """A publish that cannot be handed on: a symlink the plugin put at the target is unlinked
        (never followed, nor handed to anyone, the plugin included), then NodeUnpublishVolume."""
        host_target = paths.host_target
        try:
            if stat.S_ISLNK(os.lstat(host_target).st_mode):
                os.unlink(host_target)
        except FileNotFoundError:
            pass
        except OSError as err:
            log.warning("cannot remove a symlink at a publish target", extra={"path": host_target, "error": str(err)})
        try:
            self.client.node_unpublish(volume, paths.plugin_target)
        except CSIError as err:
            if is_mounted_at(host_target):
                raise
            log.warning("NodeUnpublishVolume after a refused publish failed", extra={"error": str(err)})
        if os.path.isdir(host_target) and not os.path.islink(host_target):
            try:
                os.rmdir(host_target)
            except OSError:
                pass  # not empty or a mount still: the cleanup leaves what is not ours

    # --- unmount -------------------------------------------------------------------------------

    def unmount(self, volume: Volume, alloc_id: str, usage: UsageOptions) -> None:
        """Unpublish (and unstage when last); succeeds when the mounts are already gone.

        The alloc's use stays recorded as "unmounting" until the last RPC it leads to is done,
        so a restart anywhere in between finishes the teardown (resume_teardowns); the volume's
        lock keeps other operations off these paths and rows meanwhile."""
        with self._lock(volume):
            row = self._usage_row(volume, alloc_id, usage, "unmounting")
            # Persist the intent first: a restart in the middle finishes it (resume_teardowns).
            self.store.set_usage(row)
            paths = self._op_paths(volume, alloc_id, usage)
            host_target, plugin_target = paths.host_target, paths.plugin_target
            # The pin first: it holds the volume's file system too (a block device stays busy).
            release_pin(pin_path(self.host_root, volume, alloc_id, usage))
            # A target that does not stat may be a broken mount (a stale NFS handle): mountinfo.
            if os.path.exists(host_target) or host_target in mount_points():
                try:
                    self.client.node_unpublish(volume, plugin_target)
                except CSIError:
                    if is_mounted_at(host_target):
                        raise
                # OK or NotFound with the target still a mount: the plugin no longer knows it.
                self._unmount_forgotten(volume, paths.real_root, host_target, "NodeUnpublishVolume")
                # Some plugins leave the target behind; the CO owns cleaning the tree.
                if os.path.isdir(host_target):
                    with _dir_work(
                        volume, self.plugin_id, "NodeUnpublishVolume", "remove the unpublished target", host_target
                    ):
                        os.rmdir(host_target)
            key = (self.plugin_id, volume.namespace, volume.id, usage.key, alloc_id)
            if not (self.requires_staging and self.store.others_using(*key) == 0):
                self.store.drop_usage(*key)
                _remove_empty_below(host_target, paths.real_root)
                return
            # The publish side's empty directories go while NodeUnstageVolume runs; the staging
            # path stays for the volume's next stage (see the module's docstring).
            target_side = self._beside_rpc(lambda: _remove_empty_below(host_target, paths.real_root))
            try:
                self._unstage(volume, paths)
            finally:
                wait([target_side])
            target_side.result()
            # A restart before this write unstages again, which the plugin answers as done.
            self.store.finish_unstage(*key)

    def _unstage(self, volume: Volume, paths: _Paths) -> None:
        """NodeUnstageVolume, checked against the mount table; the caller records it and removes
        the staging path."""
        self.client.node_unstage(volume, paths.plugin_stage)
        self._unmount_forgotten(volume, paths.real_root, paths.host_stage, "NodeUnstageVolume")

    def _unmount_forgotten(self, volume: Volume, real_root: str, host_path: str, call: str) -> None:
        """After ``call`` answered OK (or NotFound), ``host_path`` must be no mount. One that still
        is was forgotten by the plugin (restarted without its records, as Nomad's client meets
        too): the CO unmounts it itself, as the plugin would have. Only beneath the plugin's mount
        root, reached without following a symlink (the tree is the plugin's to write), detached
        (a task that still binds it keeps its own mount)."""
        if not is_mounted_at(host_path):
            return
        problem = ""
        for _ in range(_MAX_STACKED_MOUNTS):
            try:
                fd = open_beneath(real_root, os.path.relpath(host_path, real_root))
            except PinError as err:
                problem = err.reason
                break
            try:
                failed = _libc.umount2(os.fsencode(f"/proc/self/fd/{fd}"), _MNT_DETACH) != 0
                errno_ = ctypes.get_errno()
            finally:
                os.close(fd)
            if failed:
                problem = f"unmounting it failed ({os.strerror(errno_)})"
                break
            if not is_mounted_at(host_path):
                log.warning(
                    f'volume "{volume.id}": CSI plugin "{self.plugin_id}" answered {call} but {host_path} was still '
                    "mounted: the plugin had lost its record of it, so the runner unmounted it"
                )
                return
        raise CSIError(
            f'volume "{volume.id}": CSI plugin "{self.plugin_id}" answered {call} but {host_path} is still mounted'
            + (f" and {problem}" if problem else "")
            + f"; check the plugin's logs, or unmount it by hand (umount {host_path})",
            code="OK",
            call=call,
            volume=volume.id,
        )

    @staticmethod
    def _remove_empty_from(leaf: str, real_root: str) -> None:
        """Remove ``leaf`` and its parents up to (not including) the root while they are empty.

        rmdir itself is the test: it fails with ENOTEMPTY on a directory something still lives
        in and with EBUSY on a mount point of this mount namespace (where the kernel refuses to
        remove one), so neither a listing nor mountinfo is read. A missing directory is passed."""
        path, under = leaf, real_root.rstrip("/") + "/"
        while path.startswith(under):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                break  # not empty, a mount point, or no directory: leave it and what holds it
            path = os.path.dirname(path)

    def resume_teardowns(self) -> list[str]:
        """Finish every unmount a previous process started; returns the allocs finished."""
        finished = []
        for row in self.store.usages(self.plugin_id, phase="unmounting"):
            data = json.loads(row.volume_json)
            volume = Volume(
                id=data["id"],
                plugin_id=data["plugin_id"],
                namespace=data["namespace"],
                external_id=data["external_id"],
                secrets=Secrets(),
            )
            usage = UsageOptions(
                AccessMode.parse(data["access_mode"]), AttachmentMode.parse(data["attachment_mode"]), data["read_only"]
            )
            self.unmount(volume, row.alloc_id, usage)
            finished.append(row.alloc_id)
        return finished


def forget_node_use(
    store: StateStore,
    *,
    plugin_id: str,
    host_root: str,
    volume: Volume,
    alloc_id: str,
    usage: UsageOptions,
    requires_staging: bool,
) -> list[str]:
    """Drop one allocation's node-side use of a volume without the plugin (it is gone), which is
    only safe when nothing of it is mounted any more; raises CSIError while something is.

    Returns what could not be undone through the plugin, as phrases for the operator."""
    target = resolve_under(host_root, "per-alloc", alloc_id, volume.id, usage.key, what="the publish path")
    stage = resolve_under(host_root, "staging", volume.namespace, volume.id, usage.key, what="the staging path")
    release_pin(pin_path(host_root, volume, alloc_id, usage))
    entries = read_mountinfo()
    if is_mount_point(target, entries):
        raise CSIError(
            f'volume "{volume.id}": its publish target {target} is still mounted and no instance of CSI plugin '
            f'"{plugin_id}" is registered to unmount it; start the plugin again, or unmount it by hand '
            f"(umount {target})",
            code="UNAVAILABLE",
            call="NodeUnpublishVolume",
            volume=volume.id,
        )
    left = store.drop_usage(plugin_id, volume.namespace, volume.id, usage.key, alloc_id)
    # A target that is gone was unpublished (and removed) through the plugin already: only one
    # still there was left to the operator.
    not_undone = (
        [f"NodeUnpublishVolume of {target} (the plugin was not asked; the target is no mount)"]
        if os.path.lexists(target)
        else []
    )
    if requires_staging and left == 0:
        # Checked whether or not a stage is recorded: a mount that stopped before recording
        # the stage it made leaves one all the same.
        if is_mount_point(stage, entries):
            raise CSIError(
                f'volume "{volume.id}": its staging path {stage} is still mounted and no instance of CSI plugin '
                f'"{plugin_id}" is registered to unstage it; start the plugin again, or unmount it by hand '
                f"(umount {stage})",
                code="UNAVAILABLE",
                call="NodeUnstageVolume",
                volume=volume.id,
            )
        if store.staged(plugin_id, volume.namespace, volume.id, usage.key):
            store.set_staged(plugin_id, volume.namespace, volume.id, usage.key, False)
            not_undone.append(f"NodeUnstageVolume of {stage} (the plugin was not asked; the path is no mount)")
    for leaf, layout_dir in ((target, "per-alloc"), (stage if left == 0 else "", "staging")):
        path, kept = leaf, os.path.join(host_root.rstrip("/"), layout_dir)
        stop = kept if leaf.startswith(kept + "/") else host_root.rstrip("/")  # the layout dir is kept
        while path and path.startswith(stop + "/"):
            try:
                if os.path.isdir(path) and not is_mount_point(path, entries):
                    os.rmdir(path)
            except OSError:
                break
            path = os.path.dirname(path)
    return not_undone


def controller_publish(controller: CSIClient, volume: Volume, csi_node_id: str, usage: UsageOptions) -> dict[str, str]:
    """ControllerPublishVolume when the plugin needs it, with the plugin's CSI node id (never ours)."""
    if _PUBLISH not in controller.controller_capabilities():
        return {}
    capability = VolumeCapability(usage.access_mode, usage.attachment_mode, volume.mount_options)
    # Nomad sends readonly for read claims even without PUBLISH_READONLY.
    return controller.controller_publish(volume, csi_node_id, capability, readonly=usage.read_only)


def controller_unpublish(controller: CSIClient, volume: Volume, csi_node_id: str) -> None:
    if _PUBLISH in controller.controller_capabilities():
        controller.controller_unpublish(volume, csi_node_id)
