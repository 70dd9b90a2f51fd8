"""The Docker engine stops and starts while a task runs: on a private dockerd, never the shared one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from driversdk.errors import DriverSDKError, PluginCallError
from driversdk.model import TaskEvent, TaskStats
from driversdk.testing import AllocDir, DriverHarness

from .conftest import IMAGE, PAUSE, PLUGIN, busybox
from .private_engine import PrivateEngine, checked_private_engine


class PluginLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def plugin_log() -> Iterator[PluginLog]:
    """Every stderr line of the plugins in the test, as the host re-logs them."""
    logger = logging.getLogger("driversdk.plugin")
    handler, level = PluginLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def private(engine: docker.DockerClient) -> Iterator[PrivateEngine]:
    yield from checked_private_engine([IMAGE])


def _pump(stream: Iterator[Any], into: list[Any], errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            for item in stream:
                into.append(item)
        except DriverSDKError as err:
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_engine_restart_while_a_task_runs_ends_it_with_a_sentence(
    private: PrivateEngine, plugin_log: PluginLog, tmp_path: Path
) -> None:
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    config = {"endpoint": private.endpoint, "gc": {"image": False}, "infra_image": PAUSE}
    script = "echo started; trap 'echo bye; exit 3' TERM; while true; do sleep 0.2; done"
    try:
        with DriverHarness(PLUGIN, plugin_config=config) as h:
            task = alloc.task_config("web", driver_config=busybox("sh", "-c", script))
            h.start(task)
            alloc.wait_for_output("web", b"started")
            events: list[TaskEvent] = []
            stats: list[TaskStats] = []
            errors: list[BaseException] = []
            _pump(h.client.task_events(), events, errors)
            stats_thread = _pump(h.client.task_stats(task.id, interval=0.5), stats, errors)
            deadline = time.monotonic() + 30
            while not stats and time.monotonic() < deadline:
                time.sleep(0.1)
            assert stats, "no stats while the engine ran"

            private.stop()  # SIGTERM: dockerd stops the container on its way out (no live-restore)
            assert not private.answers()
            private.start()

            with pytest.raises(PluginCallError) as info:
                h.client.wait_task(task.id, timeout=120)
            sentence = str(info.value)
            assert "the Docker engine stopped while the task ran" in sentence
            assert "exit code 3" in sentence, "the trap ran: dockerd sent SIGTERM"

            # The stats stream outlived the engine and ended with the task, without an error.
            stats_thread.join(30)
            assert not stats_thread.is_alive()
            assert errors == []
            assert any("Docker engine stopped while the task ran" in e.message for e in events)

            h.client.destroy_task(task.id, force=True)
            h.forget(task.id)
            assert private.client().containers.list(all=True) == []
            # The plugin keeps working against the engine that came back.
            again = alloc.task_config("web", driver_config=busybox("true"))
            h.start(again)
            assert h.client.wait_task(again.id, timeout=60).exit_code == 0
    finally:
        alloc.remove()
    assert not [line for line in plugin_log.lines if "Traceback" in line], "the plugin printed a traceback"
