"""The docker plugin, with a sidecar that always wins the race: right before the container is
created (after every check the driver makes), each ``volumes`` source inside the alloc dir
whose name ends in ``RACE_SUFFIX`` is moved aside and replaced by ``symlink("/")``, as a
prestart task looping on ``rmdir x && ln -s / x`` does. Run as ``python -m`` of this module."""

from __future__ import annotations

import os
from typing import Any

from drivers.docker.driver import DockerDriver
from drivers.docker.main import main

RACE_SUFFIX = "-raced"
_create = DockerDriver._create


def _swap(task: Any) -> None:
    data = os.path.join(task.alloc_dir, "alloc", "data")
    for name in os.listdir(data):
        path = os.path.join(data, name)
        if name.endswith(RACE_SUFFIX) and not os.path.islink(path):
            os.rename(path, path + ".orig")
            os.symlink("/", path)


def _racing_create(self: DockerDriver, api: Any, task: Any, spec: Any) -> tuple[str, bool]:
    _swap(task)
    return _create(self, api, task, spec)


DockerDriver._create = _racing_create  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
