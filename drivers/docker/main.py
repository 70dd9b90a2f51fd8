"""Entry point of the ``driversdk-docker`` plugin binary."""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING

from driversdk import serve

if TYPE_CHECKING:
    from driversdk.driver import DriverPlugin

# Installed by the `docker` extra, not by `pip install driversdk`.
_EXTRA_MODULES = ("docker", "requests")
# What PluginInfo answers before the driver (and the docker SDK with it) is loaded; the SDK
# checks that DockerDriver says the same once it is built.
NAME = "docker"
VERSION = "0.1.0"


def _build() -> DriverPlugin:
    from drivers.docker.driver import DockerDriver

    return DockerDriver()


def main() -> None:
    try:
        # The docker SDK itself loads with the first call that needs the driver; check now that it is installed.
        for module in _EXTRA_MODULES:
            if importlib.util.find_spec(module) is None:
                raise ModuleNotFoundError(f"No module named {module!r}", name=module)
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] not in _EXTRA_MODULES:
            raise
        # A sentence on stderr, which the host shows, instead of a traceback.
        sys.exit(f"driversdk-docker needs the docker extra ({err.name} is missing): pip install 'driversdk[docker]'")
    serve(_build, name=NAME, version=VERSION)


if __name__ == "__main__":
    main()
