"""The volume watcher: every claim ends, as Nomad's ``nomad/volumewatcher`` makes sure.

A claim whose allocation is terminal becomes a past claim (``unpublishing``) and is released in
Nomad's order: node unpublish, node unstage when no other use on this node needs the staging,
(``node-detached``), controller unpublish unless another live claim still uses the volume here,
then the claim is freed. Each step is recorded in ``state.db`` before the next, so a release
interrupted by anything (a kill, a reboot, a plugin that is down) resumes where it stopped; a
step that fails is retried with backoff (1 s doubling to a minute) on the next pass.

Passes run at the start of every ``driversdk volume`` command, in the background of every
``driversdk run`` (every few seconds and whenever a plugin registers), from an allocation's own
teardown, and as ``driversdk volume detach``. Only detach frees a claim whose plugin is gone for
good, and only once nothing of it is mounted; it then says what it could not undo.
"""

from __future__ import annotations

import fcntl
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from driversdk.agent import interrupts
from driversdk.agent.csi.manager import NodeVolumeManager, UsageOptions, controller_unpublish, forget_node_use
from driversdk.agent.csi.pluginsupervisor import csi_dir, live_instance, release_shared
from driversdk.agent.csi.registry import PLUGIN_TYPES, PluginRegistration, PluginRegistry, RegistryEvent
from driversdk.agent.csi.state import StateStore
from driversdk.agent.csi.volumes import NODE_DETACHED, TAKEN, UNPUBLISHING, Claim, ClaimDetail, VolumeStore
from driversdk.csi.cancel import CallCancelled, Cancel
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.csi.model import AccessMode, AttachmentMode, Volume
from driversdk.errors import DriverSDKError
from driversdk.mountinfo import mount_points

BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
PASS_INTERVAL = 5.0  # background passes of a run
LOCK_WAIT = 60.0  # how long an explicit pass waits for another process's pass


class DetachError(DriverSDKError):
    """``volume detach`` could not free a claim."""


def backoff(attempts: int) -> float:
    """Wait after the n-th failed attempt: 1 s, 2 s, 4 s, … at most a minute (Nomad's claim loop)."""
    return float(min(BACKOFF_MAX, BACKOFF_START * 2 ** max(0, attempts)))


@dataclass
class Released:
    claim: Claim
    not_undone: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    released: list[Released] = field(default_factory=list)
    failed: list[tuple[Claim, str]] = field(default_factory=list)


def _claim_name(claim: Claim) -> str:
    return f'claim of alloc {claim.alloc_id[:8]} (job {claim.job}) on CSI volume "{claim.volume_id}"'


class VolumeWatcher:
    """Releases past claims of one data dir; opens its own connections to ``state.db``."""

    def __init__(
        self,
        data_dir: str,
        *,
        volumes: VolumeStore | None = None,
        csi: StateStore | None = None,
        cancel: Cancel | None = None,
    ) -> None:
        """With ``volumes`` and ``csi`` it works on those stores (an allocation's), else its own.
        ``cancel`` ends its CSI calls; without it, those of a run of the data dir end with the
        run's second interrupt and have the run's teardown deadline (see runner.interrupts)."""
        self.data_dir = data_dir
        self.cancel = cancel
        db = os.path.join(data_dir, "state.db")
        self._owned = volumes is None or csi is None
        self.volumes = volumes if volumes is not None and csi is not None else VolumeStore(db)
        self.csi = csi if volumes is not None and csi is not None else StateStore(db)
        self.registry = PluginRegistry(self.csi)
        self._lock_path = os.path.join(data_dir, "volumewatcher.lock")
        self._thread_lock = threading.Lock()

    def _client(self, socket_path: str, plugin_id: str) -> CSIClient:
        run = interrupts.of(self.data_dir)
        cancel = self.cancel or (run.teardown if run is not None else None)
        timeout = run.call_timeout() if run is not None else None
        return CSIClient(socket_path, plugin=plugin_id, cancel=cancel, call_timeout=timeout)

    def _connect(self, reg: PluginRegistration, plugin_id: str, who: str) -> CSIClient | str:
        """A client of the live instance ``reg``, or why there is none (``who`` does not answer); a
        cancelled call is no answer to note but the end of the pass: it propagates."""
        try:
            return self._client(reg.socket_path, plugin_id)
        except CallCancelled:
            raise
        except CSIError as err:
            return f"{who} does not answer ({err})"

    def close(self) -> None:
        if self._owned:
            self.volumes.close()
            self.csi.close()

    @contextmanager
    def _exclusive(self, wait: float) -> Iterator[bool]:
        """One pass at a time per data dir, across processes; yields False when not had in time."""
        got = self._thread_lock.acquire(timeout=wait) if wait > 0 else self._thread_lock.acquire(blocking=False)
        if not got:
            yield False
            return
        try:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                deadline = time.monotonic() + wait
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            yield False
                            return
                        time.sleep(0.1)
                try:
                    yield True
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        finally:
            self._thread_lock.release()

    # --- passes --------------------------------------------------------------------------------

    def denormalize(self) -> list[Claim]:
        """Taken claims whose allocation is terminal become past claims (Nomad's denormalization)."""
        moved = []
        for claim in self.volumes.all_claims():
            if (
                claim.state == TAKEN
                and self.volumes.alloc_terminal(claim.alloc_id)
                and self.volumes.set_claim_state(
                    claim.volume_id, claim.namespace, claim.alloc_id, UNPUBLISHING, only_from=(TAKEN,)
                )
            ):
                moved.append(claim)
        return moved

    def reap(
        self,
        *,
        volume_id: str | None = None,
        namespace: str = "default",
        alloc_id: str | None = None,
        force: bool = False,
        detach: bool = False,
        wait: float = LOCK_WAIT,
    ) -> Outcome:
        """One pass over past claims (of one volume / alloc when given). ``force`` ignores the
        backoff; ``detach`` frees claims whose plugin is gone once nothing of them is mounted."""
        outcome = Outcome()
        with self._exclusive(wait) as had:
            if not had:
                return outcome
            self.denormalize()
            for claim in self.volumes.all_claims():
                if not claim.past:
                    continue
                if volume_id is not None and (claim.volume_id, claim.namespace) != (volume_id, namespace):
                    continue
                if alloc_id is not None and not claim.alloc_id.startswith(alloc_id):
                    continue
                if not force and claim.next_attempt > time.time():
                    continue
                try:
                    outcome.released.append(Released(claim, self.release(claim, detach=detach)))
                    self._release_shared_dir()
                except (CSIError, OSError) as err:
                    error = str(err) if isinstance(err, CSIError) else f"{err.strerror or err} ({err.filename})"
                    if isinstance(err, CallCancelled):
                        error += f"; `driversdk volume detach {claim.volume_id}` releases it once the plugin answers"
                    self.volumes.claim_failed(
                        claim.volume_id, claim.namespace, claim.alloc_id, error, backoff(claim.attempts)
                    )
                    outcome.failed.append((claim, error))
                    if isinstance(err, CallCancelled):
                        break  # every later call of this pass would be given up the same way
        return outcome

    def _release_shared_dir(self) -> None:
        """The plugin tasks made ``<data_dir>/client/csi`` a shared mount and left it while a claim
        still had mounts below; with no plugin left and the claim released, nothing needs it."""
        if any(self.registry.plugins(kind) for kind in PLUGIN_TYPES):
            return
        try:
            # A plugin task that is starting (not registered yet) already has its socket dir.
            if os.listdir(os.path.join(csi_dir(self.data_dir), "plugins")):
                return
        except FileNotFoundError:
            pass
        release_shared(csi_dir(self.data_dir))

    # --- one claim -----------------------------------------------------------------------------

    def release(self, claim: Claim, *, detach: bool = False) -> list[str]:
        """Release one past claim from the step it reached; returns what could not be undone
        (only with ``detach``, when the plugin is gone). Raises CSIError at a step that failed."""
        detail = claim.details()
        plugin_id = detail.plugin_id
        volume = self.volumes.get(claim.volume_id, claim.namespace)
        if volume is None:
            volume = Volume(id=claim.volume_id, plugin_id=plugin_id, namespace=claim.namespace)
        plugin_id = plugin_id or volume.plugin_id
        usage = UsageOptions(
            AccessMode.parse(claim.access_mode), AttachmentMode.parse(claim.attachment_mode), detail.read_only
        )
        not_undone: list[str] = []
        current = claim.state
        if current == NODE_DETACHED and detail.controller_published and self._held_here(volume, plugin_id, detail):
            # Back to the node phase: a stage a failed mount kept (it skips that phase), or a
            # mount left here; ControllerUnpublishVolume must not come before their end.
            self.volumes.set_claim_state(claim.volume_id, claim.namespace, claim.alloc_id, UNPUBLISHING)
            current = UNPUBLISHING
        if current == UNPUBLISHING:
            not_undone += self._node_detach(volume, claim, detail, plugin_id, usage, detach)
            self.volumes.set_claim_state(claim.volume_id, claim.namespace, claim.alloc_id, NODE_DETACHED)
        not_undone += self._controller_detach(volume, claim, detail, plugin_id, detach)
        self.volumes.release(claim.volume_id, claim.namespace, claim.alloc_id)
        return not_undone

    def _node_use(self, plugin_id: str, claim: Claim) -> bool:
        return any(
            u.alloc_id == claim.alloc_id and u.volume_id == claim.volume_id and u.namespace == claim.namespace
            for u in self.csi.usages(plugin_id)
        )

    def _held_here(self, volume: Volume, plugin_id: str, detail: ClaimDetail) -> list[str]:
        """What this node still holds of the volume, by state.db and by the mount table (a plugin
        may have lost its records, so neither is trusted alone), as phrases; empty when nothing."""
        staged, users = self.csi.node_use(plugin_id, volume.namespace, volume.id)
        held = [f"staged ({usage})" for usage in staged] + [f"used by alloc {alloc[:8]}" for alloc in users]
        reg = live_instance(self.registry, "csi-node", plugin_id)
        host_root = detail.host_root or (reg.options.get("MountPoint", "") if reg is not None else "")
        if host_root:
            real_root = os.path.realpath(host_root).rstrip("/")
            for point in sorted(mount_points()):
                parts = point[len(real_root) + 1 :].split("/") if point.startswith(real_root + "/") else []
                if parts[:3] == ["staging", volume.namespace, volume.id] or (
                    len(parts) > 2 and parts[0] == "per-alloc" and parts[2] == volume.id
                ):
                    held.append(f"mounted at {point}")
        return held

    def _node_detach(
        self, volume: Volume, claim: Claim, detail: ClaimDetail, plugin_id: str, usage: UsageOptions, detach: bool
    ) -> list[str]:
        used = self._node_use(plugin_id, claim)
        staged, users = self.csi.node_use(plugin_id, volume.namespace, volume.id)
        # A stage no allocation uses (a failed mount kept it) is unstaged by the claim that finds it.
        orphan = usage.key in staged and not users
        if not used and not detail.node_mounting and not orphan:
            return []  # nothing was ever staged or published for this claim
        reg = live_instance(self.registry, "csi-node", plugin_id)
        host_root = detail.host_root or (reg.options.get("MountPoint", "") if reg is not None else "")
        problem = f'no instance of CSI plugin "{plugin_id}" is registered to unmount it'
        if reg is not None:
            node = self._connect(reg, plugin_id, f'CSI plugin "{plugin_id}"')
            if isinstance(node, str):
                problem = node
            else:
                manager = NodeVolumeManager(
                    node,
                    plugin_id=plugin_id,
                    host_root=reg.options.get("MountPoint", "") or host_root,
                    plugin_root=reg.options.get("ContainerMountPoint") or None,
                    store=self.csi,
                    requires_staging=detail.requires_staging,
                )
                try:
                    manager.unmount(volume, claim.alloc_id, usage)
                finally:
                    manager.close()
                    node.close()
                return []
        if not detach or not host_root:
            raise CSIError(
                f"{problem}; start the plugin again (the volume watcher then finishes), or unmount it by hand and "
                f"run `driversdk volume detach {claim.volume_id}`",
                code="UNAVAILABLE",
                call="NodeUnpublishVolume",
                volume=claim.volume_id,
            )
        return forget_node_use(
            self.csi,
            plugin_id=plugin_id,
            host_root=host_root,
            volume=volume,
            alloc_id=claim.alloc_id,
            usage=usage,
            requires_staging=detail.requires_staging,
        )

    def _controller_detach(
        self, volume: Volume, claim: Claim, detail: ClaimDetail, plugin_id: str, detach: bool
    ) -> list[str]:
        if not detail.controller_published:
            return []
        others = [
            c
            for c in self.volumes.claims(claim.volume_id, claim.namespace)
            if c.alloc_id != claim.alloc_id and c.state == TAKEN and not self.volumes.alloc_terminal(c.alloc_id)
        ]
        if others:
            return []  # another live claim on this node still needs the volume published here
        held = self._held_here(volume, plugin_id, detail)
        if held:
            # The spec forbids ControllerUnpublishVolume while the volume is staged or published
            # on the node: the claim goes back to its node phase and waits there.
            self.volumes.set_claim_state(claim.volume_id, claim.namespace, claim.alloc_id, UNPUBLISHING)
            raise CSIError(
                f'volume "{volume.id}" is still {", ".join(held)} on this node, so ControllerUnpublishVolume waits '
                "until NodeUnpublishVolume and NodeUnstageVolume have ended it here; the volume watcher tries again",
                code="FAILED_PRECONDITION",
                call="ControllerUnpublishVolume",
                volume=volume.id,
            )
        what = f'ControllerUnpublishVolume of volume "{volume.remote_id}" from node "{detail.csi_node_id}"'
        reg = live_instance(self.registry, "csi-controller", plugin_id)
        problem = f'no controller instance of CSI plugin "{plugin_id}" is registered'
        if reg is not None:
            controller = self._connect(reg, plugin_id, f'the controller of CSI plugin "{plugin_id}"')
            if isinstance(controller, str):
                problem = controller
            else:
                try:
                    controller_unpublish(controller, volume, detail.csi_node_id)
                except CallCancelled:
                    raise
                except CSIError as err:
                    raise CSIError(
                        f"could not detach from controller: {err}", code=err.code, call=err.call, volume=volume.id
                    ) from None
                finally:
                    controller.close()
                return []
        if not detach:
            raise CSIError(
                f"could not detach from controller: {problem}; start the plugin again (the volume watcher then "
                f"finishes), or run `driversdk volume detach {claim.volume_id}`",
                code="UNAVAILABLE",
                call="ControllerUnpublishVolume",
                volume=volume.id,
            )
        return [f"{what} ({problem}; the plugin may still count the volume as published there)"]


def describe(released: Released) -> str:
    text = f"released the past {_claim_name(released.claim)}"
    if released.not_undone:
        text += "; could not undo: " + "; ".join(released.not_undone)
    return text


def describe_failure(claim: Claim, error: str) -> str:
    return f"the past {_claim_name(claim)} is not released yet: {error}"


# --- the background watcher of a run ------------------------------------------------------------


# Put on the watcher's event queue by stop(): the thread waits on that queue between passes (up
# to PASS_INTERVAL), and a run's teardown must not wait out that pause. Compared by identity, so
# no registry event can be mistaken for it.
_WAKE = RegistryEvent("stop", PluginRegistration(type="", name="", alloc_id="", socket_path=""))


class BackgroundWatcher:
    """Passes in a thread of ``driversdk run``: at once, every few seconds, and whenever a
    plugin registers (then the claims that waited for it are tried without backoff)."""

    def __init__(
        self, data_dir: str, registry: PluginRegistry, say: Callable[[str, str], None], interval: float = PASS_INTERVAL
    ) -> None:
        run = interrupts.of(data_dir)
        # Its calls end when the run's teardown is abandoned (second interrupt), or at stop().
        self._cancel = run.teardown.child() if run is not None else Cancel()
        self.watcher = VolumeWatcher(data_dir, cancel=self._cancel)
        self.registry = registry
        self.say = say
        self.interval = interval
        self._stop = threading.Event()
        self._events: queue.Queue[RegistryEvent] = registry.subscribe()
        self._thread = threading.Thread(target=self._loop, name="volume watcher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        force = True
        while not self._stop.is_set():
            try:
                outcome = self.watcher.reap(force=force, wait=0)
            except (DriverSDKError, sqlite3.Error) as err:  # a state file problem: say it, keep watching
                self.say("", f"volume watcher: {err}")
                outcome = Outcome()
            for released in outcome.released:
                self.say(released.claim.volume_id, describe(released))
            try:
                event = self._events.get(timeout=self.interval)
            except queue.Empty:
                force = False
                continue
            if event is _WAKE:
                return
            force = event.kind == "registered"

    def stop(self) -> None:
        """End the thread and close its stores. A pass under way has its CSI call cancelled (the
        claim stays past, for the next command's watcher), so this returns at once."""
        self._stop.set()
        self._cancel.cancel("the run is ending")
        self.registry.unsubscribe(self._events)
        self._events.put(_WAKE)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.watcher.close()


_running: dict[str, tuple[BackgroundWatcher, int]] = {}
_running_lock = threading.Lock()


def start_background(data_dir: str, registry: PluginRegistry, say: Callable[[str, str], None]) -> None:
    """One background watcher per data dir and process, shared by the allocations of a run."""
    key = os.path.abspath(data_dir)
    with _running_lock:
        found = _running.get(key)
        if found is None:
            _running[key] = (BackgroundWatcher(key, registry, say), 1)
        else:
            _running[key] = (found[0], found[1] + 1)


def stop_background(data_dir: str) -> None:
    key = os.path.abspath(data_dir)
    with _running_lock:
        found = _running.get(key)
        if found is None:
            return
        if found[1] > 1:
            _running[key] = (found[0], found[1] - 1)
            return
        del _running[key]
    found[0].stop()
