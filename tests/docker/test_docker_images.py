"""Image errors are decided by the engine's status and docker-py's classes, never by its text."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import ImageNotFound

from drivers.docker.config import PluginConfig, TaskDockerConfig
from drivers.docker.images import ensure_image
from drivers.docker.pulls import PullCoordinator
from driversdk.errors import DriverError, PluginCallError
from driversdk.testing import AllocDir, DriverHarness

from .conftest import IMAGE, busybox

# What the registry says about every manifest: words an old text match took for "no such image".
REGISTRY_SAYS = "storage says image not found, does not exist"


class _Registry(http.server.BaseHTTPRequestHandler):
    """Just enough of the registry API for the engine to ask for a manifest and get an error."""

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v2/":
            self._answer(200, {})
        else:
            self._answer(404, {"errors": [{"code": "UNKNOWN", "message": REGISTRY_SAYS}]})

    do_HEAD = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[str]:
    # The engine runs in this host's network namespace and trusts 127.0.0.0/8 over plain HTTP.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_docker_pull_error_whose_text_says_not_found_stays_recoverable(
    harness: DriverHarness, alloc: AllocDir, registry: str
) -> None:
    image = f"{registry}/gone:1.0"
    task = alloc.task_config("web", driver_config=busybox("true", image=image))
    with pytest.raises(PluginCallError) as info:
        harness.start(task)
    assert info.value.message == (
        f"task 'web': Failed to pull `{image}`: unknown: {REGISTRY_SAYS}; the image is not present locally and the "
        "registry could not provide it (load it with `docker load` or set `load` in the task config)"
    )
    # The engine answered 500, not 404: the registry may recover, so the task may be retried.
    assert info.value.recoverable


class _PullAnswersWithEngine404:
    """The real engine, except that a pull (POST /images/create) returns the engine's own 404 for a
    missing image (what newer engines answer when no registry has it)."""

    def __init__(self, api: docker.APIClient) -> None:
        self._api = api
        self.pulled: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def close(self) -> None:
        pass

    def _post(self, url: str, params: dict[str, str], **_: Any) -> Any:
        reference = f"{params['fromImage']}:{params['tag']}"
        self.pulled.append(reference)
        self._api.inspect_image(reference)  # raises the engine's ImageNotFound
        raise AssertionError(f"{reference} exists in the engine")


def _no_event(message: str, **annotations: str) -> None:
    pass


def test_docker_engine_not_found_on_pull_is_not_recoverable(engine: docker.DockerClient, alloc: AllocDir) -> None:
    reference = "driversdk-test/absent:1.0"
    api = _PullAnswersWithEngine404(engine.api)
    with pytest.raises(ImageNotFound) as real:
        engine.api.inspect_image(reference)
    assert real.value.status_code == 404
    task = alloc.task_config("web", driver_config=busybox("true", image=reference))
    with pytest.raises(DriverError) as info:
        ensure_image(
            api, task, TaskDockerConfig(image=reference), PluginConfig(), PullCoordinator(), lambda _: api, _no_event
        )
    assert api.pulled == [reference]
    assert str(info.value) == (
        f"task 'web': Failed to pull `{reference}`: {real.value.explanation}; the image is not present locally and "
        "the registry could not provide it (load it with `docker load` or set `load` in the task config)"
    )
    assert not info.value.recoverable


def test_docker_load_archive_without_the_image_is_the_engines_not_found(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient, tmp_path: Path
) -> None:
    other = "driversdk-test/other:1"
    engine.images.get(IMAGE).tag(other)
    try:
        with open(alloc.path / "web" / "local" / "image.tar", "wb") as fh:
            for chunk in engine.api.get_image(other):
                fh.write(chunk)
    finally:
        engine.images.remove(other)
    wanted = "driversdk-test/absent:2"
    task = alloc.task_config("web", driver_config=busybox("true", image=wanted, load="image.tar"))
    try:
        with pytest.raises(PluginCallError) as info:
            harness.start(task)
    finally:
        for tag in (other, wanted):
            try:
                engine.images.remove(tag)
            except docker.errors.ImageNotFound:
                pass
    assert info.value.message == f"task 'web': image archive 'image.tar' does not contain image '{wanted}'"
    assert not info.value.recoverable
