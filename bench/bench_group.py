#!/usr/bin/env python3
"""One group of N docker tasks (default 100) through `driversdk run`, beside N concurrent
`docker run -d` of the same container on the same machine, interleaved round by round.

Ours is timed from spawning `driversdk run` until state.db records every task running (the
tasks of a group without lifecycle hooks start concurrently); then the bench interrupts the run
(SIGINT, as Ctrl-C) and waits for its teardown. The floor is the docker CLI: N `docker run -d`
processes spawned at once, timed until the last one returned (each returns once its container
started); those containers are then removed (not timed).

Run (needs hack/docker-up.sh and hack/build-test-images.sh): python3 bench/bench_group.py [--tasks N] [--runs R]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "driversdk-test/busybox:local"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(ROOT)}


def write_files(work: Path, tasks: int) -> tuple[Path, Path]:
    body = "".join(
        f'    task "t{i}" {{\n      driver = "docker"\n      kill_timeout = "1s"\n'
        f'      config {{\n        image = "{IMAGE}"\n        command = "/bin/sleep"\n        args = ["600"]\n'
        "      }\n    }\n"
        for i in range(tasks)
    )
    job = work / "job.hcl"
    job.write_text(f'job "group" {{\n  group "g" {{\n{body}  }}\n}}\n')
    client = work / "client.hcl"
    client.write_text(f'data_dir = "{work / "data"}"\nplugin "docker" {{\n  config {{\n    gc {{\n      image = false\n'
                      "    }\n  }\n}\n")  # fmt: skip
    return job, client


def running_tasks(data: Path) -> int:
    db = data / "state.db"
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM run_tasks WHERE state='running'").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.OperationalError:
        return 0


def ours(tasks: int) -> tuple[float, float]:
    """Seconds until every task ran, and the teardown after SIGINT."""
    work = Path(tempfile.mkdtemp(prefix="dsx-group-", dir="/tmp"))
    job, client = write_files(work, tasks)
    log = (work / "run.log").open("w")
    begin = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        cwd=ROOT, env=ENV | {"DRIVERSDK_CACHE_DIR": str(work / "cache")}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        while running_tasks(work / "data") < tasks:
            if proc.poll() is not None:
                tail = "".join((work / "run.log").read_text().splitlines(keepends=True)[-15:])
                raise SystemExit(f"driversdk run ended (exit {proc.returncode}) before all {tasks} tasks ran:\n{tail}")
            time.sleep(0.05)
        up = time.monotonic() - begin
        proc.send_signal(signal.SIGINT)
        stop_at = time.monotonic()
        proc.wait(600)
        return up, time.monotonic() - stop_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def floor(tasks: int) -> float:
    """Seconds for N concurrent `docker run -d` to return."""
    label = f"dsx-bench-group={os.getpid()}"
    begin = time.monotonic()
    procs = [
        subprocess.Popen(
            ["docker", "run", "-d", "--label", label, IMAGE, "/bin/sleep", "600"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(tasks)
    ]
    failed = [p.stderr.read().decode() for p in procs if p.wait() != 0]  # type: ignore[union-attr]
    elapsed = time.monotonic() - begin
    ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True)
    if ids.stdout.split():
        subprocess.run(["docker", "rm", "-f", *ids.stdout.split()], capture_output=True)
    if failed:
        raise SystemExit(f"{len(failed)} docker run -d failed: {failed[0]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    raw, mine, teardown = [], [], []
    for _ in range(args.runs):
        raw.append(floor(args.tasks))
        up, down = ours(args.tasks)
        mine.append(up)
        teardown.append(down)
    print(f"one group of {args.tasks} docker tasks, {args.runs} interleaved rounds (median)")
    print(f"  {args.tasks} concurrent docker run -d     {statistics.median(raw):8.1f} s")
    print(f"  driversdk run, all running        {statistics.median(mine):8.1f} s"
          f"   (teardown after Ctrl-C {statistics.median(teardown):.1f} s)")  # fmt: skip
    print(f"  ratio ours / docker run -d        {statistics.median(mine) / statistics.median(raw):8.2f}")
    print("  per-round ratios                  " + " ".join(f"{o / r:.2f}" for o, r in zip(mine, raw, strict=True)))


if __name__ == "__main__":
    main()
