"""Alloc dir hook: the shared ``alloc/`` directory of an allocation (logs, tmp, data)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from driversdk.runner.hooks import AllocHook

if TYPE_CHECKING:
    from driversdk.runner.allocrunner import AllocRunner

ALLOC_SUBDIRS = ("alloc/logs", "alloc/tmp", "alloc/data")


class AllocDirHook(AllocHook):
    name = "alloc dir"

    def prerun(self, alloc: AllocRunner) -> None:
        # alloc.alloc_dir was resolved under the data dir where it was built; recreating what a
        # killed run made is harmless, so restoring takes the same path.
        for sub in ALLOC_SUBDIRS:
            os.makedirs(os.path.join(alloc.alloc_dir, sub), exist_ok=True)
