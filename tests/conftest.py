"""Settings for the whole suite."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from driversdk.runner.linger import ENV_LINGER


@pytest.fixture(scope="session", autouse=True)
def runs_keep_no_plugins() -> Iterator[None]:
    """Every ``driversdk run`` a test starts shuts its plugins down when it is done, as the tests
    that check nothing is left expect; tests of the plugins a run keeps (tests/runner/test_run_linger.py)
    set the linger time themselves."""
    before = os.environ.get(ENV_LINGER)
    os.environ[ENV_LINGER] = "0"
    yield
    if before is None:
        os.environ.pop(ENV_LINGER, None)
    else:
        os.environ[ENV_LINGER] = before
