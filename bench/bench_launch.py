#!/usr/bin/env python3
"""Plugin launch to first answered RPC, beside its floor measured in the same run.

Floor: wall time of ``python -c "import grpc"`` (an interpreter that only loads grpc).
Ours: ``driversdk.launch`` of a plugin through the go-plugin handshake (environment, stdout
line, dial) until its first answered RPC, ``PluginInfo`` — what a host needs before anything
else. Rounds are interleaved (floor, then each plugin) so drift on a shared machine hits all
alike; medians and ratios come from the same run.

Run: python3 bench/bench_launch.py [--rounds N] [--plugins hello,docker,exec,raw_exec]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.client import launch  # noqa: E402

PLUGINS = {
    "hello": [sys.executable, str(ROOT / "examples" / "hello_driver.py")],
    "docker": [sys.executable, "-m", "drivers.docker"],
    "exec": [sys.executable, "-m", "drivers.exec"],
    "raw_exec": [sys.executable, "-m", "drivers.raw_exec"],
}
GOAL = 1.5


def time_floor() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import grpc"], check=True)
    return time.perf_counter() - start


def time_launch(cmd: list[str], name: str) -> float:
    start = time.perf_counter()
    client = launch(cmd, name=name)  # returns once PluginInfo has answered (and said "driver")
    elapsed = time.perf_counter() - start
    client.kill()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--plugins", default=",".join(PLUGINS))
    args = parser.parse_args()
    names = [n for n in args.plugins.split(",") if n]
    # An installed package has bytecode; a checkout run with PYTHONDONTWRITEBYTECODE would
    # recompile our modules at every launch and measure the compiler, not the plugin.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *(str(ROOT / d) for d in ("driversdk", "drivers", "examples"))],
        check=True,
        capture_output=True,
    )
    # One warm-up of each, unmeasured: the page cache, not the plugin, pays for a first read.
    time_floor()
    for name in names:
        time_launch(PLUGINS[name], name)

    floor: list[float] = []
    ours: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        floor.append(time_floor())
        for name in names:
            ours[name].append(time_launch(PLUGINS[name], name))

    base = statistics.median(floor)
    print(f"plugin launch -> first answered RPC (PluginInfo), median of {args.rounds} interleaved rounds:")
    print(f"  floor  python -c 'import grpc'   {base * 1000:7.1f} ms")
    for name in names:
        mine = statistics.median(ours[name])
        verdict = "ok" if mine / base <= GOAL else f"above the {GOAL}x goal"
        print(f"  ours   {name:<24} {mine * 1000:7.1f} ms   ratio {mine / base:.2f}  ({verdict})")


if __name__ == "__main__":
    main()
