"""The hooks of the alloc runner and the task runner, one file each.

A hook implements only the phases it needs; the runners call each phase on every hook in list
order (teardown phases in reverse), so the order of start and teardown is the list in
``allocrunner.ALLOC_HOOKS`` and ``taskrunner.TASK_HOOKS``, and a new hook is a new file plus one
line there. Phases, as Nomad names them:

- ``prerun``: before the allocation's tasks start (alloc) or before StartTask (task); on a
  recovered allocation or task the runner's ``restoring`` record is set and the hook takes over
  what the killed run made instead of making it again;
- ``poststart``: the task runs;
- ``stop``: the allocation or task is asked to stop, before its tasks are stopped;
- ``postrun``: the task or allocation is gone: release what prerun made (reverse order);
- ``destroy``: the allocation's state is removed (after postrun);
- ``update``: a running allocation's job changed (driversdk run does not update jobs in place;
  the phase exists so a hook can say what it would do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from driversdk.agent.allocrunner.allocrunner import AllocRunner
    from driversdk.agent.allocrunner.taskrunner import TaskRunner


class AllocHook:
    name = "alloc hook"

    def prerun(self, alloc: AllocRunner) -> None:
        """Before any task of the allocation starts."""

    def stop(self, alloc: AllocRunner) -> None:
        """The allocation is asked to stop."""

    def postrun(self, alloc: AllocRunner) -> None:
        """Every task is gone; undo prerun. Report failures as events, do not raise."""

    def destroy(self, alloc: AllocRunner) -> None:
        """The allocation is removed."""

    def update(self, alloc: AllocRunner) -> None:
        """The allocation's job changed while it ran."""


class TaskHook:
    name = "task hook"

    def prerun(self, task: TaskRunner) -> None:
        """Before StartTask (or RecoverTask, with ``task.restoring`` set)."""

    def poststart(self, task: TaskRunner) -> None:
        """The task runs."""

    def stop(self, task: TaskRunner) -> None:
        """The task is asked to stop, before its driver stops it."""

    def postrun(self, task: TaskRunner) -> None:
        """The task is gone (or never started): undo prerun. Report, do not raise."""

    def destroy(self, task: TaskRunner) -> None:
        """The task's state is removed."""

    def update(self, task: TaskRunner) -> None:
        """The task's job changed while it ran."""
