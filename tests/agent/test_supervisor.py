"""The CSI plugin supervisor against a real hostpath plugin process on a unix socket: wait for
ready, register with Nomad's options, heartbeat events on health changes, deregister."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.agent.csi import pluginsupervisor as sup
from driversdk.agent.csi.pluginsupervisor import PluginSupervisor
from driversdk.agent.csi.registry import PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.jobspec.job import CSIPluginConfig, Task

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the supervisor makes a shared bind mount: root only")


def start_plugin(socket: str, root: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "driversdk.csi.hostpath", "--endpoint", f"unix://{socket}", "--root", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for(condition: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition never became true")


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nomad's 5 s probe and 30 s heartbeat, shortened so the test sees several rounds."""
    monkeypatch.setattr(sup, "PROBE_INTERVAL", 0.2)
    monkeypatch.setattr(sup, "HEARTBEAT_INTERVAL", 0.2)


@pytest.fixture
def events() -> list[str]:
    return []


@pytest.fixture
def supervisor(short_dir: Path, fast: None, events: list[str]) -> Iterator[PluginSupervisor]:
    task = Task(name="plugin", driver="exec", csi_plugin=CSIPluginConfig(id="hostpath", type="monolith"))
    store = StateStore(str(short_dir / "data" / "state.db"))
    supervisor = PluginSupervisor(
        task=task, alloc_id="a1" * 18, data_dir=str(short_dir / "data"), registry=PluginRegistry(store),
        say=events.append,
    )  # fmt: skip
    yield supervisor
    supervisor.stop()
    supervisor.cleanup()
    store.close()


def test_supervisor_registers_heartbeats_and_deregisters(
    supervisor: PluginSupervisor, short_dir: Path, events: list[str]
) -> None:
    mounts, env = supervisor.prestart()
    assert env == {"CSI_ENDPOINT": "unix:///csi/csi.sock"}
    assert [(m.destination, m.propagation) for m in mounts] == [
        ("/csi", "bidirectional"),
        ("/local/csi", "bidirectional"),
    ]
    failures: list[str] = []
    supervisor.start(failures.append)
    time.sleep(0.5)
    assert supervisor.registry.current("csi-node", "hostpath") is None, "not registered before it is healthy"
    plugin = start_plugin(supervisor.socket_path, short_dir / "backing")
    try:
        wait_for(lambda: supervisor.registry.current("csi-node", "hostpath") is not None)
        assert '==> task "plugin": Plugin became healthy: plugin: hostpath' in events
        for kind in ("csi-node", "csi-controller"):  # monolith: both roles
            reg = supervisor.registry.current(kind, "hostpath")
            assert reg is not None and reg.socket_path == supervisor.socket_path
            assert reg.options == {
                "Provider": "hostpath.csi.driversdk.io",
                "MountPoint": str(short_dir / "data" / "client" / "csi" / "monolith" / "hostpath"),
                "ContainerMountPoint": "/local/csi",
            }
        plugin.kill()
        plugin.wait()
        wait_for(lambda: any("Plugin became unhealthy: Error: " in e for e in events))
        assert supervisor.registry.current("csi-node", "hostpath") is not None, "a failed heartbeat keeps it"
        os.unlink(supervisor.socket_path)  # a plugin killed hard leaves its socket; a restart removes it
        plugin = start_plugin(supervisor.socket_path, short_dir / "backing")
        wait_for(lambda: events.count('==> task "plugin": Plugin became healthy: plugin: hostpath') == 2)
        assert failures == []
    finally:
        plugin.kill()
        plugin.wait()
    supervisor.stop()
    assert supervisor.registry.current("csi-node", "hostpath") is None
    assert supervisor.registry.current("csi-controller", "hostpath") is None


def test_supervisor_gives_up_after_health_timeout(short_dir: Path, fast: None, events: list[str]) -> None:
    task = Task(
        name="plugin",
        driver="exec",
        csi_plugin=CSIPluginConfig(id="hostpath", type="node", health_timeout="500ms"),
    )
    store = StateStore(str(short_dir / "data" / "state.db"))
    supervisor = PluginSupervisor(
        task=task, alloc_id="b2" * 18, data_dir=str(short_dir / "data"), registry=PluginRegistry(store),
        say=events.append, fs_isolated=False,
    )  # fmt: skip
    try:
        _, env = supervisor.prestart()
        assert env == {"CSI_ENDPOINT": f"unix://{supervisor.socket_path}"}, "no isolation: the host path"
        failures: list[str] = []
        supervisor.start(failures.append)
        wait_for(lambda: failures)
        assert failures == ["CSI plugin did not become healthy before configured 500ms health timeout"]
        [event] = events
        assert event.startswith(
            '==> task "plugin": Plugin became unhealthy: Error: CSI plugin failed probe: failed to open CSI plugin '
            f"socket {supervisor.socket_path}: it does not exist"
        )
    finally:
        supervisor.stop()
        supervisor.cleanup()
        store.close()
    assert not os.path.exists(supervisor.socket_dir)
    assert not [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(short_dir) in line]
