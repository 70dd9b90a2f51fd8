"""The go-plugin transport with real plugin subprocesses through the handshake."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from driversdk.errors import HandshakeError, PluginError
from driversdk.pb import grpc_stdio_pb2_grpc
from driversdk.plugin.handshake import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE, Handshake
from driversdk.plugin.host import launch_plugin, plugin_environment, reattach_plugin
from driversdk.plugin.log import hclog_timestamp, parse_hclog_line
from driversdk.plugin.reattach import ReattachConfig

BARE = [sys.executable, str(Path(__file__).resolve().parent / "plugins" / "bare_plugin.py")]
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def _health(channel: grpc.Channel, service: str = "plugin") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status)


def test_handshake_line_format_and_parse() -> None:
    hs = Handshake(1, 2, "unix", "/tmp/plugin-x/plugin.sock")
    assert hs.format() == "1|2|unix|/tmp/plugin-x/plugin.sock|grpc"
    # Go plugins print an empty sixth field; both forms are accepted.
    assert Handshake.parse("1|2|unix|/tmp/p|grpc|\n").address == "/tmp/p"
    with pytest.raises(HandshakeError, match="unrecognized remote plugin message"):
        Handshake.parse("hello there")
    with pytest.raises(HandshakeError, match="incompatible core API version"):
        Handshake.parse("2|2|unix|/tmp/p|grpc")
    with pytest.raises(HandshakeError, match="only 'grpc' is allowed"):
        Handshake.parse("1|2|unix|/tmp/p")
    with pytest.raises(HandshakeError, match="incompatible API version"):
        Handshake.parse("1|1|unix|/tmp/p|grpc")


def test_launch_health_and_clean_shutdown() -> None:
    proc = launch_plugin(BARE, name="bare")
    try:
        assert _health(proc.channel) == health_pb2.HealthCheckResponse.SERVING
        assert _health(proc.channel, "") == health_pb2.HealthCheckResponse.SERVING
        sock_dir = os.path.dirname(proc.address)
        assert len(proc.address.encode()) < 107
        assert oct(os.stat(sock_dir).st_mode & 0o777) == "0o700"
    finally:
        started = time.monotonic()
        proc.kill()
    assert time.monotonic() - started < 2.0, "Shutdown must end the plugin within go-plugin's 2 s"
    assert not proc.alive()
    assert proc._popen is not None and proc._popen.returncode == 0
    assert not os.path.exists(sock_dir), "the private socket dir must be removed on exit"


def test_run_by_hand_explains_itself() -> None:
    env = {k: v for k, v in os.environ.items() if k != MAGIC_COOKIE_KEY}
    done = subprocess.run(BARE, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "This binary is a plugin" in done.stderr and "launched by a host" in done.stderr


def test_wrong_cookie_is_refused_with_the_plugins_sentence() -> None:
    env = plugin_environment()
    env[MAGIC_COOKIE_KEY] = "not-the-cookie"
    done = subprocess.run(BARE, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "This binary is a plugin" in done.stderr


def test_no_common_protocol_version() -> None:
    env = plugin_environment()
    env["PLUGIN_PROTOCOL_VERSIONS"] = "1"
    done = subprocess.run(BARE, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "there is no version in common" in done.stderr


def test_automtls_is_refused_with_a_sentence() -> None:
    with pytest.raises(HandshakeError) as info:
        launch_plugin(BARE, env=_env(PLUGIN_CLIENT_CERT="-----BEGIN CERTIFICATE-----"), timeout=30)
    assert "AutoMTLS" in str(info.value) and "P-521" in str(info.value)


def test_crash_at_start_reports_stderr_tail() -> None:
    with pytest.raises(HandshakeError) as info:
        launch_plugin(BARE, env=_env(BARE_MODE="crash"), timeout=30, name="bare")
    msg = str(info.value)
    assert "exited (code 3) before completing the handshake" in msg
    assert "/etc/bare.conf is unreadable" in msg


def test_hanging_plugin_times_out_and_is_killed() -> None:
    before = _bare_pids()
    with pytest.raises(HandshakeError) as info:
        launch_plugin(BARE, env=_env(BARE_MODE="hang"), timeout=2, name="bare")
    assert "did not print its handshake within 2s; it was killed" in str(info.value)
    time.sleep(0.2)
    assert _bare_pids() - before == set(), "the hanging plugin must not be left running"


def test_stdout_before_handshake_is_a_clear_error() -> None:
    with pytest.raises(HandshakeError) as info:
        launch_plugin(BARE, env=_env(BARE_MODE="garbage"), timeout=30, name="bare")
    assert "unrecognized remote plugin message 'hello from a chatty plugin'" in str(info.value)


def test_not_a_plugin_at_all() -> None:
    with pytest.raises(HandshakeError) as info:
        launch_plugin(["/bin/true"], timeout=30)
    assert "exited (code 0) before completing the handshake" in str(info.value)
    with pytest.raises(PluginError, match="cannot start plugin '/no/such/plugin'"):
        launch_plugin(["/no/such/plugin"])


def test_socket_dir_from_environment(tmp_path: Path) -> None:
    proc = launch_plugin(BARE, env=_env(PLUGIN_UNIX_SOCKET_DIR=str(tmp_path)))
    try:
        assert os.path.dirname(proc.address) == str(tmp_path)
        assert os.path.basename(proc.address).startswith("plugin")
    finally:
        proc.kill()
    assert not os.path.exists(proc.address)


def _bare_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "bare_plugin.py"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _sig_ign_mask(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigIgn line")


def _child_pid(caplog: pytest.LogCaptureFixture) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for rec in caplog.records:
            fields = getattr(rec, "plugin_fields", {})
            if "child_pid" in fields:
                return int(fields["child_pid"])
        time.sleep(0.05)
    raise AssertionError("the plugin never reported its child")


def test_sigint_survived_without_sig_ign_and_children_do_not_hold_host_pipes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="driversdk.plugin.bare")
    proc = launch_plugin(BARE, env=_env(BARE_MODE="child"), name="bare")
    child = _child_pid(caplog)
    try:
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        assert proc.alive(), "SIGINT must not stop the plugin"
        assert _health(proc.channel) == health_pb2.HealthCheckResponse.SERVING
        sigint_bit = 1 << (signal.SIGINT - 1)
        assert _sig_ign_mask(proc.pid) & sigint_bit == 0, "the plugin must not ignore SIGINT with SIG_IGN"
        assert _sig_ign_mask(child) & sigint_bit == 0, "a task process must not inherit SIG_IGN for SIGINT"
        plugin_pipes = {os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")}
        host_pipes = {p for p in plugin_pipes if p.startswith("pipe:")}
        child_fds = {os.readlink(f"/proc/{child}/fd/{fd}") for fd in ("0", "1", "2")}
        assert not child_fds & host_pipes, f"child holds the host's pipes: {child_fds & host_pipes}"
        started = time.monotonic()
        proc.kill()
        assert time.monotonic() - started < 2.5, "kill() must not wait for the plugin's children"
        assert os.path.exists(f"/proc/{child}"), "the child outlives the plugin"
    finally:
        proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_sigterm_ends_the_plugin_cleanly() -> None:
    proc = launch_plugin(BARE, name="bare")
    sock_dir = os.path.dirname(proc.address)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc._popen is not None
    assert proc._popen.wait(10) == 0
    assert not os.path.exists(sock_dir)
    proc.kill()


def test_hclog_lines_are_strings_with_go_timestamps() -> None:
    env = plugin_environment()
    env["BARE_MODE"] = "log"
    popen = subprocess.Popen(BARE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert popen.stdout is not None and popen.stderr is not None
    line = popen.stdout.readline()
    assert line.startswith("1|2|unix|") and line.rstrip().endswith("|grpc")
    time.sleep(1.0)
    popen.send_signal(signal.SIGTERM)
    # communicate, not wait: a plugin blocked on a full stderr pipe nobody reads would never exit.
    _, stderr = popen.communicate(timeout=30)
    entries = [json.loads(raw) for raw in stderr.splitlines() if raw.strip()]
    assert entries, "the plugin logged nothing"
    for entry in entries:
        for key in ("@level", "@message", "@timestamp"):
            assert isinstance(entry[key], str), (key, entry)
        assert entry["@level"] in ("trace", "debug", "info", "warn", "error")
        assert TIMESTAMP.match(entry["@timestamp"]), entry["@timestamp"]
    assert any(e["@message"] == "record at microsecond zero" for e in entries)
    from datetime import UTC, datetime

    assert hclog_timestamp(datetime(2024, 5, 1, 10, 0, 0, 0, tzinfo=UTC)) == "2024-05-01T10:00:00.000000Z"


def test_host_side_hclog_parsing() -> None:
    assert parse_hclog_line('{"@level":"warn","@message":"m","@timestamp":"x","k":"v"}') == (
        logging.WARNING,
        "m",
        {"k": "v"},
    )
    # a non-string level is not trusted: the raw line goes out at DEBUG
    assert parse_hclog_line('{"@level":3,"@message":"m"}')[0] == logging.DEBUG
    assert parse_hclog_line("[ERROR] boom") == (logging.ERROR, "boom", {})
    assert parse_hclog_line("plain text")[0] == logging.DEBUG


def test_reattach_after_the_host_object_is_gone() -> None:
    proc = launch_plugin(BARE, name="bare")
    saved = proc.reattach_config.to_json()
    proc.channel.close()  # the "host" goes away without killing the plugin
    config = ReattachConfig.from_json(saved)
    again = reattach_plugin(config, name="bare")
    try:
        assert _health(again.channel) == health_pb2.HealthCheckResponse.SERVING
    finally:
        again.kill()
    assert not again.alive()
    with pytest.raises(PluginError, match="is gone; launch it again"):
        reattach_plugin(config, name="bare")


def test_many_open_streams_do_not_starve_unary_calls() -> None:
    from google.protobuf import empty_pb2

    proc = launch_plugin(BARE, name="bare")
    try:
        stub = grpc_stdio_pb2_grpc.GRPCStdioStub(proc.channel)
        streams = [stub.StreamStdio(empty_pb2.Empty()) for _ in range(200)]
        time.sleep(1.0)
        assert _health(proc.channel) == health_pb2.HealthCheckResponse.SERVING
        for s in streams:
            s.cancel()
    finally:
        proc.kill()


def test_plugin_survives_host_closing_its_stderr() -> None:
    env = plugin_environment()
    env["BARE_MODE"] = "log"
    popen = subprocess.Popen(BARE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert popen.stdout is not None and popen.stderr is not None
    address = popen.stdout.readline().strip().split("|")[3]
    popen.stderr.close()  # every later log write now fails with EPIPE
    time.sleep(1.0)
    channel = grpc.insecure_channel(f"unix:{address}")
    try:
        assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()
        popen.send_signal(signal.SIGTERM)
        assert popen.wait(10) == 0


def test_launch_many_plugins_in_parallel() -> None:
    results: list[object] = []

    def one() -> None:
        p = launch_plugin(BARE, name="bare")
        results.append(_health(p.channel))
        p.kill()

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [health_pb2.HealthCheckResponse.SERVING] * 4


def test_environment_given_to_plugins_matches_nomad() -> None:
    env = plugin_environment({"PATH": "/bin"})
    assert env[MAGIC_COOKIE_KEY] == MAGIC_COOKIE_VALUE
    assert env["PLUGIN_PROTOCOL_VERSIONS"] == "2"
    assert env["PLUGIN_MIN_PORT"] == "10000" and env["PLUGIN_MAX_PORT"] == "25000"
    assert "PLUGIN_CLIENT_CERT" not in env
