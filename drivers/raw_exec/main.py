"""Entry point of the ``driversdk-raw-exec`` plugin binary (stdlib and driversdk only: no extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from driversdk import serve

if TYPE_CHECKING:
    from driversdk.driver import DriverPlugin


def build(for_checks: bool = False) -> DriverPlugin:
    """The raw_exec driver (``for_checks`` changes nothing: it warms up nothing before a task)."""
    from drivers.raw_exec.driver import RawExecDriver

    return RawExecDriver()


def main() -> None:
    serve(build())


if __name__ == "__main__":
    main()
