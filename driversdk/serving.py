"""``serve(driver)``: turn a DriverPlugin into a plugin process a Nomad client can load."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from driversdk.plugin.handshake import ENV_CHECKS_ONLY
from driversdk.plugin.server import serve_plugin

if TYPE_CHECKING:
    import grpc

    from driversdk.driver import DriverPlugin
    from driversdk.service import DriverSource

log = logging.getLogger("driversdk.serve")


def launched_for_checks() -> bool:
    """True when the host launched this plugin only to ask for its schemas, its config and a
    fingerprint (``driversdk validate`` does), never to start a task: a driver may skip warming up
    what only tasks need (the docker driver does not load the docker SDK). A task call that comes
    anyway must still work, only slower."""
    return os.environ.get(ENV_CHECKS_ONLY) == "1"


def first_missing(modules: Iterable[str]) -> str | None:
    """The first of ``modules`` that is not installed, or None. Only looked up, not imported: a
    plugin checks its extra before the handshake and loads the module itself afterwards."""
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # an import hook that refuses it outright
            found = False
        if not found:
            return module
    return None


def serve(
    driver: DriverPlugin | Callable[[], DriverPlugin],
    *,
    name: str | None = None,
    version: str | None = None,
    preload: bool = False,
) -> None:
    """Serve ``driver`` over the go-plugin handshake until the host shuts it down.

    Call it from the plugin's ``main()``. It never returns normally: the process exits when
    the host calls Shutdown, or on SIGTERM. Run by hand, it explains that it is a plugin.

    ``driver`` may instead be a function that builds the driver, with its ``name`` and
    ``version``: the plugin then handshakes and answers PluginInfo at once, and builds the driver
    (importing whatever heavy module it needs) on the first call that needs it — or, with
    ``preload``, on a thread of its own as soon as the handshake is out, so the build overlaps
    what the host does before its first call (a call arriving meanwhile waits for the build; a
    build that fails answers every call with why, as without ``preload``).
    """
    from driversdk.driver import DriverPlugin

    if isinstance(driver, DriverPlugin):
        label = driver.name
    elif name and version:
        label = name
    else:
        raise TypeError("serve(factory) needs the driver's name= and version=, which PluginInfo answers with")
    source: DriverSource | None = None

    def register(server: grpc.aio.Server) -> None:
        nonlocal source
        # Imported here so a plugin run by hand (no cookie) exits before paying for protobuf.
        from driversdk.service import DriverSource, register_driver

        source = DriverSource(driver, name=name, version=version)
        register_driver(server, source)

    def on_shutdown() -> None:
        built = source.built if source is not None else None
        if built is None:
            return  # never built: nothing of it to shut down
        try:
            built.shutdown()
        except Exception:
            log.exception("driver shutdown hook failed")

    def on_listening() -> None:
        if preload and source is not None and source.built is None:
            threading.Thread(target=source.preload, daemon=True, name="driver-preload").start()

    serve_plugin(register, name=label, on_shutdown=on_shutdown, on_listening=on_listening)
