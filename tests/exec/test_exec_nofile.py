"""exec tasks keep the open-file limit their plugin was started with (tests/process_drivers.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.exec.conftest import PLUGIN, Tracker, sh
from tests.process_drivers import check_tasks_keep_nofile

pytestmark = pytest.mark.root


def test_exec_tasks_keep_the_open_file_limit_the_plugin_started_with(
    plugin_config: dict[str, Any], no_leaks: None, track: Tracker
) -> None:
    check_tasks_keep_nofile(PLUGIN, plugin_config, track.base / "allocs", sh)
