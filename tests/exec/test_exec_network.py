"""Group networking: per-allocation netns with a veth on our own bridge, reachable peer to peer.

Traffic stays between namespaces these tests create: the test subnet of our own bridge, and an
"outside" host that is one more namespace on this machine (tests/outside.py).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from driversdk import netegress
from driversdk.errors import PluginCallError
from driversdk.model import NetworkIsolationMode, NetworkIsolationSpec
from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import BRIDGE, PLUGIN, Tracker, sh
from tests.outside import outside_host

pytestmark = pytest.mark.root

TIMEOUT = 60


@pytest.fixture
def net_harness(plugin_config: dict[str, Any], no_leaks: None) -> Iterator[DriverHarness]:
    config = {**plugin_config, "allow_caps": ["net_raw", "chown", "kill", "setuid", "setgid", "dac_override"]}
    with DriverHarness(PLUGIN, plugin_config=config) as h:
        yield h


def _bridge_exists() -> bool:
    return subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0


def test_exec_group_network_isolated_and_reaches_peer(
    net_harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    client = net_harness.client
    spec, created = client.create_network(alloc.alloc_id, "web-host")
    peer_alloc = str(uuid.uuid4())
    track.alloc_ids.add(peer_alloc)
    peer, _ = client.create_network(peer_alloc, "")
    try:
        assert created and spec.mode == NetworkIsolationMode.GROUP and spec.path.startswith("/var/run/netns/")
        assert client.create_network(alloc.alloc_id, "web-host")[1] is False
        address, peer_address = spec.labels["address"], peer.labels["address"]
        assert address != peer_address
        script = (
            "awk -F: 'NR>2 {gsub(/ /, \"\", $1); print $1}' /proc/net/dev | sort | tr '\\n' ' '; echo; "
            "ip -4 -o addr show eth0 | awk '{print $4}'; hostname; "
            f"ping -c 1 -W 10 {peer_address} >/dev/null && echo peer-reachable"
        )
        task = alloc.task_config("web", driver_config=sh(script, cap_add=["net_raw"]), network=spec)
        net_harness.start(task)
        result = client.wait_task(task.id, timeout=TIMEOUT)
        out = alloc.wait_for_output("web", b"peer-reachable\n", timeout=10).decode().splitlines()
        assert result.exit_code == 0
        assert out[0].split() == ["eth0", "lo"]
        assert out[1] == f"{address}/24"
        assert out[2] == "web-host"
        client.destroy_task(task.id)
        net_harness.forget(task.id)
    finally:
        client.destroy_network(alloc.alloc_id, spec)
        client.destroy_network(peer_alloc, peer)
    assert not _bridge_exists()


def test_exec_group_network_reaches_beyond_the_host_masqueraded_and_the_rules_go_with_the_bridge(
    net_harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    # As Nomad's bridge (ipMasq): the outside host has no route back to the group's subnet, so
    # only a masqueraded request gets its answer, and the answer names the host's own address.
    client = net_harness.client
    with outside_host() as outside:
        spec, _ = client.create_network(alloc.alloc_id, "")
        try:
            assert len(netegress.rules_of(BRIDGE)) == 3
            task = alloc.task_config("web", driver_config=sh(outside.request_script()), network=spec)
            net_harness.start(task)
            result = client.wait_task(task.id, timeout=TIMEOUT)
            out = alloc.wait_for_output("web", b"seen-from", timeout=10).decode()
            assert result.exit_code == 0, out
            assert out.splitlines()[-1] == f"seen-from {outside.host_side}", out
            client.destroy_task(task.id)
            net_harness.forget(task.id)
        finally:
            client.destroy_network(alloc.alloc_id, spec)
    assert not _bridge_exists()
    assert netegress.rules_of(BRIDGE) == []


def test_exec_network_exhausted_subnet_leaves_nothing(
    plugin_config: dict[str, Any], track: Tracker, no_leaks: None
) -> None:
    # A /30 has two host addresses: the bridge's and one allocation's.
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    track.alloc_ids.update((first, second))
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, "bridge_subnet": "10.231.78.0/30"}) as h:
        spec, _ = h.client.create_network(first, "")
        with pytest.raises(PluginCallError) as err:
            h.client.create_network(second, "")
        assert "no free address left in bridge subnet 10.231.78.0/30" in err.value.message
        h.client.destroy_network(first, spec)
        h.client.destroy_network(first, spec)  # idempotent
    assert not track.leftovers() and not _bridge_exists()


def test_exec_host_network_task_sees_host_interfaces(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=sh("cat /proc/net/dev"), network=NetworkIsolationSpec())
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    first_host_link = host_links.splitlines()[1].split(":")[1].strip().split("@")[0]
    assert f"{first_host_link}:".encode() in alloc.wait_for_output("web", b"lo:", timeout=10)
