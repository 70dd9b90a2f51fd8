"""Runs last in this directory: stops the Docker engine and starts it again."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from pathlib import Path

import docker
import pytest

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


def test_docker_start_with_the_engine_down_is_recoverable_and_leaves_nothing(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    from driversdk.testing import AllocDir

    from .conftest import busybox, our_containers

    with DriverHarness(PLUGIN, plugin_config=PLUGIN_CONFIG) as h:
        alloc = AllocDir.create(tmp_path, tasks=["web"])
        subprocess.run(["pkill", "-TERM", "-x", "dockerd"], check=True)
        try:
            deadline = time.monotonic() + 30
            while (
                time.monotonic() < deadline and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
            ):
                time.sleep(0.2)
            task = alloc.task_config("web", driver_config=busybox("true"))
            with pytest.raises(PluginCallError) as info:
                h.client.start_task(task)
            assert "cannot reach the docker daemon" in str(info.value)
            assert info.value.recoverable, "a restart of the engine can fix it: the task may be retried"
        finally:
            subprocess.run([str(ROOT / "hack" / "docker-up.sh")], check=True)
        assert our_containers(docker.from_env(), tmp_path) == []
        alloc.remove()


def test_docker_task_events_are_streamed(engine: docker.DockerClient, tmp_path: Path) -> None:
    from driversdk.testing import AllocDir

    from .conftest import busybox

    with DriverHarness(PLUGIN, plugin_config=PLUGIN_CONFIG) as h:
        events = h.client.task_events()
        got: queue.Queue[object] = queue.Queue()

        def pump() -> None:
            try:
                for event in events:
                    got.put(event)
            except PluginCallError:
                pass  # the harness shut the plugin down at the end of the test

        threading.Thread(target=pump, daemon=True).start()
        time.sleep(0.5)
        alloc = AllocDir.create(tmp_path, tasks=["web"])
        task = alloc.task_config("web", driver_config=busybox("true"))
        h.start(task)
        h.client.wait_task(task.id, timeout=60)
        messages = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any("exited" in m for m in messages):
            try:
                ev = got.get(timeout=1)
            except queue.Empty:
                continue
            assert ev.alloc_id == alloc.alloc_id and ev.task_name == "web"  # type: ignore[attr-defined]
            messages.append(ev.message)  # type: ignore[attr-defined]
        assert any(m.startswith("Started container") for m in messages), messages
        assert "Container exited with code 0" in messages
        alloc.close()
