"""One exception tree: every exception class driversdk and the bundled drivers define derives
from DriverSDKError, so a caller can catch by meaning at any level."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import drivers
import driversdk
from driversdk.errors import ConfigError, DriverSDKError

# Generated protobuf code is not ours to shape.
_SKIP = ("driversdk.pb",)


def _modules(package: ModuleType) -> list[ModuleType]:
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.startswith(_SKIP) or info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        found.append(importlib.import_module(info.name))
    return found


def _exception_classes() -> dict[str, type[BaseException]]:
    classes: dict[str, type[BaseException]] = {}
    for package in (driversdk, drivers):
        for module in _modules(package):
            for _, obj in inspect.getmembers(module, inspect.isclass):
                # Defined here, not imported from grpc, docker or the stdlib.
                if issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                    classes[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return classes


def test_every_exception_class_is_in_the_tree() -> None:
    classes = _exception_classes()
    # The walk really reached both trees, the drivers' own modules and the CSI stack.
    for known in (
        "driversdk.errors.DriverError",
        "driversdk.csi.errors.CSIError",
        "driversdk.mountinfo.MountinfoError",
        "drivers.docker.pulls.PullStalled",
        "drivers.exec.runc.RuncError",
    ):
        assert known in classes
    outside = {name for name, cls in classes.items() if not issubclass(cls, DriverSDKError)}
    assert outside == set(), f"exception classes outside DriverSDKError: {sorted(outside)}"


def test_former_value_errors_are_still_value_errors() -> None:
    # Callers (and users) that catch ValueError keep working.
    from driversdk.hclspec import LiteralError, SpecError, TypeExprError
    from driversdk.mountinfo import MountinfoError
    from driversdk.mounts import UnknownPropagationError

    for cls in (LiteralError, SpecError, TypeExprError, MountinfoError, UnknownPropagationError):
        assert issubclass(cls, DriverSDKError) and issubclass(cls, ValueError), cls
    # An unknown propagation mode is the operator's config: INVALID_ARGUMENT on the wire.
    assert issubclass(UnknownPropagationError, ConfigError)
    assert str(UnknownPropagationError("up")) == (
        "unknown propagation_mode 'up': use one of 'private', 'host-to-task', 'bidirectional' (empty means 'private')"
    )


def test_pull_stalled_is_a_recoverable_driver_error() -> None:
    from drivers.docker.images import PullStalled
    from driversdk.errors import DriverError

    err = PullStalled("the pull made no progress for pull_activity_timeout (5s)")
    assert isinstance(err, DriverError) and err.recoverable
    assert str(err) == "the pull made no progress for pull_activity_timeout (5s)"
