"""Container resource usage from the engine's stats endpoint (cgroup v1 and v2)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from drivers.docker.handle import ContainerHandle
from driversdk.model import CpuField, CpuUsage, MemoryField, MemoryUsage, ResourceUsage, TaskStats


def sample_stats(api: Any, handle: ContainerHandle) -> TaskStats:
    raw = api.stats(handle.state.container_id, stream=False, one_shot=True)
    mem = raw.get("memory_stats") or {}
    detail = mem.get("stats") or {}
    v1 = "rss" in detail
    memory = MemoryUsage(
        rss=int(detail.get("rss", detail.get("anon", 0))),
        cache=int(detail.get("cache", detail.get("file", 0))),
        swap=int(detail.get("swap", 0)),
        usage=int(mem.get("usage", 0)),
        max_usage=int(mem.get("max_usage", 0)),
        measured_fields=(MemoryField.RSS, MemoryField.CACHE, MemoryField.SWAP, MemoryField.USAGE)
        + ((MemoryField.MAX_USAGE,) if v1 else ()),
    )
    cpu_stats = raw.get("cpu_stats") or {}
    usage = cpu_stats.get("cpu_usage") or {}
    throttling = cpu_stats.get("throttling_data") or {}
    total = int(usage.get("total_usage", 0))
    system = int(cpu_stats.get("system_cpu_usage", 0))
    cpus = int(cpu_stats.get("online_cpus") or len(usage.get("percpu_usage") or []) or 1)
    percent = 0.0
    previous = handle.previous_cpu
    if previous is not None and system > previous["system"]:
        percent = (total - previous["total"]) / (system - previous["system"]) * cpus * 100.0
    handle.previous_cpu = {"total": total, "system": system}
    cpu = CpuUsage(
        user_mode=float(usage.get("usage_in_usermode", 0)),
        system_mode=float(usage.get("usage_in_kernelmode", 0)),
        throttled_periods=int(throttling.get("throttled_periods", 0)),
        throttled_time=int(throttling.get("throttled_time", 0)),
        percent=max(0.0, percent),
        measured_fields=(CpuField.THROTTLED_PERIODS, CpuField.THROTTLED_TIME, CpuField.PERCENT),
    )
    return TaskStats(timestamp=datetime.now(UTC), usage=ResourceUsage(cpu=cpu, memory=memory))
