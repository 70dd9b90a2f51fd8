"""A plugin launched with an idle exit (DRIVERSDK_PLUGIN_IDLE_EXIT, as `driversdk run` launches the
plugins it keeps between runs) stops by itself once it has no task, no network and no call in
flight for that long, and never while it has one: a real hello plugin process, real gRPC."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.client import DriverClient, launch, reattach
from driversdk.plugin.handshake import ENV_IDLE_EXIT
from driversdk.plugin.host import pid_alive
from driversdk.testing import AllocDir
from tests.hostcheck import gone_within

HELLO = [sys.executable, str(Path(__file__).resolve().parents[2] / "examples" / "hello_driver.py")]
IDLE = 0.5
# Long enough, many times over, for a plugin with nothing to do to have stopped; waited on as a
# liveness check (polled), never as a measure of speed.
PATIENCE = 30.0


def stays_alive(pid: int, for_seconds: float) -> bool:
    """Still running after several idle periods (polled the whole time)."""
    deadline = time.monotonic() + for_seconds
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[AllocDir]:
    a = AllocDir.create(tmp_path, tasks=["web"])
    yield a
    a.remove()


def launched(idle_exit: float | None) -> DriverClient:
    plugin = launch(HELLO, name="hello", idle_exit=idle_exit)
    plugin.set_config({})
    return plugin


def test_an_idle_plugin_stops_by_itself_and_removes_its_socket_dir() -> None:
    plugin = launched(IDLE)
    pid, socket_dir = plugin.process.pid, os.path.dirname(plugin.process.address)
    try:
        assert os.path.isdir(socket_dir)
        plugin.disconnect()  # the host goes away, as a finished run does
        assert gone_within(pid, PATIENCE), "a plugin with nothing to do did not stop"
        plugin.process.alive()  # reaps it
        assert not os.path.exists(socket_dir), "the plugin left its socket dir behind"
    finally:
        plugin.kill()


def test_without_an_idle_exit_a_plugin_serves_until_told_to_stop() -> None:
    plugin = launched(None)
    try:
        plugin.disconnect()
        assert stays_alive(plugin.process.pid, 6 * IDLE)
    finally:
        again = reattach(plugin.process.reattach_config, name="hello")
        again.kill()
        plugin.process.alive()


def test_a_plugin_with_a_task_is_never_idle_until_the_task_is_destroyed(alloc: AllocDir) -> None:
    plugin = launched(IDLE)
    pid = plugin.process.pid
    try:
        task = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["300"]})
        plugin.start_task(plugin.encode_task_config(task))
        plugin.disconnect()  # a killed run: its plugin must wait to be reattached, with the task
        assert stays_alive(pid, 6 * IDLE), "a plugin stopped by itself while it ran a task"
        host = reattach(plugin.process.reattach_config, name="hello")
        host.stop_task(task.id, timeout=5, signal="SIGKILL")
        host.wait_task(task.id, timeout=30)
        assert stays_alive(pid, 4 * IDLE), "a stopped task that is not destroyed yet still counts"
        host.destroy_task(task.id, force=True)
        host.disconnect()
        assert gone_within(pid, PATIENCE), "the plugin did not stop once its last task was destroyed"
    finally:
        plugin.kill()


def test_an_open_stream_keeps_a_plugin_busy() -> None:
    """A live host holds a stream (the runner's TaskEvents) for as long as it uses the plugin."""
    plugin = launched(IDLE)
    pid = plugin.process.pid
    try:
        events = plugin.task_events()
        assert stays_alive(pid, 6 * IDLE), "a plugin stopped by itself while a host held a stream open"
        del events
        plugin.disconnect()  # cancels the stream
        assert gone_within(pid, PATIENCE)
    finally:
        plugin.kill()


@pytest.mark.parametrize("value", ["soon", "-1", "0", "inf", "nan"])
def test_an_idle_exit_that_is_no_positive_number_is_ignored(value: str, caplog: pytest.LogCaptureFixture) -> None:
    """Stopping a plugin its host expects to find would be worse than keeping it: the plugin
    serves as without the variable, and says why in its log."""
    caplog.set_level(logging.WARNING, logger="driversdk.plugin.hello")
    plugin = launch(HELLO, name="hello", env={**os.environ, ENV_IDLE_EXIT: value})
    try:
        plugin.set_config({})
        plugin.disconnect()
        assert stays_alive(plugin.process.pid, 6 * IDLE)
        said = [r.getMessage() for r in caplog.records if r.name == "driversdk.plugin.hello"]
        assert f"ignoring {ENV_IDLE_EXIT}={value!r}: it is not a positive number of seconds" in said
    finally:
        again = reattach(plugin.process.reattach_config, name="hello")
        again.kill()
        plugin.process.alive()
