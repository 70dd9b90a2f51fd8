"""Entry point of the ``driversdk-exec`` plugin binary."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from driversdk import serve
from driversdk.errors import MissingExtraError
from driversdk.mallocarenas import limit_malloc_arenas
from driversdk.serving import first_missing

if TYPE_CHECKING:
    from driversdk.driver import DriverPlugin

# Installed by the `exec` extra, not by `pip install driversdk`.
_EXTRA_MODULES = ("pyroute2",)
# What PluginInfo answers before the driver is built; the SDK checks that ExecDriver says the
# same once it is.
NAME = "exec"
VERSION = "0.1.0"


def build(for_checks: bool = False) -> DriverPlugin:
    """The exec driver (``for_checks`` changes nothing: it warms up nothing before a task)."""
    # pyroute2 itself is imported with the first network; check now that it is installed.
    require_extra()
    try:
        from drivers.exec.driver import ExecDriver
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] not in _EXTRA_MODULES:
            raise
        raise _missing(err.name or _EXTRA_MODULES[0]) from None
    return ExecDriver()


def _missing(module: str) -> MissingExtraError:
    return MissingExtraError(
        f"driversdk-exec needs the exec extra ({module} is missing): pip install 'driversdk[exec]'"
    )


def require_extra() -> None:
    """Refuse, with the command that fixes it, when the exec extra is not installed: looked up
    before the handshake, so the host shows the sentence instead of a plugin that fails every call."""
    module = first_missing(_EXTRA_MODULES)
    if module is not None:
        raise _missing(module)


def main() -> None:
    limit_malloc_arenas()  # a long-lived plugin of many threads: see driversdk.mallocarenas
    try:
        require_extra()
    except MissingExtraError as err:
        sys.exit(str(err))  # a sentence on stderr, which the host shows, instead of a traceback
    # Built on a thread of its own once the handshake is out: importing the driver (its OCI
    # bundle, cgroup and reconcile modules, ~0.1 s) overlaps the host's own start instead of
    # delaying the handshake.
    serve(build, name=NAME, version=VERSION, preload=True)


if __name__ == "__main__":
    main()
