"""``serve(driver)``: turn a DriverPlugin into a plugin process a Nomad client can load."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from driversdk.plugin.server import serve_plugin

if TYPE_CHECKING:
    import grpc

    from driversdk.driver import DriverPlugin

log = logging.getLogger("driversdk.serve")


def serve(driver: DriverPlugin) -> None:
    """Serve ``driver`` over the go-plugin handshake until the host shuts it down.

    Call it from the plugin's ``main()``. It never returns normally: the process exits when
    the host calls Shutdown, or on SIGTERM. Run by hand, it explains that it is a plugin.
    """

    def register(server: grpc.Server) -> None:
        # Imported here so a plugin run by hand (no cookie) exits before paying for protobuf.
        from driversdk.service import register_driver

        register_driver(server, driver)

    def on_shutdown() -> None:
        try:
            driver.shutdown()
        except Exception:
            log.exception("driver shutdown hook failed")

    serve_plugin(register, name=driver.name, on_shutdown=on_shutdown)
