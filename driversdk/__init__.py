"""driversdk: write Nomad-compatible task-driver plugins in Python.

Plugin side: subclass :class:`DriverPlugin` and call :func:`serve`. Host side: :func:`launch`
a plugin binary and drive it through the returned :class:`DriverClient`.

Imports here are lazy so a plugin process only pays for what it uses at start-up.
"""

from __future__ import annotations

# Not typing.TYPE_CHECKING: importing typing costs ~10 ms, and the log collector process, which
# imports driversdk.errors, starts before each task does (type checkers know this spelling too).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from driversdk.client import DriverClient, launch, reattach
    from driversdk.driver import DriverPlugin, ExecSession
    from driversdk.serving import serve

# The package's version (pyproject reads it from here): nomad.version of a run's node, --version.
__version__ = "0.1.0"

__all__ = ["DriverClient", "DriverPlugin", "ExecSession", "launch", "reattach", "serve"]

_LAZY = {
    "DriverClient": "driversdk.client",
    "launch": "driversdk.client",
    "reattach": "driversdk.client",
    "DriverPlugin": "driversdk.driver",
    "ExecSession": "driversdk.driver",
    "serve": "driversdk.serving",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'driversdk' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
