"""The driver's door to the docker SDK: :mod:`drivers.docker.engine`, loaded on first use.

``sdk.APIError``, ``sdk.docker.APIClient``, ... import the SDK the first time any of them is looked
up (an ``except sdk.NotFound:`` clause only when an exception reaches it), from whichever thread
gets there first; Python's import lock makes the others wait for the one load. Type checkers see
:mod:`drivers.docker.engine` itself (driver.py imports it under TYPE_CHECKING).
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # dunder probes (copy, pickle, doctest) must not load the SDK
        raise AttributeError(name)
    return getattr(importlib.import_module("drivers.docker.engine"), name)


def load() -> None:
    """Load the SDK now (the plugin's preload does, after the light part of the driver is built)."""
    importlib.import_module("drivers.docker.engine")
