"""A driver author's mistakes as sentences: a wrong return type, an exception that is no DriverError.

The SDK calls a driver through :func:`checked`, a thin proxy: what a method returns is checked
against what the SDK needs before anything reads it (a dict where a TaskHandle belongs would
otherwise surface as ``'dict' object has no attribute 'config'``), and an exception other than
:class:`~driversdk.errors.DriverError` becomes one sentence naming the class, the method and the
exception. The host sees that sentence in the call's status; the traceback goes to the plugin's
log for the author.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from driversdk.errors import DriverError

if TYPE_CHECKING:
    from driversdk.driver import DriverPlugin

log = logging.getLogger("driversdk.service")


class DriverMethodError(DriverError):
    """A driver method broke the DriverPlugin contract (returned the wrong type, or raised
    something other than DriverError)."""


def _expectations() -> dict[str, tuple[tuple[type, ...], str]]:
    # Imported on first use: the model and hclspec load after the handshake.
    from driversdk.hclspec import Spec
    from driversdk.model import Capabilities, ExecResult, ExitResult, Fingerprint, TaskHandle, TaskStats, TaskStatus

    none = type(None)
    return {
        "config_schema": ((Spec, none), "a driversdk.hclspec.Spec, or None when the plugin takes no config"),
        "task_config_schema": ((Spec,), "a driversdk.hclspec.Spec (e.g. hs.obj({...}))"),
        "capabilities": ((Capabilities,), "driversdk.model.Capabilities"),
        "fingerprint": ((Fingerprint,), "driversdk.model.Fingerprint"),
        "start_task": ((TaskHandle,), "driversdk.model.TaskHandle (set network_override on it for a network)"),
        "wait_task": ((ExitResult,), "driversdk.model.ExitResult"),
        "inspect_task": ((TaskStatus,), "driversdk.model.TaskStatus"),
        "task_stats": ((TaskStats, none), "driversdk.model.TaskStats, or None once the task has exited"),
        "exec_task": ((ExecResult,), "driversdk.model.ExecResult"),
        "exec_task_streaming": ((ExitResult,), "driversdk.model.ExitResult"),
        "watch_exit": ((bool,), "True (the driver will call back) or False"),
    }


_EXPECTED: dict[str, tuple[tuple[type, ...], str]] | None = None
# Methods whose exceptions are turned into sentences; their return value is not used.
_UNCHECKED_RESULT = {
    "set_config",
    "init",
    "shutdown",
    "recover_task",
    "stop_task",
    "destroy_task",
    "signal_task",
    "destroy_network",
}


def _type_name(value: object) -> str:
    if value is None:
        return "None"
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _check_network(owner: str, value: Any) -> None:
    from driversdk.model import NetworkIsolationSpec

    if not (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], NetworkIsolationSpec)
        and isinstance(value[1], bool)
    ):
        raise DriverMethodError(
            f"{owner}.create_network returned {_type_name(value)}; expected a "
            "(driversdk.model.NetworkIsolationSpec, bool created) tuple"
        )


def _wrap(driver: DriverPlugin, method: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    owner = type(driver).__name__

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        global _EXPECTED
        try:
            value = fn(*args, **kwargs)
        except DriverError:
            raise  # the author's own sentence
        except Exception as err:
            log.error("%s.%s raised", owner, method, exc_info=err)
            detail = str(err) or "(no message)"
            raise DriverMethodError(
                f"{owner}.{method} raised {type(err).__name__}: {detail}; a driver method should raise "
                "driversdk.errors.DriverError with a sentence for the operator"
            ) from err
        if method == "create_network":
            _check_network(owner, value)
            return value
        if method in _UNCHECKED_RESULT:
            return value
        if _EXPECTED is None:
            _EXPECTED = _expectations()
        types, text = _EXPECTED[method]
        if not isinstance(value, types):
            raise DriverMethodError(f"{owner}.{method} returned {_type_name(value)}; expected {text}")
        return value

    return call


_CHECKED = frozenset({"create_network", *_UNCHECKED_RESULT}) | frozenset(
    {
        "config_schema",
        "task_config_schema",
        "capabilities",
        "fingerprint",
        "start_task",
        "wait_task",
        "inspect_task",
        "task_stats",
        "exec_task",
        "exec_task_streaming",
        "watch_exit",
    }
)


class CheckedDriver:
    """``driver`` as the SDK calls it: the contract's methods checked, everything else as is."""

    def __init__(self, driver: DriverPlugin) -> None:
        self._driver = driver

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._driver, name)
        if name in _CHECKED:
            value = _wrap(self._driver, name, value)
        return value


def checked(driver: DriverPlugin) -> DriverPlugin:
    """A proxy of ``driver`` whose contract methods are checked (typed as the driver itself)."""
    proxy: Any = CheckedDriver(driver)
    result: DriverPlugin = proxy
    return result


__all__ = ["CheckedDriver", "DriverMethodError", "checked"]
