"""Docker engine health and node attributes, with the reference's names."""

from __future__ import annotations

from typing import Any

from drivers.docker.config import PluginConfig
from driversdk.model import Attribute, Fingerprint, HealthState


def fingerprint(api: Any, plugin: PluginConfig, detected_before: bool) -> Fingerprint:
    try:
        version = api.version()
        info = api.info()
    except Exception:
        # Undetected until the engine was seen once; after that, an engine that went away is unhealthy.
        health = HealthState.UNHEALTHY if detected_before else HealthState.UNDETECTED
        return Fingerprint(health, "Failed to connect to docker daemon")
    attrs: dict[str, Any] = {
        "driver.docker.version": str(version.get("Version", "")),
        "driver.docker.os_type": str(info.get("OSType", "linux")),
        "driver.docker.runtimes": ",".join(sorted((info.get("Runtimes") or {}).keys())),
    }
    if plugin.allow_privileged:
        attrs["driver.docker.privileged.enabled"] = Attribute(True)
    if plugin.volumes_enabled:
        attrs["driver.docker.volumes.enabled"] = Attribute(True)
    try:
        bridge = api.inspect_network("bridge")
        configs = (bridge.get("IPAM") or {}).get("Config") or []
        gateway = next((c.get("Gateway") for c in configs if c.get("Gateway")), None)
        if gateway:
            attrs["driver.docker.bridge_ip"] = gateway
    except Exception:
        pass
    return Fingerprint(HealthState.HEALTHY, "Healthy", attrs)
