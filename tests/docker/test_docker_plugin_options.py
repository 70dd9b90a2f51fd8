"""Nomad's docker plugin options: each applied one read back from the engine, each refused one
answered with its sentence by SetConfig."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from driversdk.errors import PluginCallError
from driversdk.testing import AllocDir, DriverHarness

from .conftest import PLUGIN, PLUGIN_CONFIG, busybox

SLEEP = ("sleep", "300")


def _set_config_error(**config: Any) -> str:
    with pytest.raises(PluginCallError) as info:
        DriverHarness(PLUGIN, plugin_config={**PLUGIN_CONFIG, **config})  # SetConfig is sent at launch
    return info.value.message


@pytest.fixture
def plugin(engine: docker.DockerClient, no_leaks: None, tmp_path: Path) -> Iterator[Any]:
    made: list[DriverHarness] = []

    def make(**config: Any) -> DriverHarness:
        h = DriverHarness(PLUGIN, plugin_config={**PLUGIN_CONFIG, **config})
        h.__enter__()
        made.append(h)
        return h

    yield make
    for h in reversed(made):
        h.__exit__(None, None, None)


def _container(engine: docker.DockerClient, alloc: AllocDir, task: str = "web") -> Any:
    return engine.containers.get(f"{task}-{alloc.alloc_id}")


def test_docker_plugin_options_refused_by_set_config(engine: docker.DockerClient) -> None:
    assert "windows_allow_insecure_container_admin applies only to Windows containers" in _set_config_error(
        windows_allow_insecure_container_admin=True
    )
    assert "pull_activity_timeout is less than minimum, 1m0s" in _set_config_error(pull_activity_timeout="30s")
    assert "container_exists_attempts 0 must be at least 1" in _set_config_error(container_exists_attempts=0)
    assert "tls needs both cert and key" in _set_config_error(endpoint="tcp://127.0.0.1:1", tls={"cert": "/c.pem"})
    assert "tls in the docker plugin config:" in _set_config_error(
        endpoint="tcp://127.0.0.1:1", tls={"cert": "/nonexistent.pem", "key": "/nonexistent.key"}
    )


def test_docker_allow_privileged_allow_caps_and_modes(plugin: Any, engine: docker.DockerClient, tmp_path: Path) -> None:
    h = plugin(allow_privileged=True, allow_caps=["all"])
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    # allow_privileged also lifts the allowed_modes check (pid_mode host with no allowed_modes).
    task = alloc.task_config("web", driver_config=busybox(*SLEEP, cap_add=["sys_admin"], pid_mode="host"))
    h.start(task)
    hc = _container(engine, alloc).attrs["HostConfig"]
    assert hc["CapAdd"] == ["SYS_ADMIN"] and hc["PidMode"] == "host"
    assert not hc["CapDrop"]  # "all" allowed: nothing of Docker's defaults is dropped
    h.client.destroy_task(task.id, force=True)
    h.forget(task.id)
    # privileged = true reaches the engine (no refusal of ours); this machine's engine runs without
    # CAP_SYS_RESOURCE itself, so it cannot grant a privileged container and says so.
    task = alloc.task_config("priv", driver_config=busybox(*SLEEP, privileged=True))
    try:
        h.start(task)
        assert _container(engine, alloc, "priv").attrs["HostConfig"]["Privileged"] is True
    except PluginCallError as err:
        assert "privileged mode is disabled" not in err.message and "unable to apply caps" in err.message


def test_docker_selinuxlabel_gc_container_and_plugin_logging(
    plugin: Any, engine: docker.DockerClient, tmp_path: Path
) -> None:
    h = plugin(
        volumes={"enabled": True, "selinuxlabel": "z"},
        gc={"image": False, "container": False},
        logging={"type": "json-file", "config": {"max-size": "5m", "max-file": "3"}},
    )
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    task = alloc.task_config("web", driver_config=busybox("true", volumes=["/etc/hostname:/h:ro"]))
    h.start(task)
    assert h.client.wait_task(task.id, timeout=60).exit_code == 0
    c = _container(engine, alloc)
    binds = c.attrs["HostConfig"]["Binds"]
    assert f"{alloc.path}/alloc:/alloc:z" in binds and "/etc/hostname:/h:ro,z" in binds
    assert c.attrs["HostConfig"]["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "5m", "max-file": "3"}}
    h.client.destroy_task(task.id, force=True)
    h.forget(task.id)
    # gc.container = false: the container outlives its task.
    c.reload()
    assert c.status == "exited"
    c.remove(force=True)


def test_docker_container_exists_attempts_replace_a_stopped_namesake(
    plugin: Any, engine: docker.DockerClient, tmp_path: Path
) -> None:
    h = plugin(container_exists_attempts=2)
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    stale = engine.containers.create(
        PLUGIN_CONFIG["infra_image"], name=f"web-{alloc.alloc_id}", labels={"io.driversdk.test": "stale"}
    )
    task = alloc.task_config("web", driver_config=busybox(*SLEEP))
    h.start(task)
    assert _container(engine, alloc).id != stale.id
    h.client.destroy_task(task.id, force=True)
    h.forget(task.id)


# --- tls: the engine behind a TLS proxy that demands a client certificate from our CA ---------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certs(d: Path) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "1", "-subj", "/CN=driversdk-test-ca", cwd=d)  # fmt: skip
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


class TLSEngineProxy:
    """127.0.0.1:<port> with TLS (client certificate required) in front of /var/run/docker.sock."""

    def __init__(self, d: Path) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(d / "ca.pem"))
        self.ctx.load_cert_chain(str(d / "server.pem"), str(d / "server.key"))
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.verified_clients = 0
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            conn = self.ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()
            return
        if conn.getpeercert():
            self.verified_clients += 1
        engine = socket.socket(socket.AF_UNIX)
        engine.connect("/var/run/docker.sock")
        self._socks += [conn, engine]
        threading.Thread(target=_pump, args=(engine, conn), daemon=True).start()
        _pump(conn, engine)

    def close(self) -> None:
        self.server.close()
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


@pytest.fixture
def tls_engine(tmp_path: Path) -> Iterator[tuple[TLSEngineProxy, Path]]:
    if not os.path.exists("/var/run/docker.sock"):
        pytest.skip("the engine is not at /var/run/docker.sock")
    d = tmp_path / "pki"
    d.mkdir()
    _certs(d)
    proxy = TLSEngineProxy(d)
    yield proxy, d
    proxy.close()


def test_docker_tls_endpoint_with_client_certificate(
    plugin: Any, engine: docker.DockerClient, tmp_path: Path, tls_engine: tuple[TLSEngineProxy, Path]
) -> None:
    proxy, d = tls_engine
    h = plugin(
        endpoint=f"tcp://127.0.0.1:{proxy.port}",
        tls={"cert": str(d / "client.pem"), "key": str(d / "client.key"), "ca": str(d / "ca.pem")},
    )
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    task = alloc.task_config("web", driver_config=busybox("echo", "over-tls"))
    h.start(task)
    assert h.client.wait_task(task.id, timeout=60).exit_code == 0
    assert alloc.wait_for_output("web", b"over-tls", 10)
    assert proxy.verified_clients > 0
    h.client.destroy_task(task.id, force=True)
    h.forget(task.id)
