"""Entry point of the ``driversdk-docker`` plugin binary."""

from __future__ import annotations

import logging
import sys
import threading
from typing import TYPE_CHECKING

from driversdk import serve
from driversdk.errors import MissingExtraError
from driversdk.mallocarenas import limit_malloc_arenas
from driversdk.serving import first_missing, launched_for_checks

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


def require_extra() -> None:
    """Refuse, with the command that fixes it, when the docker extra is not installed. Only
    looked up, not imported: the docker SDK itself loads after the handshake (see build)."""
    module = first_missing(_EXTRA_MODULES)
    if module is not None:
        raise MissingExtraError(
            f"driversdk-docker needs the docker extra ({module} is missing): pip install 'driversdk[docker]'"
        )


def build(for_checks: bool = False) -> DriverPlugin:
    """The docker driver. Its schemas, its config and a fingerprint are answered without the
    docker SDK; the SDK loads on a thread of its own meanwhile, so the first StartTask finds it
    loaded. ``for_checks``: built only for those answers (``driversdk validate``), which never
    need the SDK: it is left to a first use instead of slowing them."""
    require_extra()
    from drivers.docker.driver import DockerDriver

    driver = DockerDriver(warm_up=not for_checks)
    if not for_checks:
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
    limit_malloc_arenas()  # a long-lived plugin of many threads: see driversdk.mallocarenas
    try:
        require_extra()
    except MissingExtraError as err:
        sys.exit(str(err))  # a sentence on stderr, which the host shows, instead of a traceback
    # Preloaded: the driver (and then the SDK) loads while the host is still busy with its own start.
    checks_only = launched_for_checks()
    serve(lambda: build(for_checks=checks_only), name=NAME, version=VERSION, preload=True)


if __name__ == "__main__":
    main()
