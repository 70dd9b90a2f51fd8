"""Docker engine health and node attributes, with the reference's names."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from drivers.docker.config import PluginConfig
from driversdk.model import Attribute, Fingerprint, HealthState


def fingerprint(api: Any, plugin: PluginConfig, detected_before: bool) -> Fingerprint:
    # The engine's three answers do not depend on each other: asked at once, a fingerprint costs
    # the slowest of them (`/info`, which walks the engine's state) instead of their sum.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="docker-fingerprint") as pool:
        info_asked = pool.submit(api.info)
        gateway_asked = pool.submit(_bridge_gateway, api)
        try:
            version = api.version()
            info = info_asked.result()
        except Exception:
            # Undetected until the engine was seen once; after that, an engine that went away is unhealthy.
            health = HealthState.UNHEALTHY if detected_before else HealthState.UNDETECTED
            return Fingerprint(health, "Failed to connect to docker daemon")
        gateway = gateway_asked.result()
    attrs: dict[str, Any] = {
        "driver.docker.version": str(version.get("Version", "")),
        "driver.docker.os_type": str(info.get("OSType", "linux")),
        "driver.docker.runtimes": ",".join(sorted((info.get("Runtimes") or {}).keys())),
    }
    if plugin.allow_privileged:
        attrs["driver.docker.privileged.enabled"] = Attribute(True)
    if plugin.volumes_enabled:
        attrs["driver.docker.volumes.enabled"] = Attribute(True)
    if gateway:
        attrs["driver.docker.bridge_ip"] = gateway
    return Fingerprint(HealthState.HEALTHY, "Healthy", attrs)


def _bridge_gateway(api: Any) -> str | None:
    """The default bridge network's gateway, or None (no bridge network, or the engine did not
    say): the attribute is left out rather than failing the fingerprint."""
    try:
        bridge = api.inspect_network("bridge")
        configs = (bridge.get("IPAM") or {}).get("Config") or []
        gateway = next((c.get("Gateway") for c in configs if c.get("Gateway")), None)
    except Exception:
        return None
    return str(gateway) if gateway else None
