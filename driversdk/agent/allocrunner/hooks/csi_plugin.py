"""CSI plugin supervision, for tasks with a ``csi_plugin`` block (task hook) and the shared
mount under ``<data_dir>/client/csi`` their bidirectional mounts need (alloc hook).

Before the task starts the supervisor lays out the plugin's socket and staging dirs and hands
the task two bidirectional mounts and ``CSI_ENDPOINT``; once it runs, probe until healthy (or
the health timeout fails the task), register, heartbeat; on stop deregister; after the task is
gone remove the socket dir, and the plugin's empty mount tree once no instance of it is left.
See :mod:`driversdk.agent.csi.pluginsupervisor`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from driversdk.agent.allocrunner.hooks import AllocHook, TaskHook
from driversdk.agent.csi.pluginsupervisor import PluginSupervisor, csi_dir, release_shared
from driversdk.agent.csi.volumewatcher import start_background, stop_background
from driversdk.agent.events import RunEvent
from driversdk.model import FSIsolation

if TYPE_CHECKING:
    from driversdk.agent.allocrunner.allocrunner import AllocRunner
    from driversdk.agent.allocrunner.taskrunner import TaskRunner


class CSIPluginSupervisorHook(TaskHook):
    name = "csi plugin supervisor"

    def __init__(self) -> None:
        self.supervisor: PluginSupervisor | None = None

    def prerun(self, task: TaskRunner) -> None:
        record = task.restoring
        if task.task.csi_plugin is None or (record is not None and record.state not in ("running", "restarting")):
            return
        alloc = task.alloc
        self.supervisor = PluginSupervisor(
            task=task.task,
            alloc_id=alloc.alloc_id,
            data_dir=alloc.client.data_dir,
            registry=alloc.node.registry,
            say=lambda _: None,
            event=lambda text: task.event(text, kind="plugin"),
            fs_isolated=task.caps.fs_isolation != FSIsolation.NONE,
        )
        mounts, env = self.supervisor.prestart()
        if record is None:  # a recovered task has its mounts and environment already
            task.mount_requests += mounts
            task.env.update(env)

    def poststart(self, task: TaskRunner) -> None:
        if self.supervisor is not None:
            self.supervisor.start(task.fail, task.done)
            task.alloc.node.supervisors.append(self.supervisor)

    def stop(self, task: TaskRunner) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()

    def postrun(self, task: TaskRunner) -> None:
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

    def prerun(self, alloc: AllocRunner) -> None:
        def say(volume: str, text: str) -> None:
            alloc.emit(RunEvent("volume", text, name=volume) if volume else RunEvent("run", text))

        start_background(alloc.client.data_dir, alloc.node.registry, say)
        self._watching = True

    def postrun(self, alloc: AllocRunner) -> None:
        if any(t.csi_plugin is not None for t in alloc.group.tasks):
            release_shared(csi_dir(alloc.client.data_dir))
        if self._watching:
            self._watching = False
            stop_background(alloc.client.data_dir)
