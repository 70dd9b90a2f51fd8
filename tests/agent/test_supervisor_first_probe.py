"""The CSI plugin supervisor probes a plugin as soon as its socket appears, not one probe interval
after its task started: a real hostpath plugin process, started after the supervisor's first
probe found no socket, is registered without the supervisor sleeping out the interval."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from driversdk.agent.csi import pluginsupervisor as sup
from driversdk.agent.csi.pluginsupervisor import PluginSupervisor, socket_present
from driversdk.agent.csi.registry import PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.csi.client import CSIClient
from driversdk.jobspec.job import CSIPluginConfig, Task

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the supervisor makes a shared bind mount: root only")


def wait_for(condition: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition never became true")


@pytest.fixture
def supervisor(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginSupervisor]:
    # An interval no test outlives: a supervisor that slept it out before probing again would
    # never register the plugin here.
    monkeypatch.setattr(sup, "PROBE_INTERVAL", 3600.0)
    task = Task(
        name="plugin", driver="exec", csi_plugin=CSIPluginConfig(id="hostpath", type="node", health_timeout="2h")
    )
    store = StateStore(str(short_dir / "data" / "state.db"))
    supervisor = PluginSupervisor(
        task=task, alloc_id="c3" * 18, data_dir=str(short_dir / "data"), registry=PluginRegistry(store),
        say=lambda _: None, fs_isolated=False,
    )  # fmt: skip
    yield supervisor
    supervisor.stop()
    supervisor.cleanup()
    store.close()


def test_plugin_is_probed_as_soon_as_its_socket_appears(
    supervisor: PluginSupervisor, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes: list[str | None] = []
    real_probe = supervisor._probe

    def recorded(client: CSIClient | None) -> tuple[CSIClient | None, str | None]:
        client, error = real_probe(client)
        probes.append(error)
        return client, error

    monkeypatch.setattr(supervisor, "_probe", recorded)
    supervisor.prestart()
    failures: list[str] = []
    supervisor.start(failures.append)
    wait_for(lambda: probes)  # the first probe, at once: no socket yet
    assert probes[0] is not None and "it does not exist" in probes[0]
    calls = short_dir / "calls.log"
    plugin = subprocess.Popen(
        [sys.executable, "-m", "driversdk.csi.hostpath", "--endpoint", f"unix://{supervisor.socket_path}",
         "--root", str(short_dir / "backing"), "--call-log", str(calls)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: supervisor.registry.current("csi-node", "hostpath") is not None)
        # Two probes: the one that found no socket, then the one its appearance woke.
        assert probes == [probes[0], None]
        assert calls.read_text().splitlines()[:2] == ["Probe", "GetPluginInfo"], "probed, then registered"
        assert supervisor.healthy is True and failures == []
    finally:
        plugin.kill()
        plugin.wait()


def test_only_a_socket_itself_wakes_the_wait(short_dir: Path) -> None:
    """The plugin owns its socket dir: a symlink there (to a live socket elsewhere), a file or a
    dir is not the plugin's socket and is not followed."""
    real = short_dir / "elsewhere.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(real))
        listener.listen()
        assert socket_present(str(real))
        link = short_dir / "csi.sock"
        link.symlink_to(real)
        assert not socket_present(str(link))
        (short_dir / "file").write_text("")
        (short_dir / "dir").mkdir()
        assert not socket_present(str(short_dir / "file"))
        assert not socket_present(str(short_dir / "dir"))
        assert not socket_present(str(short_dir / "missing" / "csi.sock"))
    finally:
        listener.close()
