"""Volume hook: the group's host volumes and the CSI volumes the CSI hook published, as the
task's ``volume_mount``s ask, plus the mounts earlier hooks added (the CSI plugin's dirs), become
driver mounts, checked against the driver's MountConfigs and the host's mount propagation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from driversdk.agent.allocrunner.hooks import TaskHook
from driversdk.mounts import MountRequest, check_mounts

if TYPE_CHECKING:
    from driversdk.agent.allocrunner.taskrunner import TaskRunner


class VolumeMountsHook(TaskHook):
    name = "volume mounts"

    def prerun(self, task: TaskRunner) -> None:
        if task.restoring is not None:
            return  # the recovered task's mounts come back with its handle
        task.mounts = check_mounts(
            volume_requests(task) + task.mount_requests,
            task=task.task.name,
            driver=task.task.driver,
            mount_configs=int(task.caps.mount_configs),
        )


def volume_requests(task: TaskRunner) -> list[MountRequest]:
    alloc = task.alloc
    requests = []
    for mount in task.task.volume_mounts:
        req = alloc.group.volumes[mount.volume]
        if req.type == "csi":
            host_path, kind, read_only = alloc.csi_sources[req.name], "csi", req.read_only or mount.read_only
        else:
            volume = alloc.client.host_volumes[req.source]
            host_path, kind = volume.host_path, "host"
            read_only = volume.read_only or req.read_only or mount.read_only
        requests.append(
            MountRequest(
                volume=req.name,
                destination=task.interpolate(mount.destination),
                host_path=host_path,
                kind=kind,
                propagation=mount.propagation_mode,
                read_only=read_only,
                selinux_label=mount.selinux_label,
            )
        )
    return requests
