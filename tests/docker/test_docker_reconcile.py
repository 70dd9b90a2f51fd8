"""gc.dangling_containers: a relaunched plugin removes what a killed one left, and nothing else.

Every test runs on a private engine (tests/docker/private_engine.py): a reconciler with a
seconds-long creation_grace on the shared engine could remove the containers of another
engineer's test run whose plugin is being relaunched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from drivers.docker import reconcile
from drivers.docker.container import LABEL_ALLOC_ID, LABEL_TASK_ID
from drivers.docker.pinrecord import PIN_DIR_PREFIX
from driversdk.errors import PluginCallError
from driversdk.mountinfo import mount_points
from driversdk.testing import AllocDir, DriverHarness

from .conftest import IMAGE, PAUSE, PLUGIN, busybox
from .private_engine import PrivateEngine, checked_private_engine

GRACE = 2.0
PERIOD = 1.0


def plugin_config(endpoint: str, **dangling: Any) -> dict[str, Any]:
    return {
        "endpoint": endpoint,
        "infra_image": PAUSE,
        "gc": {"image": False, "dangling_containers": {"period": "1s", "creation_grace": "2s", **dangling}},
    }


@pytest.fixture(scope="module")
def private(engine: docker.DockerClient) -> Iterator[PrivateEngine]:
    yield from checked_private_engine([IMAGE])


@pytest.fixture
def client(private: PrivateEngine) -> Iterator[docker.DockerClient]:
    c = private.client()
    yield c
    for container in c.containers.list(all=True):
        container.remove(force=True)
    c.close()


class PluginLog(logging.Handler):
    """Every line the plugins launched in a test wrote to stderr (the host re-logs them)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]

    def fields(self, message: str) -> list[dict[str, Any]]:
        return [getattr(r, "plugin_fields", {}) for r in self.records if r.getMessage() == message]


@pytest.fixture
def plugin_log() -> Iterator[PluginLog]:
    logger = logging.getLogger("driversdk.plugin")
    handler, level = PluginLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)
    assert not [m for m in handler.messages() if "Traceback" in m], "a plugin printed a traceback"


def dead_identity() -> str:
    """The owner identity of a process that has exited: what a SIGKILLed plugin leaves."""
    proc = subprocess.Popen(["sleep", "60"])
    owner = reconcile.identity(proc.pid)
    proc.kill()
    proc.wait()
    assert not reconcile.alive(owner)
    return owner


def orphan(client: docker.DockerClient, tmp_path: Path, owner: str | None = None, **labels: str) -> str:
    """A running task container as a plugin killed before StartTask returned leaves it."""
    base = {
        LABEL_TASK_ID: f"orphan/{os.urandom(4).hex()}",
        LABEL_ALLOC_ID: "0c1e6a52-5d2a-4b6c-9a57-1d7f3c0d0d0d",
        reconcile.LABEL_OWNER: owner or dead_identity(),
        reconcile.LABEL_TASK_DIR: str(tmp_path / "gone" / "task"),
    }
    base.update(labels)
    c = client.containers.run(IMAGE, ["sleep", "300"], detach=True, labels=base, network_mode="none")
    return str(c.id)


def exists(client: docker.DockerClient, cid: str) -> bool:
    try:
        client.api.inspect_container(cid)
        return True
    except docker.errors.NotFound:
        return False


def wait_until(what: str, check: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            pytest.fail(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.2)
    return time.monotonic() - start


# Removal takes: first pass after max(period, grace), then grace seen ownerless, then a period.
REMOVAL_BOUND = 30.0


class HoldingProxy:
    """A unix socket in front of the engine that forwards everything but a container start,
    which it holds: the plugin behind it is then provably between create and start."""

    START = re.compile(rb"POST /v[0-9.]+/containers/[0-9a-f]+/start ")

    def __init__(self, upstream: str, path: str) -> None:
        self.upstream = upstream
        self.path = path
        self.held = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(16)
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(self.upstream)
            self._conns += [conn, up]
            threading.Thread(target=self._pump, args=(conn, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, conn, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        holding = False
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if from_client and self.START.search(data):
                    holding = True
                    self.held.set()
                if not holding:
                    dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._server.close()
        for s in self._conns:
            with contextlib.suppress(OSError):
                s.close()


def _pins_under(root: Path) -> list[str]:
    return sorted(p for p in mount_points() if p.startswith(str(root)) and PIN_DIR_PREFIX in p)


def test_plugin_killed_mid_start_task_leaves_no_orphan_for_long(
    private: PrivateEngine, client: docker.DockerClient, plugin_log: PluginLog, tmp_path: Path
) -> None:
    proxy = HoldingProxy(str(private.socket), str(private.root / "p.sock"))
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    try:
        first = DriverHarness(PLUGIN, plugin_config=plugin_config(f"unix://{proxy.path}"))
        task = alloc.task_config("web", driver_config=busybox("sleep", "300"))
        outcome: dict[str, BaseException] = {}

        def start() -> None:
            try:
                first.client.start_task(task)
            except BaseException as err:
                outcome["error"] = err

        starter = threading.Thread(target=start, daemon=True)
        starter.start()
        assert proxy.held.wait(60), "StartTask never asked the engine to start the container"
        os.kill(first.client.process.pid, signal.SIGKILL)
        starter.join(30)
        assert isinstance(outcome.get("error"), PluginCallError), "StartTask must not have returned"
        first.close()
        [left] = client.containers.list(all=True, filters={"label": f"{LABEL_TASK_ID}={task.id}"})
        assert left.status == "created", "the kill landed between create and start"

        # The killed plugin's pins (its alloc/logs bind) are still mounted in the alloc dir...
        assert _pins_under(tmp_path), "the kill landed after the pins were made"
        with DriverHarness(PLUGIN, plugin_config=plugin_config(private.endpoint)):
            # ...and the next plugin releases them when it starts.
            assert _pins_under(tmp_path) == []
            took = wait_until("removal of the orphan", lambda: not exists(client, str(left.id)), REMOVAL_BOUND)
        assert took >= GRACE, "removed before creation_grace"
        removed = plugin_log.fields("removed untracked container")
        assert [f.get("container_id") for f in removed] == [left.id]
        assert removed[0].get("task_id") == task.id
    finally:
        proxy.close()
        alloc.remove()


def test_live_and_recovered_tasks_are_never_removed(
    private: PrivateEngine, client: docker.DockerClient, plugin_log: PluginLog, tmp_path: Path
) -> None:
    alloc = AllocDir.create(tmp_path, tasks=["live", "recovered"])
    # Neither owner reconciles (5m defaults); only the third plugin below does, every second.
    owner_config = {"endpoint": private.endpoint, "gc": {"image": False}, "infra_image": PAUSE}
    with (
        DriverHarness(PLUGIN, plugin_config=owner_config) as live,
        DriverHarness(PLUGIN, plugin_config=owner_config) as restarted,
    ):
        live_task = alloc.task_config("live", driver_config=busybox("sleep", "300"))
        live.start(live_task)
        rec_task = alloc.task_config("recovered", driver_config=busybox("sleep", "300"))
        rec_handle = restarted.start(rec_task)
        # The creator named in this container's label dies; its successor recovers the task.
        restarted.restart_plugin()
        restarted.client.recover_task(rec_handle)
        ids = {c.labels[LABEL_TASK_ID]: str(c.id) for c in client.containers.list(filters={"label": LABEL_TASK_ID})}
        assert set(ids) == {live_task.id, rec_task.id}
        control = orphan(client, tmp_path)

        with DriverHarness(PLUGIN, plugin_config=plugin_config(private.endpoint)):
            wait_until("removal of the dead plugin's container", lambda: not exists(client, control), REMOVAL_BOUND)
            # Several more passes, each past creation_grace and the ownerless grace.
            time.sleep(3 * GRACE + 2 * PERIOD)
            assert exists(client, ids[live_task.id]), "removed a task of a live plugin"
            assert exists(client, ids[rec_task.id]), "removed a task the relaunched plugin recovered"
        removed = [f.get("container_id") for f in plugin_log.fields("removed untracked container")]
        assert removed == [control]
    alloc.remove()


def test_containers_without_our_labels_are_never_touched(
    private: PrivateEngine, client: docker.DockerClient, plugin_log: PluginLog, tmp_path: Path
) -> None:
    def plain(**labels: str) -> str:
        return str(client.containers.run(IMAGE, ["sleep", "300"], detach=True, labels=labels, network_mode="none").id)

    foreign = [
        plain(),  # someone's own container
        plain(**{LABEL_ALLOC_ID: "0c1e6a52-5d2a-4b6c-9a57-1d7f3c0d0d0d"}),  # Nomad's, or a pause container
        plain(**{LABEL_ALLOC_ID: "a", LABEL_TASK_ID: "a/web/1"}),  # made before owners were recorded
        plain(**{reconcile.LABEL_OWNER: dead_identity()}),  # an owner label alone is not ours
    ]
    control = orphan(client, tmp_path)
    with DriverHarness(PLUGIN, plugin_config=plugin_config(private.endpoint)):
        wait_until("removal of the dead plugin's container", lambda: not exists(client, control), REMOVAL_BOUND)
        time.sleep(2 * GRACE + 2 * PERIOD)
        assert [cid for cid in foreign if not exists(client, cid)] == []


def test_container_younger_than_creation_grace_is_kept(
    private: PrivateEngine, client: docker.DockerClient, plugin_log: PluginLog, tmp_path: Path
) -> None:
    grace = 6.0
    control = orphan(client, tmp_path)
    with DriverHarness(PLUGIN, plugin_config=plugin_config(private.endpoint, creation_grace="6s")):
        # Once the control is gone the reconciler passes every second.
        wait_until("removal of the dead plugin's container", lambda: not exists(client, control), REMOVAL_BOUND)
        young = orphan(client, tmp_path)
        born = time.monotonic()
        # Without the age check it would go by (first pass) + grace + a period: within 8s. With it,
        # not before 11s: the engine lists creation times in whole seconds, so an age can read up
        # to a second long, and the ownerless grace follows.
        while time.monotonic() - born < grace + 3.5:
            assert exists(client, young), f"removed {time.monotonic() - born:.1f}s after creation"
            time.sleep(0.2)
        wait_until("removal once old enough", lambda: not exists(client, young), REMOVAL_BOUND)


def test_dry_run_removes_nothing(
    private: PrivateEngine, client: docker.DockerClient, plugin_log: PluginLog, tmp_path: Path
) -> None:
    left = orphan(client, tmp_path)
    with DriverHarness(PLUGIN, plugin_config=plugin_config(private.endpoint, dry_run=True)):
        wait_until(
            "the dry run's report",
            lambda: any(left in f.get("container_ids", "") for f in plugin_log.fields("detected untracked containers")),
            REMOVAL_BOUND,
        )
        time.sleep(2 * PERIOD)
    assert exists(client, left)
    assert plugin_log.fields("removed untracked container") == []
