"""CSI plugin supervision, for tasks with a ``csi_plugin`` block (task hook) and the shared
mount under ``<data_dir>/client/csi`` their bidirectional mounts need (alloc hook).

Before the task starts the supervisor lays out the plugin's socket and staging dirs and hands
the task two bidirectional mounts and ``CSI_ENDPOINT``; once it runs, probe until healthy (or
the health timeout fails the task), register, heartbeat; on stop deregister; after the task is
gone remove the socket dir, and the plugin's empty mount tree once no instance of it is left.
See :mod:`driversdk.agent.csi.pluginsupervisor`.
"""

from __future__ import annotations

from driversdk.agent.allocrunner.hooks import AllocHook, TaskHook
from driversdk.agent.allocrunner.hooks.contract import (
    AllocPostrunRequest,
    AllocPostrunResponse,
    AllocPrerunRequest,
    AllocPrerunResponse,
    TaskPostrunRequest,
    TaskPoststartRequest,
    TaskPoststartResponse,
    TaskPrerunRequest,
    TaskPrerunResponse,
    TaskStopRequest,
)
from driversdk.agent.csi.pluginsupervisor import PluginSupervisor, csi_dir, release_shared
from driversdk.agent.csi.volumewatcher import start_background, stop_background
from driversdk.agent.events import RunEvent
from driversdk.model import FSIsolation


class CSIPluginSupervisorHook(TaskHook):
    name = "csi plugin supervisor"

    def __init__(self) -> None:
        self.supervisor: PluginSupervisor | None = None

    def prerun(self, req: TaskPrerunRequest) -> TaskPrerunResponse:
        record, task = req.restoring, req.task
        if task.task.csi_plugin is None or (record is not None and record.state not in ("running", "restarting")):
            return TaskPrerunResponse()
        alloc = task.alloc
        event = task.event
        self.supervisor = PluginSupervisor(
            task=task.task,
            alloc_id=alloc.alloc_id,
            data_dir=alloc.client.data_dir,
            registry=alloc.services.registry,
            say=lambda _: None,
            event=lambda text: event(text, kind="plugin"),
            fs_isolated=task.caps.fs_isolation != FSIsolation.NONE,
        )
        mounts, env = self.supervisor.prestart()
        if record is not None:  # a recovered task has its mounts and environment already
            return TaskPrerunResponse()
        return TaskPrerunResponse(env=env, mount_requests=tuple(mounts))

    def poststart(self, req: TaskPoststartRequest) -> TaskPoststartResponse:
        if self.supervisor is None:
            return TaskPoststartResponse()
        self.supervisor.start(req.fail, req.done)
        return TaskPoststartResponse(csi_supervisor=self.supervisor)

    def stop(self, req: TaskStopRequest) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()

    def postrun(self, req: TaskPostrunRequest) -> None:
        if self.supervisor is not None:
            self.supervisor.cleanup()


class CSIPluginDirHook(AllocHook):
    """A group of plugin tasks made ``<data_dir>/client/csi`` a shared mount (the supervisor did,
    at prerun); once the group's volumes and tasks are gone, undo it if nothing is below.

    Every allocation also holds the run's volume watcher (:mod:`driversdk.agent.csi.volumewatcher`):
    started with the first allocation, it releases past claims in the background (at once when a
    plugin registers) and stops after the last one."""

    name = "csi plugin dir"

    def __init__(self) -> None:
        self._watching = False

    def prerun(self, req: AllocPrerunRequest) -> AllocPrerunResponse:
        emit = req.alloc.services.emit

        def say(volume: str, text: str) -> None:
            emit(RunEvent("volume", text, name=volume) if volume else RunEvent("run", text))

        start_background(req.alloc.client.data_dir, req.alloc.services.registry, say)
        self._watching = True
        return AllocPrerunResponse()

    def postrun(self, req: AllocPostrunRequest) -> AllocPostrunResponse:
        alloc = req.alloc
        if any(t.csi_plugin is not None for t in alloc.group.tasks):
            release_shared(csi_dir(alloc.client.data_dir))
        if self._watching:
            self._watching = False
            stop_background(alloc.client.data_dir)
        return AllocPostrunResponse()
