"""Health of the exec driver: runc answers and the plugin runs as root."""

from __future__ import annotations

import os

from drivers.exec.runc import Runc, RuncError
from driversdk.model import Fingerprint, HealthState
from driversdk.taskkit.cgroups import unified_only


def fingerprint(runc: Runc, *, detected_before: bool = False) -> Fingerprint:
    """Undetected until runc was seen once; after that a runc that stops answering is unhealthy."""
    if os.geteuid() != 0:
        return Fingerprint(HealthState.UNDETECTED, "exec driver must run as root")
    try:
        version = runc.version()
    except RuncError:
        health = HealthState.UNHEALTHY if detected_before else HealthState.UNDETECTED
        return Fingerprint(health, f"runc runtime {runc.path!r} is not available")
    attrs: dict[str, str | bool] = {
        "driver.exec.runtime": "runc",
        "driver.exec.runtime.version": version,
        "driver.exec.cgroup.version": "v2" if unified_only() else "v1",
    }
    return Fingerprint(HealthState.HEALTHY, "Healthy", dict(attrs))
