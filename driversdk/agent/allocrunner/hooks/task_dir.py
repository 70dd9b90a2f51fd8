"""Task dir hook: ``<alloc>/<task>/{local,private,tmp,secrets}`` (``secrets/`` 0700 and owned by
the task's user) and the task's environment as Nomad's client builds it
(:func:`driversdk.jobspec.taskenv.build`: ``NOMAD_*`` with the real allocation, its ports and
this node, then the job's ``env`` interpolated)."""

from __future__ import annotations

import os
import pwd

from driversdk.agent.allocrunner.hooks import TaskHook
from driversdk.agent.allocrunner.hooks.contract import TaskPrerunRequest, TaskPrerunResponse
from driversdk.jobspec import taskenv
from driversdk.model import FSIsolation
from driversdk.paths import resolve_under

SECRETS_DIR_MODE = 0o700


class TaskDirHook(TaskHook):
    name = "task dir"

    def prerun(self, req: TaskPrerunRequest) -> TaskPrerunResponse:
        if req.restoring is not None:
            return TaskPrerunResponse()  # the recovered task's config (dirs, env) comes back with its handle
        task = req.task
        alloc = task.alloc
        # The task name comes from the job: validate refuses unsafe names, and this refuses any
        # path that would still leave the alloc dir.
        task_dir = resolve_under(alloc.alloc_dir, task.task.name, what=f'the task dir of task "{task.task.name}"')
        for sub in ("local", "private", "tmp"):
            os.makedirs(os.path.join(task_dir, sub), exist_ok=True)
        make_secrets_dir(os.path.join(task_dir, "secrets"), task_owner(task.task.user, task.caps.fs_isolation))
        # Nomad's task environment (client/taskenv): the allocation, its ports, the node; the
        # dirs inside the task's root, or on the host for a driver without one (raw_exec).
        built = taskenv.build(
            alloc.job,
            alloc.group,
            task.task,
            taskenv.Alloc(id=alloc.alloc_id, index=alloc.index, dir=alloc.alloc_dir, ports=req.ports),
            node=alloc.services.node(),
            fs_isolation=task.caps.fs_isolation != FSIsolation.NONE,
        )
        return TaskPrerunResponse(env=built.env, node_facts=built.node)


def task_owner(user: str, isolation: FSIsolation) -> tuple[int, int] | None:
    """The host uid/gid a task's user maps to, where that can be known: a numeric ``uid[:gid]``
    always; a name only for drivers that run tasks as host users (their root file system is the
    host's). A name inside a container image (docker) has no host meaning: None."""
    name, _, group = user.partition(":")
    if not name:
        return (0, 0)
    if name.isdigit():
        uid = int(name)
        gid = int(group) if group.isdigit() else uid
        return (uid, gid)
    if isolation == FSIsolation.IMAGE:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return (entry.pw_uid, entry.pw_gid)


def make_secrets_dir(path: str, owner: tuple[int, int] | None) -> None:
    """``secrets/`` is 0700 and belongs to the task's user: no other local user reads a task's
    secrets. Created without following a symlink a task may have planted there."""
    try:
        os.mkdir(path, SECRETS_DIR_MODE)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, SECRETS_DIR_MODE)
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)
