"""The driver manager fingerprints the node's drivers (Nomad's drivermanager does): a healthy
plugin is kept with its attributes and facts, an unhealthy one says why and is let go at once."""

from __future__ import annotations

from pathlib import Path

from driversdk.agent.allocrunner.allocrunner import NodeServices
from driversdk.agent.pluginmanager.drivermanager import DriverManager
from driversdk.jobspec.clientconfig import ClientConfig


def test_the_driver_manager_fingerprints_and_lets_an_unhealthy_driver_go(tmp_path: Path) -> None:
    client = ClientConfig(data_dir=str(tmp_path / "data"))
    node = NodeServices.open(client.data_dir)
    drivers = node.drivers = DriverManager(client, node.state, lambda _event: None)
    try:
        healthy = drivers.fingerprint("exec")
        assert healthy.healthy and healthy.description == "Healthy"
        assert healthy.attributes["driver.exec"] == "true"
        assert drivers.facts["exec"].attributes == healthy.attributes
        assert drivers.health["exec"] is healthy
        assert "exec" in drivers.running()  # kept: the node's tasks will use it

        # raw_exec is disabled unless the operator enables it: the plugin says so and is shut down.
        disabled = drivers.fingerprint("raw_exec")
        assert not disabled.healthy and disabled.description, disabled
        assert "driver.raw_exec" not in disabled.attributes
        assert "raw_exec" not in drivers.running()
    finally:
        drivers.close()
        node.close()
