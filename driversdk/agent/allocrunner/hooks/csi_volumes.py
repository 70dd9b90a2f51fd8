"""CSI hook: claim each CSI volume of the group, wait for its node plugin, controller-publish,
stage and publish it (:class:`driversdk.agent.csi.csihook.CSIHook` does the work and records a stub
per volume); on a recovered allocation the stubs are read back instead of claiming again. At
postrun every volume is unpublished, unstaged and released, retried; what could not be undone
stays a past claim (released later by the volume watcher) and marks the allocation failed."""

from __future__ import annotations

from driversdk.agent.allocrunner.hooks import AllocHook
from driversdk.agent.allocrunner.hooks.contract import (
    AllocPostrunRequest,
    AllocPostrunResponse,
    AllocPrerunRequest,
    AllocPrerunResponse,
)
from driversdk.agent.csi.csihook import CSIHook
from driversdk.agent.csi.volumewatcher import VolumeWatcher


class CSIVolumesHook(AllocHook):
    name = "csi volumes"

    def __init__(self) -> None:
        self.csi: CSIHook | None = None

    def prerun(self, req: AllocPrerunRequest) -> AllocPrerunResponse:
        alloc = req.alloc
        if not any(r.type == "csi" for r in alloc.group.volumes.values()):
            return AllocPrerunResponse()
        services, alloc_id = alloc.services, alloc.alloc_id
        self.csi = CSIHook(
            job=alloc.job,
            group=alloc.group,
            alloc_id=alloc_id,
            alloc_index=alloc.index,
            volumes=services.volumes,
            registry=services.registry,
            store=services.csi_state,
            say=lambda volume, text: services.event("volume", text, name=volume),
            persist=lambda text: services.state.alloc_update(alloc_id, csi=text),
            plugin_failure=services.plugin_failure,
            watcher=VolumeWatcher(alloc.client.data_dir, volumes=services.volumes, csi=services.csi_state),
        )
        if req.restoring is not None:
            return AllocPrerunResponse(csi_sources=self.csi.restore(req.restoring.csi))
        return AllocPrerunResponse(csi_sources=self.csi.prerun())

    def postrun(self, req: AllocPostrunRequest) -> AllocPostrunResponse:
        if self.csi is None:
            return AllocPostrunResponse()
        failed = False
        for failure in self.csi.postrun():
            req.alloc.services.event(
                "group",
                f"{failure}; the claim is kept as a past claim, released by the volume watcher of every "
                "`driversdk run` and `driversdk volume` command (see `driversdk volume status`)",
            )
            failed = True
        return AllocPostrunResponse(teardown_failed=failed)
