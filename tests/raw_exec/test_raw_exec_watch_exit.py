"""watch_exit on the raw_exec driver, called in-process as the SDK's server calls it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from drivers.raw_exec.driver import RawExecDriver
from driversdk.testing import AllocDir
from tests.process_drivers import check_watch_exit
from tests.raw_exec.conftest import sh

pytestmark = pytest.mark.root


@pytest.fixture
def driver(plugin_config: dict[str, Any], no_leaks: None) -> Iterator[RawExecDriver]:
    drv = RawExecDriver()
    drv.set_config(plugin_config, None)
    yield drv
    drv.shutdown()


def test_raw_exec_watch_exit_reports_the_exit_once_without_a_thread(driver: RawExecDriver, alloc: AllocDir) -> None:
    check_watch_exit(driver, alloc, "local/go", sh)
