"""Task dir hook: ``<alloc>/<task>/{local,private,tmp,secrets}`` (``secrets/`` 0700 and owned by
the task's user) and the task's environment (``NOMAD_*``, then the job's ``env``)."""

from __future__ import annotations

import os
import pwd
from typing import TYPE_CHECKING

from driversdk.model import FSIsolation
from driversdk.paths import resolve_under
from driversdk.runner.hooks import TaskHook

if TYPE_CHECKING:
    from driversdk.runner.taskrunner import TaskRunner

SECRETS_DIR_MODE = 0o700


class TaskDirHook(TaskHook):
    name = "task dir"

    def prerun(self, task: TaskRunner) -> None:
        if task.restoring is not None:
            return  # the recovered task's config (dirs, env) comes back with its handle
        alloc = task.alloc
        # The task name comes from the job: validate refuses unsafe names, and this refuses any
        # path that would still leave the alloc dir.
        task_dir = resolve_under(alloc.alloc_dir, task.task.name, what=f'the task dir of task "{task.task.name}"')
        for sub in ("local", "private", "tmp"):
            os.makedirs(os.path.join(task_dir, sub), exist_ok=True)
        make_secrets_dir(os.path.join(task_dir, "secrets"), task_owner(task.task.user, task.caps.fs_isolation))
        task.env.update(
            {
                "NOMAD_ALLOC_ID": alloc.alloc_id,
                "NOMAD_ALLOC_INDEX": str(alloc.index),
                "NOMAD_JOB_NAME": alloc.job.name,
                "NOMAD_GROUP_NAME": alloc.group.name,
                "NOMAD_TASK_NAME": task.task.name,
                **task_dir_env(alloc.alloc_dir, task_dir, task.caps.fs_isolation),
            }
        )


def task_dir_env(alloc_dir: str, task_dir: str, isolation: FSIsolation) -> dict[str, str]:
    """Where the task finds its dirs, as Nomad's client says it: inside the task's own root for a
    driver that gives it one (chroot, image), on the host for a driver that runs it in the host's
    file system (raw_exec), where ``/local`` would be a host directory nobody made for it."""
    if isolation == FSIsolation.NONE:
        return {
            "NOMAD_ALLOC_DIR": os.path.join(alloc_dir, "alloc"),
            "NOMAD_TASK_DIR": os.path.join(task_dir, "local"),
            "NOMAD_SECRETS_DIR": os.path.join(task_dir, "secrets"),
        }
    return {"NOMAD_ALLOC_DIR": "/alloc", "NOMAD_TASK_DIR": "/local", "NOMAD_SECRETS_DIR": "/secrets"}


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
