"""The docker driver answers its schemas, its config and a fingerprint without the docker SDK
(drivers/docker/probe.py reads the engine over its unix socket), says the same the SDK would, and
loads the SDK on first real use. Against the real engine hack/docker-up.sh starts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from drivers.docker.config import PluginConfig
from drivers.docker.fingerprint import fingerprint
from drivers.docker.probe import DEFAULT_SOCKET, EngineProbe, ProbeError, engine_socket
from driversdk.model import HealthState

ROOT = Path(__file__).resolve().parents[2]


def test_the_socket_is_the_one_the_sdk_would_use() -> None:
    assert engine_socket("", {}) == DEFAULT_SOCKET
    assert engine_socket(None, {"DOCKER_HOST": "unix:///run/other.sock"}) == "/run/other.sock"
    assert engine_socket("unix:///srv/d.sock", {"DOCKER_HOST": "unix:///run/other.sock"}) == "/srv/d.sock"
    # Other transports (and anything odd) are the SDK's to reach.
    for target in ("tcp://127.0.0.1:2376", "ssh://me@host", "npipe:////./pipe/docker_engine", "unix://relative"):
        assert engine_socket(target, {}) is None
        assert engine_socket("", {"DOCKER_HOST": target}) is None


def bridge_gateway(engine: docker.DockerClient, within: float = 30.0) -> str:
    """The default bridge's gateway as the engine reports it. Once, in CI, the shared engine
    reported none for a while (to the SDK and the probe alike); wait for it rather than compare
    two empty answers."""
    deadline = time.monotonic() + within
    while True:
        configs = (engine.api.inspect_network("bridge").get("IPAM") or {}).get("Config") or []
        gateway = next((c["Gateway"] for c in configs if c.get("Gateway")), None)
        if gateway:
            return str(gateway)
        if time.monotonic() > deadline:
            pytest.fail(f"the engine's default bridge reports no gateway after {within:.0f}s: {configs!r}")
        time.sleep(0.5)


def test_the_probe_fingerprints_as_the_sdk_does(engine: docker.DockerClient) -> None:
    gateway = bridge_gateway(engine)
    config = PluginConfig.from_decoded({"allow_privileged": True, "volumes": {"enabled": True}})
    through_sdk = fingerprint(engine.api, config, detected_before=False)
    through_probe = fingerprint(EngineProbe(DEFAULT_SOCKET), config, detected_before=False)
    assert through_probe.health is HealthState.HEALTHY
    assert through_probe == through_sdk
    assert through_probe.attributes["driver.docker.bridge_ip"] == gateway
    assert EngineProbe(DEFAULT_SOCKET).ping()


def test_a_socket_nobody_serves_is_an_engine_not_found(tmp_path: Path) -> None:
    dead = tmp_path / "dead.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(dead))
    listener.close()  # the file stays, nobody accepts
    probe = EngineProbe(str(dead), timeout=2)
    with pytest.raises(ProbeError, match=r"dead\.sock"):
        probe.version()
    fp = fingerprint(probe, PluginConfig(), detected_before=False)
    assert (fp.health, fp.health_description) == (HealthState.UNDETECTED, "Failed to connect to docker daemon")
    assert fingerprint(probe, PluginConfig(), detected_before=True).health is HealthState.UNHEALTHY


def test_an_engine_answering_with_an_error_or_garbage_is_not_healthy(tmp_path: Path) -> None:
    path = tmp_path / "fake.sock"
    replies = iter([b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops",
                    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nnot json"])  # fmt: skip
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()

    def serve() -> None:
        for reply in replies:
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.sendall(reply)
            conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    probe = EngineProbe(str(path), timeout=5)
    with pytest.raises(ProbeError, match="500"):
        probe.version()
    with pytest.raises(ProbeError, match="not JSON"):
        probe.info()
    server.join(5)
    listener.close()


CHECK = """
import json, os, sys
from drivers.docker.driver import DockerDriver
DockerDriver._warm_up = lambda self: None  # the client made on a thread would load the SDK meanwhile
driver = DockerDriver()
driver.config_schema()
driver.set_config({"gc": {"image": False}}, None)
driver.capabilities()
driver.task_config_schema()
fp = driver.fingerprint()
before = sorted(m for m in sys.modules if m == "docker" or m.startswith(("docker.", "requests")))
driver.api().ping()  # first real use
after = "docker" in sys.modules
driver.shutdown()
print(json.dumps({"health": fp.health.name, "sdk_before": before, "sdk_after": after}))
"""


def test_the_first_calls_do_not_load_the_sdk_and_the_first_use_does(engine: docker.DockerClient) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"health": "HEALTHY", "sdk_before": [], "sdk_after": True}


def test_the_same_config_again_keeps_the_engine_client_and_another_makes_a_new_one(
    engine: docker.DockerClient,
) -> None:
    from drivers.docker.driver import DockerDriver
    from driversdk.errors import ConfigError

    driver = DockerDriver()
    try:
        driver.set_config({"gc": {"image": False}}, None)
        first = driver.api()  # made by the warm-up thread, or now: one client either way
        assert first.ping()
        driver.set_config({"gc": {"image": False}}, None)  # a host that validated, then runs
        assert driver.api() is first
        driver.set_config({"gc": {"image": False}, "endpoint": "unix:///var/run/docker.sock"}, None)
        assert driver.api() is not first
        bad = {"endpoint": "tcp://127.0.0.1:1", "tls": {"cert": "/nonexistent.pem", "key": "/nonexistent.key"}}
        for _ in range(2):  # a refused config is refused again, never remembered as set
            with pytest.raises(ConfigError, match="tls in the docker plugin config"):
                driver.set_config(bad, None)
    finally:
        driver.shutdown()


WARMS_UP = """
import json, sys, time
from drivers.docker.main import build
driver = build(for_checks=sys.argv[2] == "1")
driver.set_config({"gc": {"image": False}}, None)
fp = driver.fingerprint()
deadline = time.monotonic() + float(sys.argv[1])
while "docker" not in sys.modules and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.2)  # a load begun by now would have put the package in sys.modules
print(json.dumps({"health": fp.health.name, "sdk": "docker" in sys.modules}))
driver.shutdown()
"""


@pytest.mark.parametrize("for_checks", [False, True])
def test_a_driver_built_for_checks_never_loads_the_sdk(engine: docker.DockerClient, for_checks: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"} | {"PYTHONPATH": str(ROOT)}
    wait = "1.0" if for_checks else "30"
    args = [sys.executable, "-c", WARMS_UP, wait, "1" if for_checks else "0"]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=90)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # Built to run tasks, the SDK loads on its own after the build; for checks, never.
    assert seen == {"health": "HEALTHY", "sdk": not for_checks}
