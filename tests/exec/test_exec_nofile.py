"""The plugin raises its own open-file limit (one pidfd per task it waits for); its tasks get the
limit the plugin was started with, as Nomad's tasks get the agent's (Go restores it for children)."""

from __future__ import annotations

from typing import Any

import pytest

from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import PLUGIN, Tracker, sh
from tests.sdk.nofile import LOW_SOFT, low_soft_nofile

pytestmark = pytest.mark.root


def test_exec_tasks_keep_the_open_file_limit_the_plugin_started_with(
    plugin_config: dict[str, Any], no_leaks: None, track: Tracker
) -> None:
    names = ["first", "second"]
    alloc = AllocDir.create(track.base / "allocs", tasks=names)
    try:
        with low_soft_nofile() as hard:
            if hard <= LOW_SOFT:
                pytest.skip(f"the hard open-file limit {hard} leaves nothing to raise")
            harness = DriverHarness(PLUGIN, plugin_config=plugin_config)
        with harness as h:
            plugin = h.client.process.pid
            # The first task makes the plugin start its process watcher, which raises the limit.
            for name in names:
                task = alloc.task_config(name, driver_config=sh("ulimit -n; ulimit -Hn"))
                h.start(task)
                assert h.client.wait_task(task.id, timeout=60).exit_code == 0
                h.client.destroy_task(task.id, force=False)
                h.forget(task.id)
                assert alloc.wait_for_output(name, b"\n", 30).split() == [str(LOW_SOFT).encode(), str(hard).encode()]
            with open(f"/proc/{plugin}/limits") as fh:
                line = next(x for x in fh if x.startswith("Max open files"))
            assert line.split()[3] == str(hard), f"the plugin did not raise its own limit: {line!r}"
    finally:
        alloc.close()
