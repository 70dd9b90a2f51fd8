#!/usr/bin/env python3
"""N running tasks on one plugin with their streams open: plugin RSS, threads, unary latency.

Run as root for exec: python3 bench/bench_streams.py [--tasks 100] [--driver exec|hello|streams]

What a host keeps open, as Nomad's client does: per task a WaitTask call and a TaskStats stream
(1 s interval); per plugin one TaskEvents and one Fingerprint stream. The streams are opened and
left unread (the plugin still serves them). Figures, from the same run:

- plugin RSS and thread count (``/proc/<pid>/status``) with one task and no stream ("idle"),
  then with N tasks and their streams;
- unary latency: the median of InspectTask round trips, idle vs under that load (ratio printed).

``streams`` is the make-believe driver of tests/sdk/plugins (tasks without a process or a thread,
WaitTask through watch_exit): its figures are the SDK's own cost, with no driver's cost beside it.

Issue 15's goal for 1000 exec tasks: RSS <= 100 MiB, <= 64 threads, latency <= 2x idle.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.client import DriverClient  # noqa: E402
from driversdk.pb import driver_pb2  # noqa: E402
from driversdk.testing import AllocDir, DriverHarness  # noqa: E402

PLUGINS = {
    "exec": [sys.executable, "-m", "drivers.exec"],
    "hello": [sys.executable, str(ROOT / "examples" / "hello_driver.py")],
    "streams": [sys.executable, str(ROOT / "tests" / "sdk" / "plugins" / "streams_driver.py")],
}
SLEEP = {"command": "/bin/sleep", "args": ["3600"]}


def status(pid: int) -> tuple[float, int]:
    """(RSS in MiB, threads) of a process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def latency_ms(client: DriverClient, task_id: str, calls: int) -> float:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        client.inspect_task(task_id)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--driver", choices=sorted(PLUGINS), default="exec")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to keep the load after measuring")
    args = parser.parse_args()
    # A `timeout` or Ctrl-C still destroys every task started (DriverHarness.close).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    base = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    config = {"state_dir": str(base / "state")} if args.driver == "exec" else {}
    alloc = AllocDir.create(base / "allocs", tasks=[])
    streams: list[Any] = []
    try:
        with DriverHarness(PLUGINS[args.driver], plugin_config=config) as h:
            pid = h.client.process.pid
            stub = h.client._driver  # the raw stub: streams opened and left unread, as a busy host's are

            def start(i: int) -> str:
                name = f"t{i}"
                alloc.add_task(name, log_collection=False)  # no fifo readers: output goes to /dev/null
                task = alloc.task_config(name, driver_config={} if args.driver == "streams" else SLEEP)
                task.stdout_path = task.stderr_path = "/dev/null"
                h.start(task)
                return task.id

            first = start(0)
            time.sleep(1)
            latency_ms(h.client, first, 50)  # warm-up
            idle_rss, idle_threads = status(pid)
            idle_ms = latency_ms(h.client, first, args.calls)

            ids = [first]
            started = time.perf_counter()
            for i in range(1, args.tasks):
                ids.append(start(i))
            start_s = time.perf_counter() - started
            interval = driver_pb2.TaskStatsRequest().collection_interval
            interval.seconds = 1
            streams.append(stub.TaskEvents(driver_pb2.TaskEventsRequest()))
            streams.append(stub.Fingerprint(driver_pb2.FingerprintRequest()))
            for task_id in ids:
                streams.append(stub.WaitTask.future(driver_pb2.WaitTaskRequest(task_id=task_id)))
                streams.append(
                    stub.TaskStats(driver_pb2.TaskStatsRequest(task_id=task_id, collection_interval=interval))
                )
            time.sleep(5)  # every stream has been answered at least once and is waiting
            busy_rss, busy_threads = status(pid)
            cpu_before, machine_before, wall_before = cpu_seconds(pid), machine_busy(), time.monotonic()
            busy_ms = latency_ms(h.client, first, args.calls)
            wall = time.monotonic() - wall_before
            plugin_cpu = (cpu_seconds(pid) - cpu_before) / wall * 100
            busy_now, total_now = machine_busy()
            machine_cpu = (busy_now - machine_before[0]) / max(total_now - machine_before[1], 1) * 100
            busy_rss2, busy_threads2 = status(pid)
            if args.hold:
                # Keeps the load for a profiler (e.g. py-spy record -p <plugin pid>).
                print(f"holding the load for {args.hold:.0f} s; plugin pid {pid}", flush=True)
                time.sleep(args.hold)
            for stream in streams:
                stream.cancel()
            streams.clear()
    finally:
        for stream in streams:
            stream.cancel()
        alloc.remove()
        shutil.rmtree(base, ignore_errors=True)
    print(f"{args.driver} plugin, {args.tasks} running tasks with WaitTask + TaskStats each, + TaskEvents, Fingerprint")
    print(f"  started {args.tasks - 1} more tasks in {start_s:.1f} s")
    print(f"  plugin RSS      idle {idle_rss:6.1f} MiB   loaded {max(busy_rss, busy_rss2):6.1f} MiB")
    print(f"  plugin threads  idle {idle_threads:6d}       loaded {max(busy_threads, busy_threads2):6d}")
    print(
        f"  InspectTask     idle {idle_ms:6.2f} ms    loaded {busy_ms:6.2f} ms   ratio {busy_ms / idle_ms:.2f}"
        f"  (median of {args.calls})"
    )
    print(f"  under load: plugin CPU {plugin_cpu:.0f}% of one core, machine {machine_cpu:.0f}% busy (all cores)")


if __name__ == "__main__":
    main()
