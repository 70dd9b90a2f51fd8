#!/usr/bin/env python3
"""`driversdk run` of a ``count = 100`` exec job, end to end: how many driversdk processes the
run keeps alive at its peak and their total resident memory.

A driversdk process is a Python process of ours that the run started or adopted: the ``run``
process itself, the driver plugins it launched, the data dir's log collector and the exec state
dir's task supervisor (found by those dirs in their command lines). The tasks themselves (sleep)
are not counted: they are the job's, not the SDK's.

The job's tasks sleep; once every one of them is recorded as running the bench interrupts the
run (SIGINT, as Ctrl-C) and waits for it to tear everything down. Printed: the process count
and total RSS at the peak, the time until all tasks ran and the time to tear down, beside the
figures measured on the code before the driver manager shared one plugin per driver (written
down below, measured with this same script on the same machine).

Run as root (exec needs runc and cgroups): python3 bench/bench_scale.py [--count N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Measured with this script's process finder, count = 100, on the 2-core test machine at commit
# ad6c7c7 (one driver plugin per allocation), with all 100 tasks running: the run, 100 exec
# plugins and 100 log collectors. (That run's own stop condition never fired: the state.db WAL it
# polls was deleted under the run by the lock bug statedb.connect has since fixed, so the figure
# was sampled by hand with `ours()` before interrupting it.)
BEFORE = {"processes": 201, "rss_mib": 6942.3}


def write_files(work: Path, count: int) -> tuple[Path, Path]:
    job = work / "job.hcl"
    job.write_text(
        f'job "scale" {{\n  group "g" {{\n    count = {count}\n    task "t" {{\n      driver = "exec"\n'
        '      kill_timeout = "1s"\n      resources {\n        memory = 16\n      }\n'
        '      config {\n        command = "/bin/sleep"\n        args = ["600"]\n      }\n    }\n  }\n}\n'
    )
    client = work / "client.hcl"
    client.write_text(
        f'data_dir = "{work / "data"}"\nplugin "exec" {{\n  config {{\n    state_dir = "{work / "exec-state"}"\n'
        f'    cgroup_parent = "dsx-bench-scale-{os.getpid()}"\n  }}\n}}\n'
    )
    return job, client


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(name))
    return tree


def _python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def ours(run_pid: int, work: Path) -> set[int]:
    """The run, its Python descendants (plugins), and the collector and supervisor of its dirs."""
    tree = _children()
    found, todo = set(), [run_pid]
    while todo:
        pid = todo.pop()
        if _python(pid):
            found.add(pid)
        todo.extend(tree.get(pid, []))
    needles = (str(work / "data"), str(work / "exec-state"))
    for name in filter(str.isdigit, os.listdir("/proc")):
        if any(n in _cmdline(int(name)) for n in needles) and _python(int(name)):
            found.add(int(name))
    return found


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dsx-scale-", dir="/tmp"))
    job, client = write_files(work, args.count)
    env = dict(os.environ, PYTHONPATH=str(ROOT), DRIVERSDK_CACHE_DIR=str(work / "cache"))
    begin = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    peak_n, peak_rss, all_running = 0, 0, 0.0
    try:
        while proc.poll() is None:
            pids = ours(proc.pid, work)
            rss = sum(_rss_kib(p) for p in pids)
            peak_n, peak_rss = max(peak_n, len(pids)), max(peak_rss, rss)
            if not all_running and running_tasks(work / "data") >= args.count:
                all_running = time.monotonic() - begin
                time.sleep(1.0)  # one more sample with everything up
                pids = ours(proc.pid, work)
                peak_n = max(peak_n, len(pids))
                peak_rss = max(peak_rss, sum(_rss_kib(p) for p in pids))
                proc.send_signal(signal.SIGINT)
                stop_at = time.monotonic()
            time.sleep(0.5)
        proc.wait()
        teardown = time.monotonic() - stop_at if all_running else 0.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
        shutil.rmtree(work, ignore_errors=True)
    if not all_running:
        raise SystemExit(f"the run ended (exit {proc.returncode}) before all tasks ran:\n" + "".join(lines[-30:]))
    print(f"count = {args.count} exec job, `driversdk run` end to end (exit {proc.returncode})")
    print(f"  all tasks running after   {all_running:6.1f} s; teardown after Ctrl-C {teardown:6.1f} s")
    print(f"  driversdk processes at peak: {peak_n:4d}   total RSS: {peak_rss / 1024:8.1f} MiB   (now)")
    if BEFORE["processes"]:
        print(
            f"  driversdk processes at peak: {BEFORE['processes']:4d}   total RSS: {BEFORE['rss_mib']:8.1f} MiB"
            "   (before: one plugin per allocation)"
        )


if __name__ == "__main__":
    main()
