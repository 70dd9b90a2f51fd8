"""Entry point of the ``driversdk-raw-exec`` plugin binary (stdlib and driversdk only: no extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from driversdk import serve
from driversdk.mallocarenas import limit_malloc_arenas

if TYPE_CHECKING:
    from driversdk.driver import DriverPlugin


# What PluginInfo answers before the driver is built; the SDK checks that RawExecDriver says the
# same once it is.
NAME = "raw_exec"
VERSION = "0.1.0"


def build(for_checks: bool = False) -> DriverPlugin:
    """The raw_exec driver (``for_checks`` changes nothing: it warms up nothing before a task)."""
    from drivers.raw_exec.driver import RawExecDriver

    return RawExecDriver()


def main() -> None:
    limit_malloc_arenas()  # a long-lived plugin of many threads: see driversdk.mallocarenas
    # Built on a thread of its own once the handshake is out, so importing the driver overlaps
    # the host's own start instead of delaying the handshake.
    serve(build, name=NAME, version=VERSION, preload=True)


if __name__ == "__main__":
    main()
