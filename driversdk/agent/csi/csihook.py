"""The alloc-level CSI hook of ``driversdk run``: claim, wait for the node plugin, (controller)
publish, stage and publish each CSI volume of a group; undo all of it on the way out.

Claims live in the volume store (one transaction each, so two runs cannot share the last slot);
mounts go through :class:`NodeVolumeManager`, which records its own progress so a teardown that
was interrupted is finished later. What each volume became is saved as a stub in the run state,
so a restarted run finds its mounts again instead of claiming a second time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from driversdk.agent import interrupts
from driversdk.agent.csi.manager import MountInfo, NodeVolumeManager, UsageOptions, controller_publish, is_pin
from driversdk.agent.csi.pluginsupervisor import live_instance, wait_for_live_plugin
from driversdk.agent.csi.registry import PluginRegistration, PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.agent.csi.volumes import (
    NODE_DETACHED,
    TAKEN,
    UNPUBLISHING,
    Claim,
    ClaimDetail,
    VolumeError,
    VolumeStore,
)
from driversdk.agent.csi.volumewatcher import VolumeWatcher
from driversdk.csi.cancel import CallCancelled, Cancel
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.csi.fingerprint import fingerprint
from driversdk.csi.model import AccessMode, AttachmentMode, MountOptions, Volume
from driversdk.errors import DriverSDKError
from driversdk.jobspec.job import Group, Job, VolumeRequest
from driversdk.mountinfo import is_mount_point

WAIT_FOR_PLUGIN = 60.0  # Nomad's csi_hook waits one minute for a node plugin
TEARDOWN_ATTEMPTS = 3


class CSIHookError(DriverSDKError):
    """A CSI volume of a group could not be claimed or mounted."""


@dataclass(frozen=True)
class VolumeStub:
    """What one mounted CSI volume of an alloc needs to be found again and torn down."""

    request: str
    volume_id: str
    namespace: str
    plugin_id: str
    mode: str
    access_mode: str
    attachment_mode: str
    read_only: bool
    source: str
    """What the task mounts: the pinned target (manager.pin_path), never the plugin's own tree."""
    csi_node_id: str
    controller_published: bool
    requires_staging: bool

    @property
    def usage(self) -> UsageOptions:
        return UsageOptions(
            AccessMode.parse(self.access_mode), AttachmentMode.parse(self.attachment_mode), self.read_only
        )


def source_id(req: VolumeRequest, alloc_index: int) -> str:
    """The registered volume an alloc claims: ``source[index]`` for per_alloc volumes, as Nomad."""
    return f"{req.source}[{alloc_index}]" if req.per_alloc else req.source


class CSIHook:
    def __init__(
        self,
        *,
        job: Job,
        group: Group,
        alloc_id: str,
        alloc_index: int,
        volumes: VolumeStore,
        registry: PluginRegistry,
        store: StateStore,
        say: Callable[[str, str], None],
        persist: Callable[[str], None],
        watcher: VolumeWatcher,
        wait_for_plugin: float = WAIT_FOR_PLUGIN,
        plugin_failure: Callable[[str], str | None] | None = None,
    ) -> None:
        self.job = job
        self.group = group
        self.alloc_id = alloc_id
        self.alloc_index = alloc_index
        self.volumes = volumes
        self.registry = registry
        self.store = store
        self.say = say
        self._persist = persist
        self.wait_for_plugin = wait_for_plugin
        self.plugin_failure = plugin_failure or (lambda _: None)
        self.watcher = watcher
        self.stubs: dict[str, VolumeStub] = {}
        # The run's first interrupt ends the claims' waits and CSI calls (see runner.interrupts).
        run = interrupts.of(watcher.data_dir)
        self._cancel: Cancel | None = run.setup if run is not None else None

    @property
    def requests(self) -> list[VolumeRequest]:
        return [r for r in self.group.volumes.values() if r.type == "csi"]

    def sources(self) -> dict[str, str]:
        """Volume request name → published host path, for the volume hook."""
        return {name: stub.source for name, stub in self.stubs.items()}

    def save(self) -> None:
        self._persist(json.dumps([asdict(s) for s in self.stubs.values()], sort_keys=True))

    # --- prerun --------------------------------------------------------------------------------

    def prerun(self) -> dict[str, str]:
        """Claim and mount every CSI volume; on any failure undo what was done and raise."""
        try:
            for req in self.requests:
                self._claim_and_mount(req)
        except BaseException:
            self.postrun()
            raise
        return self.sources()

    def _where(self, req: VolumeRequest) -> str:
        return f'group "{self.group.name}" volume "{req.name}"'

    def _plugin(self, volume: Volume, req: VolumeRequest) -> PluginRegistration:
        """WaitForPlugin, in slices, so a plugin task of this same run that failed ends the wait."""
        deadline = time.monotonic() + self.wait_for_plugin
        while True:
            failure = self.plugin_failure(volume.plugin_id)
            if failure is not None:
                raise CSIHookError(
                    f"{self._where(req)}: mounting volumes: csi-node plugin '{volume.plugin_id}' did not become "
                    f"ready: its task in this job failed: {failure}"
                )
            try:
                return wait_for_live_plugin(
                    self.registry,
                    "csi-node",
                    volume.plugin_id,
                    min(1.0, max(0.0, deadline - time.monotonic())),
                    self._cancel,
                )
            except CallCancelled:
                raise
            except CSIError:
                if time.monotonic() >= deadline:
                    raise CSIHookError(
                        f"{self._where(req)}: mounting volumes: csi-node plugin '{volume.plugin_id}' did not become "
                        f"ready: no instance registered within {self.wait_for_plugin:g}s; check that the plugin's "
                        "task is running and healthy"
                    ) from None

    def _claim_and_mount(self, req: VolumeRequest) -> None:
        volume_id = source_id(req, self.alloc_index)
        volume = self.volumes.get(volume_id, self.job.namespace)
        where = self._where(req)
        if volume is None:
            raise CSIHookError(
                f'{where}: claiming volumes: could not claim volume "{volume_id}": it is not registered in '
                f'namespace "{self.job.namespace}"; register it with `driversdk volume register <file>`'
            )
        # Past claims of the volume are released first when they can be; they never block the claim.
        self.watcher.reap(volume_id=volume.id, namespace=volume.namespace, wait=0)
        mode = "read" if req.read_only else "write"
        detail = ClaimDetail(plugin_id=volume.plugin_id, read_only=req.read_only)
        claim = Claim(self.job.namespace, volume.id, self.alloc_id, self.job.name, mode, req.access_mode,
                      req.attachment_mode, detail=detail.to_json())  # fmt: skip
        try:
            self.volumes.claim(claim)
        except VolumeError as err:
            raise CSIHookError(f'{where}: claiming volumes: could not claim volume "{volume_id}": {err}') from None
        usage = UsageOptions(
            AccessMode.parse(req.access_mode),
            AttachmentMode.parse(req.attachment_mode),
            req.read_only,
            MountOptions(req.fs_type, req.mount_flags) if req.has_mount_options else None,
        )
        try:
            reg = self._plugin(volume, req)
            node = CSIClient(reg.socket_path, plugin=volume.plugin_id, cancel=self._cancel)
            try:
                facts = fingerprint(node, volume.plugin_id)
                if not facts.healthy or facts.node is None:
                    raise CSIHookError(
                        f'{where}: mounting volumes: CSI plugin "{volume.plugin_id}" is not healthy: '
                        f"{facts.health_description}; check the plugin task's logs"
                    )
                detail.csi_node_id = facts.node.node_id
                detail.requires_staging = facts.requires_staging
                detail.host_root = reg.options.get("MountPoint", "")
                detail.plugin_root = reg.options.get("ContainerMountPoint", "")
                context: dict[str, str] = {}
                if facts.requires_controller:
                    # Intent first: a kill during the call still leaves the unpublish to do.
                    detail.controller_published = True
                    self.volumes.set_detail(volume.id, volume.namespace, self.alloc_id, detail)
                    context = self._controller_publish(volume, req, detail.csi_node_id, usage)
                manager = self._manager(node, reg, facts.requires_staging)
                detail.node_mounting = True
                detail.source = manager.publish_paths(volume, self.alloc_id, usage)[0]
                self.volumes.set_detail(volume.id, volume.namespace, self.alloc_id, detail)
                try:
                    info: MountInfo = manager.mount(volume, self.alloc_id, usage, context)
                finally:
                    manager.close()
            finally:
                node.close()
        except CallCancelled:
            # The call may have done its work before it was given up: the node side is released
            # like a mounted volume's (unpublish when there is a target, unstage when last).
            self._undo_claim(volume, node_side=True)
            raise
        except CSIError as err:
            self._undo_claim(volume)
            raise CSIHookError(f"{where}: mounting volumes: {err}") from None
        except BaseException:
            self._undo_claim(volume)
            raise
        self.stubs[req.name] = VolumeStub(
            req.name, volume.id, volume.namespace, volume.plugin_id, mode, req.access_mode, req.attachment_mode,
            req.read_only, info.pinned, detail.csi_node_id, detail.controller_published, facts.requires_staging,
        )  # fmt: skip
        self.save()
        self.say(req.name, f'CSI volume "{volume.id}" mounted at {info.source}')

    def _manager(self, node: CSIClient, reg: PluginRegistration, requires_staging: bool) -> NodeVolumeManager:
        return NodeVolumeManager(
            node,
            plugin_id=reg.name,
            host_root=reg.options.get("MountPoint", ""),
            plugin_root=reg.options.get("ContainerMountPoint") or None,
            store=self.store,
            requires_staging=requires_staging,
        )

    def _controller_publish(
        self, volume: Volume, req: VolumeRequest, csi_node_id: str, usage: UsageOptions
    ) -> dict[str, str]:
        reg = live_instance(self.registry, "csi-controller", volume.plugin_id)
        if reg is None:
            raise CSIHookError(
                f'{self._where(req)}: claiming volumes: CSI plugin "{volume.plugin_id}" needs a controller but no '
                "controller instance is registered; run a csi_plugin task of type controller or monolith"
            )
        controller = CSIClient(reg.socket_path, plugin=volume.plugin_id, cancel=self._cancel)
        try:
            return controller_publish(controller, volume, csi_node_id, usage)
        finally:
            controller.close()

    def _undo_claim(self, volume: Volume, *, node_side: bool = False) -> None:
        """A claim whose mount failed: the volume manager undid the node side already (unless
        ``node_side``: a call given up on an interrupt), so what is left is the controller side;
        what cannot be undone now stays a past claim for the watcher."""
        state = UNPUBLISHING if node_side else NODE_DETACHED
        self.volumes.set_claim_state(volume.id, volume.namespace, self.alloc_id, state)
        error = self._release(volume.id, volume.namespace)
        if error is not None:
            self.say(volume.id, f"{error}; the past claim is released later by the volume watcher")

    def _release(self, volume_id: str, namespace: str) -> str | None:
        """Release this alloc's (past) claim on a volume, retried while its budget lasts (one
        attempt once the run is interrupted); None when it is freed."""
        error = None
        run = interrupts.of(self.watcher.data_dir)
        budget = time.monotonic() + (run.call_timeout() if run is not None else interrupts.TEARDOWN_CALL_TIMEOUT)
        for attempt in range(1, TEARDOWN_ATTEMPTS + 1):
            outcome = self.watcher.reap(volume_id=volume_id, namespace=namespace, alloc_id=self.alloc_id, force=True)
            if self.volumes.get_claim(volume_id, namespace, self.alloc_id) is None:
                return None
            error = outcome.failed[0][1] if outcome.failed else "another volume watcher pass is still releasing it"
            # A plugin that did not answer in time will not the next second either: the watcher
            # of a later command tries again.
            if attempt == TEARDOWN_ATTEMPTS or time.monotonic() + attempt > budget:
                break
            if run is not None and (run.interrupted or run.teardown.wait(attempt)):
                break
            if run is None:
                time.sleep(attempt)
        return error

    # --- restore -------------------------------------------------------------------------------

    def restore(self, saved: str | None) -> dict[str, str]:
        """After a restart: keep mounts that are still there, mount again the ones that are not."""
        for data in json.loads(saved or "[]"):
            stub = VolumeStub(**data)
            self.stubs[stub.request] = stub
            if is_pin(stub.source) and is_mount_point(stub.source):
                continue  # the pin outlived the run: it still holds the target as it was verified
            volume = self.volumes.get(stub.volume_id, stub.namespace)
            req = self.group.volumes.get(stub.request)
            if volume is None or req is None:
                raise CSIHookError(
                    f'group "{self.group.name}" volume "{stub.request}": restoring mounts: CSI volume '
                    f'"{stub.volume_id}" is no longer registered or requested'
                )
            reg = self._plugin(volume, req)
            node = CSIClient(reg.socket_path, plugin=volume.plugin_id, cancel=self._cancel)
            manager = self._manager(node, reg, stub.requires_staging)
            try:
                info = manager.mount(volume, self.alloc_id, stub.usage)
            except CallCancelled:
                raise
            except CSIError as err:
                raise CSIHookError(
                    f'group "{self.group.name}" volume "{stub.request}": restoring mounts: {err}'
                ) from None
            finally:
                manager.close()
                node.close()
            self.stubs[stub.request] = VolumeStub(**{**data, "source": info.pinned})
        # A run killed between a claim and its stub: claim (idempotent for this alloc) and mount now.
        for req in self.requests:
            if req.name not in self.stubs:
                self._claim_and_mount(req)
        self.save()
        return self.sources()

    # --- postrun -------------------------------------------------------------------------------

    def postrun(self) -> list[str]:
        """Make each claim a past claim and release it (node unpublish, unstage when last,
        controller unpublish, free), retried. What still fails is returned as sentences; the
        claim stays past, so the volume watcher finishes it later (no new claim waits for it)."""
        failures = []
        for name, stub in list(self.stubs.items()):
            claim = self.volumes.get_claim(stub.volume_id, stub.namespace, self.alloc_id)
            if claim is not None and not claim.details().plugin_id:
                # A claim taken before claims recorded their detail: the stub knows it.
                self.volumes.set_detail(stub.volume_id, stub.namespace, self.alloc_id, _detail_of(stub))
            self.volumes.set_claim_state(
                stub.volume_id, stub.namespace, self.alloc_id, UNPUBLISHING, only_from=(TAKEN,)
            )
            error = self._release(stub.volume_id, stub.namespace)
            if error is not None:
                failures.append(f'volume "{name}" (CSI volume "{stub.volume_id}"): {error}')
                continue
            del self.stubs[name]
            self.save()
            self.say(name, f'CSI volume "{stub.volume_id}" unmounted and released')
        return failures


def _detail_of(stub: VolumeStub) -> ClaimDetail:
    return ClaimDetail(
        plugin_id=stub.plugin_id,
        read_only=stub.read_only,
        host_root="",
        requires_staging=stub.requires_staging,
        csi_node_id=stub.csi_node_id,
        controller_published=stub.controller_published,
        node_mounting=True,
        source=stub.source,
    )
