"""Volume hook: the group's host volumes and the CSI volumes the CSI hook published, as the
task's ``volume_mount``s ask, plus the mounts earlier hooks added (the CSI plugin's dirs), become
driver mounts, checked against the driver's MountConfigs and the host's mount propagation."""

from __future__ import annotations

from driversdk.agent.allocrunner.hooks import TaskHook
from driversdk.agent.allocrunner.hooks.contract import TaskPrerunRequest, TaskPrerunResponse
from driversdk.mounts import MountRequest, check_mounts


class VolumeMountsHook(TaskHook):
    name = "volume mounts"

    def prerun(self, req: TaskPrerunRequest) -> TaskPrerunResponse:
        if req.restoring is not None:
            return TaskPrerunResponse()  # the recovered task's mounts come back with its handle
        task = req.task
        mounts = check_mounts(
            volume_requests(req) + list(req.mount_requests),
            task=task.task.name,
            driver=task.task.driver,
            mount_configs=int(task.caps.mount_configs),
        )
        return TaskPrerunResponse(mounts=tuple(mounts))


def volume_requests(req: TaskPrerunRequest) -> list[MountRequest]:
    alloc = req.task.alloc
    requests = []
    for mount in req.task.task.volume_mounts:
        req_volume = alloc.group.volumes[mount.volume]
        if req_volume.type == "csi":
            host_path, kind = req.csi_sources[req_volume.name], "csi"
            read_only = req_volume.read_only or mount.read_only
        else:
            volume = alloc.client.host_volumes[req_volume.source]
            host_path, kind = volume.host_path, "host"
            read_only = volume.read_only or req_volume.read_only or mount.read_only
        requests.append(
            MountRequest(
                volume=req_volume.name,
                destination=req.interpolate(mount.destination),
                host_path=host_path,
                kind=kind,
                propagation=mount.propagation_mode,
                read_only=read_only,
                selinux_label=mount.selinux_label,
            )
        )
    return requests
