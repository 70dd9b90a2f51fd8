"""Real registries for the docker driver's pull tests, started by pytest-docker from compose.yml.

Two registries on random loopback ports (dockerd trusts 127.0.0.0/8 over plain HTTP): `plain`,
and `auth`, which asks for the htpasswd credentials written here (bcrypt). A test image with a
random layer (so a pull really downloads bytes) is pushed to both; nothing comes from outside.
Everything made here carries the label io.driversdk.test and is removed at the end.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import docker
import pytest

from driversdk.testing import DriverHarness

from ..conftest import IMAGE, PLUGIN, PLUGIN_CONFIG

REGISTRY_IMAGE = "driversdk-test/registry:local"
TEST_LABEL = {"io.driversdk.test": "pull"}
REPO = "driversdk-test/blob"


@pytest.fixture(scope="session")
def docker_compose_command() -> str:
    """The engine's compose plugin if it has one, else Debian's docker-compose (hack/setup.sh)."""
    try:
        plugin = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0
    except OSError:
        plugin = False
    return "docker compose" if plugin else "docker-compose"


@pytest.fixture(scope="session")
def docker_setup() -> list[str]:
    # Detached; readiness is checked by `registries` (docker-compose 1.x has no --wait).
    return ["up -d"]


@pytest.fixture(scope="session")
def registry_credentials(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    user, password = "driversdk", secrets.token_hex(8)
    auth_dir = tmp_path_factory.mktemp("registry-auth")
    auth_dir.chmod(0o755)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6))
    (auth_dir / "htpasswd").write_bytes(user.encode() + b":" + hashed + b"\n")
    # compose.yml mounts this dir; pytest-docker's compose command inherits the environment.
    os.environ["DRIVERSDK_REGISTRY_AUTH_DIR"] = str(auth_dir)
    return user, password


@pytest.fixture(scope="session")
def docker_compose_file(registry_credentials: tuple[str, str], engine: docker.DockerClient) -> str:
    try:
        engine.images.get(REGISTRY_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"the registry test image {REGISTRY_IMAGE} is missing; run hack/build-registry-image.sh")
    return str(Path(__file__).parent / "compose.yml")


@pytest.fixture(scope="session")
def docker_compose_project_name() -> str:
    return f"driversdk-registry-{os.getpid()}"


@dataclass(frozen=True)
class Registries:
    plain: str
    auth: str
    user: str
    password: str
    blob_id: str  # the pushed image's id (both registries, tag 1.0)

    def image(self, where: str, tag: str = "1.0") -> str:
        return f"{where}/{REPO}:{tag}"


def _answers(address: str, code: int) -> bool:
    try:
        urllib.request.urlopen(f"http://{address}/v2/", timeout=2)
        return code == 200
    except urllib.error.HTTPError as err:
        return err.code == code
    except OSError:
        return False


def make_blob_image(engine: docker.DockerClient, repository: str, tag: str, size: int = 3_000_000) -> str:
    """An image of busybox plus a layer of `size` random bytes (a pull downloads it); its id."""
    container = engine.containers.run(
        IMAGE,
        ["/bin/sh", "-c", f"head -c {size} /dev/urandom > /blob"],
        detach=True,
        labels=TEST_LABEL,
        network_mode="none",
    )
    try:
        container.wait(timeout=60)
        image = container.commit(repository, tag, conf={"Labels": TEST_LABEL})
    finally:
        container.remove(force=True)
    return str(image.id)


def push(engine: docker.DockerClient, reference: str, auth: dict[str, str] | None = None) -> None:
    repository, tag = reference.rsplit(":", 1)
    for line in engine.api.push(repository, tag, stream=True, decode=True, auth_config=auth):
        if "error" in line:
            raise AssertionError(f"push of {reference} failed: {line['error']}")


def forget_image(engine: docker.DockerClient, reference: str) -> None:
    try:
        engine.images.remove(reference)
    except docker.errors.ImageNotFound:
        pass


@pytest.fixture(scope="session")
def registries(
    docker_services: Any, docker_ip: str, registry_credentials: tuple[str, str], engine: docker.DockerClient
) -> Iterator[Registries]:
    plain = f"{docker_ip}:{docker_services.port_for('plain', 5000)}"
    auth = f"{docker_ip}:{docker_services.port_for('auth', 5000)}"
    docker_services.wait_until_responsive(lambda: _answers(plain, 200), timeout=60, pause=0.2)
    docker_services.wait_until_responsive(lambda: _answers(auth, 401), timeout=60, pause=0.2)
    user, password = registry_credentials
    blob_id = make_blob_image(engine, f"{plain}/{REPO}", "1.0")
    engine.images.get(blob_id).tag(f"{auth}/{REPO}", "1.0")
    push(engine, f"{plain}/{REPO}:1.0")
    push(engine, f"{auth}/{REPO}:1.0", {"username": user, "password": password})
    for ref in (f"{plain}/{REPO}:1.0", f"{auth}/{REPO}:1.0"):
        forget_image(engine, ref)
    yield Registries(plain, auth, user, password, blob_id)


@pytest.fixture
def missing(engine: docker.DockerClient, registries: Registries) -> Iterator[Callable[[str], str]]:
    """missing(ref) -> ref: removed locally now (so a task must pull it) and again after the test."""
    refs: list[str] = []

    def make(ref: str) -> str:
        forget_image(engine, ref)
        refs.append(ref)
        return ref

    yield make
    for ref in refs:
        forget_image(engine, ref)


class SlowProxy:
    """A TCP proxy on 127.0.0.1 to a registry that passes at most `rate` bytes/s downstream
    (0: it accepts and never answers; `stall_after`: it goes silent past that many bytes), and
    records the HTTP request lines it forwards."""

    def __init__(self, target: str, rate: int, stall_after: int | None = None) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.rate = rate
        # Past this many bytes sent downstream (all connections), nothing more is passed on.
        self.stall_after = stall_after
        self.sent = 0
        self.requests: list[str] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._closing = threading.Event()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._socks.append(client)
            if self.rate == 0:
                continue  # held open, never answered
            upstream = socket.create_connection(self.target)
            self._socks.append(upstream)
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                for line in data.split(b"\r\n"):
                    if line.startswith((b"GET ", b"HEAD ")):
                        self.requests.append(line.decode(errors="replace"))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(dst)

    def _down(self, src: socket.socket, dst: socket.socket) -> None:
        chunk = max(1, self.rate // 20)
        try:
            while data := src.recv(chunk):
                if self.stall_after is not None and self.sent + len(data) > self.stall_after:
                    self._closing.wait()  # hold the connection open, silent
                    return
                self.sent += len(data)
                dst.sendall(data)
                time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            _shut(dst)

    def close(self) -> None:
        self._closing.set()
        self._server.close()
        for s in self._socks:
            _shut(s)
            s.close()


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


@pytest.fixture
def slow_proxy() -> Iterator[list[SlowProxy]]:
    made: list[SlowProxy] = []
    yield made
    for proxy in made:
        proxy.close()


@pytest.fixture
def plugin(
    engine: docker.DockerClient, no_leaks: None, missing: Callable[[str], str]
) -> Iterator[Callable[..., DriverHarness]]:
    """plugin(**config, env=...) -> a started harness; all are closed (their tasks destroyed) after the
    test, before `missing` removes its images."""
    made: list[DriverHarness] = []

    def make(env: dict[str, str] | None = None, **config: Any) -> DriverHarness:
        h = DriverHarness(PLUGIN, plugin_config={**PLUGIN_CONFIG, **config}, env=env)
        h.__enter__()
        made.append(h)
        return h

    yield make
    for h in reversed(made):
        h.__exit__(None, None, None)
