"""A host that reattaches to a plugin takes its log lines over (driversdk.plugin.loghandover): a
runner that recovers its tasks, or takes a plugin kept between runs, reads what the plugin logs
from then on, where before they went to the pipe of a host long gone. A real hello plugin
process; real unix sockets and descriptors passed with SCM_RIGHTS; attackers of uid nobody."""

from __future__ import annotations

import ast
import collections
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.client import launch, reattach
from driversdk.plugin.host import take_plugin_logs
from driversdk.plugin.loghandover import HANDOVER_SOCKET
from tests.hostcheck import NOBODY, listener_of_another_user

HELLO = [sys.executable, str(Path(__file__).resolve().parents[2] / "examples" / "hello_driver.py")]
# A liveness bound for lines crossing a pipe and a reader thread (polled), never a speed measure.
PATIENCE = 30.0


class Lines(logging.Handler):
    """What each host's reader logs, by host: a host's plugin lines go to driversdk.plugin.<name>."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.name.rsplit(".", 1)[-1], record.getMessage()))

    def of(self, host: str) -> list[str]:
        return [message for name, message in list(self.seen) if name == host]

    def shows_up(self, host: str, text: str) -> bool:
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            if any(text in message for message in self.of(host)):
                return True
            time.sleep(0.02)
        return False


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("driversdk.plugin")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_a_reattaching_host_reads_the_plugins_log_lines_from_then_on(lines: Lines) -> None:
    first = launch(HELLO, name="first")
    try:
        assert lines.shows_up("first", "plugin started")
        first.disconnect()  # the launching host goes away, as a finished or killed run does
        second = reattach(first.process.reattach_config, name="second")
        # The plugin says so on the new pipe, and only there.
        assert lines.shows_up("second", "log lines now go to a new host")
        second.kill()
        assert lines.shows_up("second", "plugin stopping")
        assert not any("plugin stopping" in m or "new host" in m for m in lines.of("first"))
        assert not os.path.exists(os.path.dirname(first.process.address)), "its socket dir (and handover) is gone"
    finally:
        first.kill()
        first.process.alive()


def test_a_plugin_hands_its_log_stream_to_no_other_user(lines: Lines) -> None:
    # The attacker reaches the handover socket (its dir opened up for the test) and passes a pipe
    # of its own: the plugin refuses, says so to its host, and writes nothing to that pipe.
    plugin = launch(HELLO, name="target")
    try:
        assert lines.shows_up("target", "plugin started")
        socket_dir = os.path.dirname(plugin.process.address)
        os.chmod(socket_dir, 0o711)
        os.chmod(os.path.join(socket_dir, HANDOVER_SOCKET), 0o777)
        ack, got = handover_as_nobody(os.path.join(socket_dir, HANDOVER_SOCKET))
        assert ack == b"", "no confirmation for the attacker"
        assert lines.shows_up("target", "refused a log handover from another user"), "the host still reads the lines"
        plugin.kill()
        assert lines.shows_up("target", "plugin stopping")
        assert got == b"", "not one log line for the attacker"
    finally:
        plugin.kill()


def handover_as_nobody(path: str) -> tuple[bytes, bytes]:
    """Connect to ``path`` as uid nobody, pass the write end of a pipe; the answer, and what came
    down the pipe once the plugin was done with the connection."""
    out_r, out_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(out_r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            read_end, write_end = os.pipe()
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(10)
            conn.connect(path)
            socket.send_fds(conn, [b"\0"], [write_end])
            os.close(write_end)
            try:
                ack = conn.recv(1)
            except OSError:
                ack = b""
            conn.close()
            os.set_blocking(read_end, False)
            try:
                got = os.read(read_end, 65536)
            except BlockingIOError:
                got = b""
            os.write(out_w, repr((ack, got)).encode())
        finally:
            os._exit(0)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as fh:
        answer = fh.read()
    os.waitpid(child, 0)
    ack, got = ast.literal_eval(answer.decode())
    return ack, got


def test_a_host_hands_no_pipe_to_a_handover_socket_of_another_user(tmp_path: Path) -> None:
    # A plugin's socket dir is freed when it stops; another user serving a socket at the old
    # address must not be handed a descriptor of the host.
    os.chmod(tmp_path, 0o755)
    received = tmp_path / "received"
    with listener_of_another_user(str(tmp_path / HANDOVER_SOCKET), str(received)):
        tail: collections.deque[str] = collections.deque(maxlen=10)
        assert not take_plugin_logs(str(tmp_path / "plugin.sock"), tail, "hello")
    assert not received.exists() or received.read_bytes() == b""


def test_a_plugin_that_offers_no_handover_keeps_its_pipe(tmp_path: Path) -> None:
    tail: collections.deque[str] = collections.deque(maxlen=10)
    assert not take_plugin_logs(str(tmp_path / "plugin.sock"), tail, "other-sdk")


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacker runs as nobody: root only")
