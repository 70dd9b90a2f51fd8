"""CSI hook: claim each CSI volume of the group, wait for its node plugin, controller-publish,
stage and publish it (:class:`driversdk.agent.csi.csihook.CSIHook` does the work and records a stub
per volume); on a recovered allocation the stubs are read back instead of claiming again. At
postrun every volume is unpublished, unstaged and released, retried; what could not be undone
stays a past claim (released later by the volume watcher) and marks the allocation failed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from driversdk.agent.allocrunner.hooks import AllocHook
from driversdk.agent.csi.csihook import CSIHook
from driversdk.agent.csi.volumewatcher import VolumeWatcher

if TYPE_CHECKING:
    from driversdk.agent.allocrunner.allocrunner import AllocRunner


class CSIVolumesHook(AllocHook):
    name = "csi volumes"

    def __init__(self) -> None:
        self.csi: CSIHook | None = None

    def prerun(self, alloc: AllocRunner) -> None:
        if not any(r.type == "csi" for r in alloc.group.volumes.values()):
            return
        node = alloc.node
        self.csi = CSIHook(
            job=alloc.job,
            group=alloc.group,
            alloc_id=alloc.alloc_id,
            alloc_index=alloc.index,
            volumes=node.volumes,
            registry=node.registry,
            store=node.csi_state,
            say=lambda volume, text: alloc.event("volume", text, name=volume),
            persist=lambda text: alloc.state.alloc_update(alloc.alloc_id, csi=text),
            plugin_failure=node.plugin_failure,
            watcher=VolumeWatcher(alloc.client.data_dir, volumes=node.volumes, csi=node.csi_state),
        )
        if alloc.restoring is not None:
            alloc.csi_sources = self.csi.restore(alloc.restoring.csi)
        else:
            alloc.csi_sources = self.csi.prerun()

    def postrun(self, alloc: AllocRunner) -> None:
        if self.csi is None:
            return
        for failure in self.csi.postrun():
            alloc.event(
                "group",
                f"{failure}; the claim is kept as a past claim, released by the volume watcher of every "
                "`driversdk run` and `driversdk volume` command (see `driversdk volume status`)",
            )
            alloc.teardown_failed = True
