"""Alloc dir hook: the shared ``alloc/`` directory of an allocation (logs, tmp, data)."""

from __future__ import annotations

import os

from driversdk.agent.allocrunner.hooks import AllocHook
from driversdk.agent.allocrunner.hooks.contract import AllocPrerunRequest, AllocPrerunResponse
from driversdk.paths import UnsafePathError
from driversdk.pinning import Kind, PinError, kind_of, open_beneath

ALLOC_SUBDIRS = ("alloc/logs", "alloc/tmp", "alloc/data")


class AllocDirHook(AllocHook):
    name = "alloc dir"

    def prerun(self, req: AllocPrerunRequest) -> AllocPrerunResponse:
        alloc = req.alloc
        # alloc.alloc_dir was resolved under the data dir where it was built; recreating what a
        # killed run made is harmless, so restoring takes the same path. But a killed run's tasks
        # could write alloc/: what they left where a dir belongs (a file, a symlink to a host
        # dir) is refused, never followed, since the runner later hands these dirs to tasks.
        where = f'allocation {alloc.alloc_id[:8]} of job "{alloc.job.name}"'
        os.makedirs(alloc.alloc_dir, exist_ok=True)  # under the data dir, where no task writes
        for sub in ALLOC_SUBDIRS:
            try:
                fd = open_beneath(alloc.alloc_dir, sub, create_dirs=True)
            except PinError as err:
                raise UnsafePathError(f"{where}: {err.reason}; remove it and run the job again") from None
            try:
                if kind_of(fd) is not Kind.DIRECTORY:
                    raise UnsafePathError(
                        f"{where}: {os.path.join(alloc.alloc_dir, sub)} is not a directory (a task left something "
                        "else there); remove it and run the job again"
                    )
            finally:
                os.close(fd)
        return AllocPrerunResponse()
