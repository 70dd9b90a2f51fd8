"""StartTask -> exit of `true` through the exec plugin, beside a raw `runc run` of the same bundle.

Run as root: python3 bench/bench_exec.py [iterations]

Both sides run the same OCI config (built by the driver's own bundle builder): the raw side is
`runc run` of a prepared bundle, timed from spawn to exit; ours is StartTask + WaitTask over gRPC
to a real plugin subprocess (bundle writing, cgroup creation, fifo opening and the supervisor
included). DestroyTask is timed separately and not part of the ratio.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from drivers.exec.bundle import Bundle, build_spec
from drivers.exec.config import PluginConfig, TaskExecConfig
from driversdk.taskkit.cgroups import cgroup_mounts
from driversdk.testing import AllocDir, DriverHarness

PLUGIN = [sys.executable, "-m", "drivers.exec"]
COMMAND = {"command": "/bin/true"}


def raw_runs(base: Path, alloc: AllocDir, n: int) -> list[float]:
    plugin = PluginConfig(state_dir=str(base / "state"))
    task = alloc.task_config("web", driver_config=COMMAND)
    cfg = TaskExecConfig.from_decoded(COMMAND, plugin, task="web")
    times = []
    for i in range(n):
        bundle = Bundle(str(base / f"raw-{i}"))
        spec, links = build_spec(task, cfg, plugin, cgroups_path=f"/driversdk-bench/raw-{i}")
        bundle.write(spec, links)
        started = time.perf_counter()
        argv = ["runc", "run", "--bundle", bundle.dir, f"dsx-bench-raw-{i}"]
        subprocess.run(argv, stdin=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
        shutil.rmtree(bundle.dir)
    return times


def plugin_runs(h: DriverHarness, alloc: AllocDir, n: int) -> tuple[list[float], list[float]]:
    times, destroys = [], []
    for _ in range(n):
        task = alloc.task_config("web", driver_config=COMMAND)
        started = time.perf_counter()
        h.client.start_task(task)
        result = h.client.wait_task(task.id, timeout=60)
        times.append(time.perf_counter() - started)
        assert result.exit_code == 0, result
        started = time.perf_counter()
        h.client.destroy_task(task.id)
        destroys.append(time.perf_counter() - started)
    return times, destroys


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("bench_exec needs root (runc, cgroups)")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    base = Path(tempfile.mkdtemp(prefix="bench-exec-"))
    alloc = AllocDir.create(base / "allocs", tasks=["web"])
    try:
        with DriverHarness(PLUGIN, plugin_config={"state_dir": str(base / "state")}) as h:
            # Warm-up both paths (page cache, python imports in the plugin).
            plugin_runs(h, alloc, 2)
            raw_runs(base, alloc, 2)
            raw, ours, destroys = [], [], []
            # Interleave in rounds so both sides see the same machine load.
            for _ in range(max(1, n // 5)):
                raw += raw_runs(base, alloc, 5)
                times, d = plugin_runs(h, alloc, 5)
                ours += times
                destroys += d
    finally:
        alloc.remove()
        shutil.rmtree(base, ignore_errors=True)
        # runc removes each raw run's own cgroup but not the parent it created for them.
        for root in set(cgroup_mounts().values()):
            if os.path.isdir(f"{root}/driversdk-bench"):
                os.rmdir(f"{root}/driversdk-bench")
    raw_ms = statistics.median(raw) * 1000
    ours_ms = statistics.median(ours) * 1000
    print(f"exec StartTask->exit of `true`, {len(ours)} runs each (median)")
    print(f"  raw `runc run` of the same bundle : {raw_ms:7.1f} ms")
    print(f"  driversdk exec plugin (gRPC)      : {ours_ms:7.1f} ms")
    print(f"  ratio                             : {ours_ms / raw_ms:7.2f}  (goal <= 1.3)")
    print(f"  DestroyTask afterwards (not in ratio): {statistics.median(destroys) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
