"""A plugin that dies without removing its private socket dir (SIGKILLed, or killed together with
its host) has it removed by whoever finds it dead: the host's kill, or the next run that finds
only its reattach config. Nothing else is ever removed, whatever the recorded address says."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from driversdk.client import launch
from driversdk.plugin.host import (
    StartingPlugin,
    pid_alive,
    remove_dead_plugin_socket,
    spawn_plugin,
)
from driversdk.plugin.reattach import ReattachConfig

ROOT = Path(__file__).resolve().parents[2]
HELLO = [sys.executable, str(ROOT / "examples" / "hello_driver.py")]


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    assert not pid_alive(child.pid)
    return child.pid


def _bound_socket(path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()  # the file stays, as a SIGKILLed plugin leaves it


@pytest.fixture
def place() -> Iterator[Path]:
    """Where the planted dirs go: a private dir, not /tmp itself, so nothing here can touch a
    real plugin's dir."""
    with tempfile.TemporaryDirectory(prefix="dsx-sockclean-") as tmp:
        yield Path(tmp)


def test_the_host_removes_the_socket_dir_of_a_plugin_killed_under_it() -> None:
    client = launch(HELLO, name="hello")
    address = client.process.reattach_config.address
    assert os.path.basename(os.path.dirname(address)).startswith("plugin-")
    os.kill(client.process.pid, signal.SIGKILL)
    client.kill()
    assert not os.path.exists(os.path.dirname(address))


def test_a_plugin_found_dead_by_its_reattach_config_loses_its_socket_dir() -> None:
    client = launch(HELLO, name="hello")
    config = client.process.reattach_config
    try:
        assert remove_dead_plugin_socket(config) is False, "a live plugin's socket is never removed"
        assert os.path.exists(config.address)
        os.kill(config.pid, signal.SIGKILL)
        client.process.exited_within(5.0)  # reaped: the pid is gone, as after its host's death
        assert remove_dead_plugin_socket(config) is True
        assert not os.path.exists(os.path.dirname(config.address))
    finally:
        client.kill()


def _plain(place: Path) -> str:
    d = place / "plugin-abc"
    d.mkdir(mode=0o700)
    _bound_socket(str(d / "plugin.sock"))
    return str(d / "plugin.sock")


def _with_other_file(place: Path) -> str:
    address = _plain(place)
    Path(address).with_name("notes.txt").write_text("not the plugin's\n")
    return address


def _file_not_socket(place: Path) -> str:
    d = place / "plugin-abc"
    d.mkdir(mode=0o700)
    (d / "plugin.sock").write_text("a regular file named like the socket\n")
    return str(d / "plugin.sock")


def _symlinked_dir(place: Path) -> str:
    # The recorded dir is a link to a directory elsewhere that holds only a socket.
    target = place / "elsewhere"
    target.mkdir()
    _bound_socket(str(target / "plugin.sock"))
    (place / "plugin-abc").symlink_to(target)
    return str(place / "plugin-abc" / "plugin.sock")


def _not_a_plugin_dir(place: Path) -> str:
    d = place / "sockets"
    d.mkdir()
    _bound_socket(str(d / "plugin.sock"))
    return str(d / "plugin.sock")


@pytest.mark.parametrize(
    ("plant", "removed"),
    [
        (_plain, True),
        (_with_other_file, False),
        (_file_not_socket, False),
        (_symlinked_dir, False),
        (_not_a_plugin_dir, False),
    ],
    ids=["dead-plugin-dir", "dir-holds-more", "not-a-socket", "symlinked-dir", "not-plugin-named"],
)
def test_only_a_dead_plugins_own_socket_dir_is_removed(
    place: Path, plant: Callable[[Path], str], removed: bool
) -> None:
    address = plant(place)
    before = sorted(str(p) for p in place.rglob("*"))
    config = ReattachConfig(pid=_dead_pid(), network="unix", address=address)
    assert remove_dead_plugin_socket(config) is removed
    after = sorted(str(p) for p in place.rglob("*"))
    if removed:
        assert not os.path.exists(os.path.dirname(address))
    else:
        assert after == before, "nothing may be touched"


def test_a_tcp_plugin_or_a_live_pid_is_left_alone(place: Path) -> None:
    address = _plain(place)
    assert remove_dead_plugin_socket(ReattachConfig(pid=_dead_pid(), network="tcp", address="127.0.0.1:1")) is False
    assert remove_dead_plugin_socket(ReattachConfig(pid=os.getpid(), network="unix", address=address)) is False
    assert os.path.exists(address)


# --- plugins abandoned before they were connected to (validation stopped before their turn) ---


def _spawn_in(tmp: Path) -> StartingPlugin:
    """The hello plugin, making its private socket dir under ``tmp`` (its TMPDIR)."""
    return spawn_plugin(HELLO, env={**os.environ, "TMPDIR": str(tmp)}, name="hello")


def _serving_dirs(tmp: Path) -> list[Path]:
    return [d for d in tmp.glob("plugin-*") if (d / "plugin.sock").exists()]


def _wait_serving(tmp: Path) -> None:
    deadline = time.monotonic() + 30
    while not _serving_dirs(tmp):
        assert time.monotonic() < deadline, "the plugin never listened"
        time.sleep(0.02)


def test_a_serving_plugin_abandoned_unconnected_stops_and_removes_its_socket_dir(place: Path) -> None:
    plugin = _spawn_in(place)
    _wait_serving(place)
    plugin.abandon()
    assert not pid_alive(plugin.pid)
    assert list(place.glob("plugin-*")) == []


def test_a_plugin_that_cannot_stop_in_time_is_killed_and_its_socket_dir_removed_for_it(
    place: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="driversdk.plugin.hello")
    plugin = _spawn_in(place)
    # It logs "plugin started" once its handshake line is out (listening alone comes before that).
    deadline = time.monotonic() + 30
    while not any(r.getMessage() == "plugin started" for r in caplog.records):
        assert time.monotonic() < deadline, "the plugin never said it started"
        time.sleep(0.02)
    os.kill(plugin.pid, signal.SIGSTOP)  # SIGTERM stays pending: only the SIGKILL after the grace ends it
    plugin.abandon()
    assert not pid_alive(plugin.pid)
    assert list(place.glob("plugin-*")) == [], "the dir its handshake named is removed once it is dead"


def test_a_plugin_abandoned_while_it_boots_leaves_nothing(place: Path) -> None:
    plugin = _spawn_in(place)
    plugin.abandon()  # at once: still importing, it dies of SIGTERM before making its dir
    assert not pid_alive(plugin.pid)
    assert list(place.glob("plugin-*")) == []
