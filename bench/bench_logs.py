#!/usr/bin/env python3
"""Exec log path throughput: task stdout -> fifo -> the runner's log collector -> rotated files.

Run as root: python3 bench/bench_logs.py [--mib 512] [--rounds 5]

Ours: an exec task (real runc) runs ``dd if=/dev/zero bs=1M count=<mib>`` with its stdout on the
fifo that ``driversdk.runner.logcollect.spawn`` made, exactly as ``driversdk run`` sets it up; the
collector (a detached process: dir fd, O_NOFOLLOW, owner and link checks, 0640 files) writes
rotated ``web.stdout.<N>`` files of 10 MiB. Timed from StartTask until WaitTask has returned and
the collector has drained the fifo and exited (``logcollect.stop``), so the task's start-up is
included: the figure is conservative. The byte count of the rotated files is checked. The task
gets cpu = 2600 MHz (cgroup weight 100, as the floor's processes have).

Floor: the same bytes through ``dd`` into a fifo and ``cat`` from it into one file.

Rounds are interleaved; medians; MB/s is 10^6 bytes a second.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.model import Resources  # noqa: E402
from driversdk.runner import logcollect  # noqa: E402
from driversdk.runner.logcollect import MIB  # noqa: E402
from driversdk.testing import AllocDir, DriverHarness  # noqa: E402

PLUGIN = [sys.executable, "-m", "drivers.exec"]
GOAL_MBPS = 200.0
FILE_SIZE = 10 * MIB
# cpu = 2600 MHz is cgroup v2 cpu.weight 100, the weight the floor's dd runs with: on a shared
# machine a task at Nomad's default 100 MHz (weight 4) measures its CPU share, not the log path.
TASK_RESOURCES = Resources(cpu_shares=2600, memory_mb=256)


def floor_run(base: Path, mib: int) -> float:
    work = Path(tempfile.mkdtemp(prefix="floor-", dir=base))
    fifo = work / "fifo"
    os.mkfifo(fifo, 0o600)
    started = time.perf_counter()
    with open(work / "out", "wb") as out:
        reader = subprocess.Popen(["cat", str(fifo)], stdout=out)
        subprocess.run(["dd", "if=/dev/zero", f"of={fifo}", "bs=1M", f"count={mib}", "status=none"], check=True)
        reader.wait()
    elapsed = time.perf_counter() - started
    assert (work / "out").stat().st_size == mib * MIB
    shutil.rmtree(work)
    return elapsed


def our_run(h: DriverHarness, alloc: AllocDir, mib: int) -> float:
    logs = str(alloc.path / "alloc" / "logs")
    for name in os.listdir(logs):
        if name.startswith("web.std"):
            os.unlink(os.path.join(logs, name))
    # As the runner's log hook does; enough files kept that every byte can be counted afterwards.
    logmon = logcollect.spawn(logs, "web", max_files=mib // 10 + 5, max_size=FILE_SIZE)
    task = alloc.task_config(
        "web",
        driver_config={"command": "/bin/dd", "args": ["if=/dev/zero", "bs=1M", f"count={mib}", "status=none"]},
        resources=TASK_RESOURCES,
    )
    started = time.perf_counter()
    h.start(task)
    result = h.client.wait_task(task.id, timeout=300)
    logcollect.stop(logmon, timeout=60)
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result
    h.client.destroy_task(task.id)
    h.forget(task.id)
    files = [n for n in os.listdir(logs) if n.startswith("web.stdout.")]
    total = sum(os.stat(os.path.join(logs, n)).st_size for n in files)
    assert total == mib * MIB, (total, len(files))
    assert len(files) == -(-mib * MIB // FILE_SIZE), len(files)  # rotated by size
    return elapsed


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("bench_logs needs root (runc, cgroups)")
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    alloc = AllocDir.create(base / "allocs", tasks=[])
    alloc.add_task("web", log_collection=False)
    try:
        with DriverHarness(PLUGIN, plugin_config={"state_dir": str(base / "state")}) as h:
            our_run(h, alloc, 16)  # warm-up: imports in the plugin, page cache
            floor_run(base, 16)
            ours, floor = [], []
            for _ in range(args.rounds):
                floor.append(floor_run(base, args.mib))
                ours.append(our_run(h, alloc, args.mib))
    finally:
        alloc.remove()
        shutil.rmtree(base, ignore_errors=True)
    size = args.mib * MIB / 1e6
    ours_mbps = size / statistics.median(ours)
    floor_mbps = size / statistics.median(floor)
    verdict = "ok" if ours_mbps >= GOAL_MBPS else f"below the {GOAL_MBPS:.0f} MB/s goal"
    print(f"{args.mib} MiB of task stdout to files, median of {args.rounds} interleaved rounds:")
    print(f"  floor  dd -> fifo -> cat -> file             {floor_mbps:7.0f} MB/s")
    print(f"  ours   exec task -> fifo -> collector -> rotated files {ours_mbps:7.0f} MB/s   ({verdict})")
    print(f"  ratio ours/floor {ours_mbps / floor_mbps:.2f}")


if __name__ == "__main__":
    main()
