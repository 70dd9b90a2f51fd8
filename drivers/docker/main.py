"""Entry point of the ``driversdk-docker`` plugin binary."""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
from typing import TYPE_CHECKING

from driversdk import serve
from driversdk.serving import launched_for_checks

if TYPE_CHECKING:
    from driversdk.driver import DriverPlugin

log = logging.getLogger("driversdk.docker")

# Installed by the `docker` extra, not by `pip install driversdk`.
_EXTRA_MODULES = ("docker", "requests")
# What PluginInfo answers before the driver (and the docker SDK with it) is loaded; the SDK
# checks that DockerDriver says the same once it is built.
NAME = "docker"
VERSION = "0.1.0"
SDK_LOAD_SWITCH_INTERVAL = 0.0005


def _build() -> DriverPlugin:
    from drivers.docker.driver import DockerDriver

    driver = DockerDriver()
    # The schemas, the config and a fingerprint are answered without the docker SDK; it loads on a
    # thread of its own meanwhile, so the first StartTask finds it loaded. A plugin launched only
    # for those answers (`driversdk validate`) never needs it: loading it would only slow them.
    if not launched_for_checks():
        threading.Thread(target=_load_sdk, daemon=True, name="docker-sdk-load").start()
    return driver


def _load_sdk() -> None:
    from drivers.docker import sdk

    # Imports hold the GIL for whole switch intervals (5 ms): while this one runs, the calls being
    # answered meanwhile would wait that long at every hand-over. A short interval lets them in.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SDK_LOAD_SWITCH_INTERVAL)
    try:
        sdk.load()
    except Exception:  # the first call that needs the SDK imports it again and answers with why
        log.exception("loading the docker SDK failed")
    finally:
        sys.setswitchinterval(previous)


def main() -> None:
    try:
        # The docker SDK itself loads after the handshake (see _build); check now that it is installed.
        for module in _EXTRA_MODULES:
            if importlib.util.find_spec(module) is None:
                raise ModuleNotFoundError(f"No module named {module!r}", name=module)
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] not in _EXTRA_MODULES:
            raise
        # A sentence on stderr, which the host shows, instead of a traceback.
        sys.exit(f"driversdk-docker needs the docker extra ({err.name} is missing): pip install 'driversdk[docker]'")
    # Preloaded: the driver (and then the SDK) loads while the host is still busy with its own start.
    serve(_build, name=NAME, version=VERSION, preload=True)


if __name__ == "__main__":
    main()
