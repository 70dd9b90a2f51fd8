"""Many StartTasks at once ask the engine for the same image at the same URL: the docker driver's
engine client keeps enough connections per pool that urllib3 never discards one (the path where
it reads the size of a pool the SDK may just have closed, failing the StartTask with "'NoneType'
object has no attribute 'qsize'"). The same storm against the SDK's default client does reach
that path, so this test can tell the two apart."""

from __future__ import annotations

import logging
import threading
from typing import Any

import docker
import pytest

from tests.docker.conftest import IMAGE

STORM = 120  # requests on one URL at once, as a group of that many tasks starting together makes
CHURN = 40  # requests on URLs of their own meanwhile: the SDK evicts and closes pools past 25


def storm(api: Any) -> list[BaseException]:
    failures: list[BaseException] = []
    start = threading.Barrier(STORM + CHURN)

    def same_url() -> None:
        start.wait()
        try:
            api.inspect_image(IMAGE)
        except BaseException as err:  # every failure is the finding
            failures.append(err)

    def own_url(i: int) -> None:
        start.wait()
        try:
            api.inspect_container(f"driversdk-no-such-container-{i}")
        except docker.errors.NotFound:
            pass
        except BaseException as err:
            failures.append(err)

    threads = [threading.Thread(target=same_url) for _ in range(STORM)]
    threads += [threading.Thread(target=own_url, args=(i,)) for i in range(CHURN)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return failures


def discarded(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Connection pool is full" in r.getMessage()]


def test_the_drivers_engine_client_never_discards_a_connection_under_a_start_storm(
    engine: docker.DockerClient, caplog: pytest.LogCaptureFixture
) -> None:
    from drivers.docker.driver import DockerDriver

    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    default = docker.APIClient(base_url="unix:///var/run/docker.sock")
    try:
        storm(default)  # it may fail outright too (the race itself): only its discards are counted
        assert discarded(caplog), "the storm does not reach urllib3's discard path: it proves nothing"
    finally:
        default.close()
    caplog.clear()
    driver = DockerDriver(warm_up=False)
    driver.set_config({"gc": {"image": False}}, None)
    try:
        assert storm(driver.api()) == []
        assert discarded(caplog) == []
    finally:
        driver.shutdown()
