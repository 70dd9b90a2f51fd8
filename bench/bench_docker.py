#!/usr/bin/env python3
"""Docker driver benchmarks, each beside its raw baseline measured in the same run.

1. StartTask -> exit of busybox `true` through our plugin vs docker-py create+start+wait+remove.
2. Log throughput: bytes a container writes, through our fifo copier, in MB/s.

Run (needs hack/docker-up.sh and hack/build-test-images.sh): python3 bench/bench_docker.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.testing import AllocDir, DriverHarness  # noqa: E402

IMAGE = "driversdk-test/busybox:local"
PLUGIN = [sys.executable, "-m", "drivers.docker"]


def raw_run(client: docker.DockerClient) -> float:
    start = time.perf_counter()
    container = client.api.create_container(IMAGE, command=["true"], host_config=client.api.create_host_config())
    client.api.start(container["Id"])
    client.api.wait(container["Id"])
    elapsed = time.perf_counter() - start
    client.api.remove_container(container["Id"], force=True)
    return elapsed


def plugin_run(h: DriverHarness, alloc: AllocDir) -> float:
    task = alloc.task_config("bench", driver_config={"image": IMAGE, "command": "true"})
    start = time.perf_counter()
    h.client.start_task(task)
    h.client.wait_task(task.id, timeout=60)
    elapsed = time.perf_counter() - start
    h.client.destroy_task(task.id)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--log-mb", type=int, default=64)
    args = parser.parse_args()
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as tmp, DriverHarness(PLUGIN, plugin_config={"gc": {"image": False}}) as h:
        alloc = AllocDir.create(tmp, tasks=["bench"])
        raw_run(client)
        plugin_run(h, alloc)
        raw, ours = [], []
        for _ in range(args.runs):  # interleaved so engine drift hits both alike
            raw.append(raw_run(client))
            ours.append(plugin_run(h, alloc))
        r, o = statistics.median(raw), statistics.median(ours)
        print(f"start -> exit of busybox `true`, median of {args.runs}:")
        print(f"  raw    docker-py create+start+wait   {r * 1000:8.1f} ms")
        print(f"  ours   StartTask+WaitTask via plugin {o * 1000:8.1f} ms   ratio {o / r:.2f}")

        size = args.log_mb * 1024 * 1024
        task = alloc.task_config(
            "bench",
            driver_config={
                "image": IMAGE,
                "command": "/bin/sh",
                "args": ["-c", f"head -c {size} /dev/zero | tr '\\0' 'x' | fold -w 1023"],
            },
        )
        expected = size + size // 1023
        start = time.perf_counter()
        h.client.start_task(task)
        h.client.wait_task(task.id, timeout=600)
        while len(alloc.stdout("bench")) < expected and time.perf_counter() - start < 600:
            time.sleep(0.05)
        elapsed = time.perf_counter() - start
        got = len(alloc.stdout("bench"))
        h.client.destroy_task(task.id)
        print(
            f"log throughput through the fifo: {got / elapsed / 1e6:.1f} MB/s ({got / 1e6:.0f} MB in {elapsed:.1f} s)"
        )
        alloc.remove()


if __name__ == "__main__":
    main()
