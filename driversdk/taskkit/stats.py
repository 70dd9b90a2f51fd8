"""TaskStats from the task's cgroup counters."""

from __future__ import annotations

from datetime import UTC, datetime

from driversdk.model import CpuField, CpuUsage, MemoryField, MemoryUsage, ResourceUsage, TaskStats
from driversdk.taskkit.cgroups import CgroupSample, CounterFiles, TaskCgroup

CPU_FIELDS = (
    CpuField.SYSTEM_MODE,
    CpuField.USER_MODE,
    CpuField.PERCENT,
    CpuField.THROTTLED_PERIODS,
    CpuField.THROTTLED_TIME,
)
MEMORY_FIELDS = (MemoryField.RSS, MemoryField.CACHE, MemoryField.SWAP, MemoryField.USAGE, MemoryField.MAX_USAGE)


def _percent(now: int, before: int, seconds: float) -> float:
    if seconds <= 0 or now < before:
        return 0.0
    return (now - before) / 1e9 / seconds * 100.0


def task_stats(
    cgroup: TaskCgroup, previous: CgroupSample | None, files: CounterFiles | None = None
) -> tuple[TaskStats, CgroupSample]:
    """One sample; CPU percentages are over the time since ``previous`` (zero for the first).
    ``files`` keeps the task's counter files open from one sample to the next."""
    sample = cgroup.sample(files)
    seconds = sample.at - previous.at if previous else 0.0
    base = previous or sample
    cpu = CpuUsage(
        system_mode=_percent(sample.cpu_system_ns, base.cpu_system_ns, seconds),
        user_mode=_percent(sample.cpu_user_ns, base.cpu_user_ns, seconds),
        percent=_percent(sample.cpu_total_ns, base.cpu_total_ns, seconds),
        throttled_periods=sample.throttled_periods,
        throttled_time=sample.throttled_ns,
        measured_fields=CPU_FIELDS,
    )
    memory = MemoryUsage(
        rss=sample.memory_rss,
        cache=sample.memory_cache,
        swap=sample.memory_swap,
        usage=sample.memory_usage,
        max_usage=sample.memory_max_usage,
        measured_fields=MEMORY_FIELDS,
    )
    stats = TaskStats(timestamp=datetime.now(UTC), usage=ResourceUsage(cpu=cpu, memory=memory))
    return stats, sample
