"""Entry point of the ``driversdk-exec`` plugin binary."""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING

from driversdk import serve
from driversdk.errors import MissingExtraError

if TYPE_CHECKING:
    from driversdk.driver import DriverPlugin

# Installed by the `exec` extra, not by `pip install driversdk`.
_EXTRA_MODULES = ("pyroute2",)


def build(for_checks: bool = False) -> DriverPlugin:
    """The exec driver (``for_checks`` changes nothing: it warms up nothing before a task)."""
    try:
        # pyroute2 itself is imported with the first network; check now that it is installed.
        for module in _EXTRA_MODULES:
            if importlib.util.find_spec(module) is None:
                raise ModuleNotFoundError(f"No module named {module!r}", name=module)
        from drivers.exec.driver import ExecDriver
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] not in _EXTRA_MODULES:
            raise
        raise MissingExtraError(
            f"driversdk-exec needs the exec extra ({err.name} is missing): pip install 'driversdk[exec]'"
        ) from None
    return ExecDriver()


def main() -> None:
    try:
        driver = build()
    except MissingExtraError as err:
        sys.exit(str(err))  # a sentence on stderr, which the host shows, instead of a traceback
    serve(driver)


if __name__ == "__main__":
    main()
