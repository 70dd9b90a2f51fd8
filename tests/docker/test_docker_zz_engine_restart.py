"""Runs last in this directory: stops the Docker engine and starts it again."""

from __future__ import annotations

import queue
import subprocess
import threading
from pathlib import Path

import docker

from driversdk.errors import PluginCallError
from driversdk.model import Fingerprint, HealthState
from driversdk.testing import DriverHarness

from .conftest import PLUGIN, PLUGIN_CONFIG

ROOT = Path(__file__).resolve().parents[2]


def _next_with(health: HealthState, readings: queue.Queue[Fingerprint], timeout: float) -> Fingerprint:
    while True:
        fp = readings.get(timeout=timeout)
        if fp.health is health:
            return fp


def test_docker_fingerprint_follows_the_engine_down_and_back(engine: docker.DockerClient) -> None:
    with DriverHarness(PLUGIN, plugin_config=PLUGIN_CONFIG) as h:
        readings: queue.Queue[Fingerprint] = queue.Queue()
        stream = h.client.fingerprint()

        def pump() -> None:
            try:
                for fp in stream:
                    readings.put(fp)
            except PluginCallError:
                pass  # the harness shut the plugin down at the end of the test

        threading.Thread(target=pump, daemon=True).start()
        assert _next_with(HealthState.HEALTHY, readings, 30).health_description == "Healthy"
        subprocess.run(["pkill", "-TERM", "-x", "dockerd"], check=True)
        try:
            down = _next_with(HealthState.UNHEALTHY, readings, 60)
            # Seen once, so a missing engine is unhealthy (not undetected), with a stable description.
            assert down.health_description == "Failed to connect to docker daemon"
        finally:
            subprocess.run([str(ROOT / "hack" / "docker-up.sh")], check=True)
        assert _next_with(HealthState.HEALTHY, readings, 60).health_description == "Healthy"
