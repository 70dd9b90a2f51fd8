"""The hooks of the alloc runner and the task runner, one file each.

A hook implements only the phases it needs; the runners call each phase on every hook in list
order (teardown phases in reverse), so the order of start and teardown is the list in
``allocrunner.ALLOC_HOOKS`` and ``taskrunner.TASK_HOOKS``, and a new hook is a new file plus one
line there. Phases, as Nomad names them:

- ``prerun``: before the allocation's tasks start (alloc) or before StartTask (task); on a
  recovered allocation or task the request's ``restoring`` record is set and the hook takes over
  what the killed run made instead of making it again;
- ``poststart``: the task runs;
- ``stop``: the allocation or task is asked to stop, before its tasks are stopped;
- ``postrun``: the task or allocation is gone: release what prerun made (reverse order);
- ``destroy``: the allocation's state is removed (after postrun);
- ``update``: a running allocation's job changed (driversdk run does not update jobs in place;
  the phase exists so a hook can say what it would do).

Each phase takes its request and returns its response (:mod:`.contract`); no hook module imports
a runner, and no hook writes into one: the runner applies each response, in list order.
"""

from __future__ import annotations

from driversdk.agent.allocrunner.hooks.contract import (
    AllocDestroyRequest,
    AllocPostrunRequest,
    AllocPostrunResponse,
    AllocPrerunRequest,
    AllocPrerunResponse,
    AllocStopRequest,
    AllocUpdateRequest,
    TaskDestroyRequest,
    TaskPostrunRequest,
    TaskPoststartRequest,
    TaskPoststartResponse,
    TaskPrerunRequest,
    TaskPrerunResponse,
    TaskStopRequest,
    TaskUpdateRequest,
)


class AllocHook:
    name = "alloc hook"

    def prerun(self, req: AllocPrerunRequest) -> AllocPrerunResponse:
        """Before any task of the allocation starts."""
        return AllocPrerunResponse()

    def stop(self, req: AllocStopRequest) -> None:
        """The allocation is asked to stop."""

    def postrun(self, req: AllocPostrunRequest) -> AllocPostrunResponse:
        """Every task is gone; undo prerun. Report failures as events, do not raise."""
        return AllocPostrunResponse()

    def destroy(self, req: AllocDestroyRequest) -> None:
        """The allocation is removed."""

    def update(self, req: AllocUpdateRequest) -> None:
        """The allocation's job changed while it ran."""


class TaskHook:
    name = "task hook"

    def prerun(self, req: TaskPrerunRequest) -> TaskPrerunResponse:
        """Before StartTask (or RecoverTask, with ``req.restoring`` set)."""
        return TaskPrerunResponse()

    def poststart(self, req: TaskPoststartRequest) -> TaskPoststartResponse:
        """The task runs."""
        return TaskPoststartResponse()

    def stop(self, req: TaskStopRequest) -> None:
        """The task is asked to stop, before its driver stops it."""

    def postrun(self, req: TaskPostrunRequest) -> None:
        """The task is gone (or never started): undo prerun. Report, do not raise."""

    def destroy(self, req: TaskDestroyRequest) -> None:
        """The task's state is removed."""

    def update(self, req: TaskUpdateRequest) -> None:
        """The task's job changed while it ran."""
