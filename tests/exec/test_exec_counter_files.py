"""CounterFiles: a task's cgroup counter files kept open between stats samples (real cgroups)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from driversdk.model import Resources
from driversdk.taskkit.cgroups import CounterFiles, TaskCgroup, _keyed, _pick, cgroup_mounts, unified_only
from tests.exec.conftest import Tracker

pytestmark = pytest.mark.root


def _open_fds() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return found


def test_counter_files_read_fresh_values_stay_open_and_close(track: Tracker) -> None:
    cgroup = TaskCgroup("counters-1", unified_only(), track.cgroup_parent)
    cgroup.create(Resources())
    files = CounterFiles()
    burner = None
    try:
        controller = "" if cgroup.v2 else "cpuacct"
        usage_file = "cpu.stat" if cgroup.v2 else "cpuacct.usage"
        usage_path = os.path.join(cgroup_mounts()[controller], cgroup.relative, usage_file)
        first = cgroup.sample(files)
        # Burn CPU inside the cgroup: the counter must move between two reads of one open file.
        procs = os.path.join(cgroup_mounts()[controller], cgroup.relative, "cgroup.procs")
        burner = subprocess.Popen(["/bin/sh", "-c", f"echo $$ > {procs}; while :; do :; done"])
        deadline = time.monotonic() + 60
        later = cgroup.sample(files)
        while later.cpu_total_ns <= first.cpu_total_ns and time.monotonic() < deadline:
            time.sleep(0.05)
            later = cgroup.sample(files)
        assert later.cpu_total_ns > first.cpu_total_ns
        assert usage_path in _open_fds(), "the counter file is not kept open between samples"
        files.close()
        assert usage_path not in _open_fds()
        # After close every read opens its file again: still correct, nothing held.
        assert cgroup.sample(files).cpu_total_ns >= later.cpu_total_ns
        assert usage_path not in _open_fds()
    finally:
        files.close()
        if burner is not None:
            burner.kill()
            burner.wait()
        cgroup.remove()
    assert not Path(cgroup_mounts()[controller], cgroup.relative).exists()


def test_picked_counters_are_the_lines_named_and_nothing_else() -> None:
    stat = b"file 7\nfile_mapped 5\nanon 3\nnegative -2\nlimit max\nlast 9"
    keys = (b"\nfile ", b"\nanon ", b"\nmissing ", b"\nnegative ", b"\nlimit ", b"\nlast ")
    assert _pick(stat, keys) == [7, 3, 0, -2, 0, 9]
    # The first line counts like any other; a name that only ends another's is not it.
    assert _pick(b"total_rss 4\nrss 1\n", (b"\nrss ", b"\ntotal_rss ")) == [1, 4]


def test_a_sample_reports_what_the_cgroup_files_say(track: Tracker) -> None:
    # The sample picks three lines out of memory.stat (v1) by name: the same figures as parsing
    # the whole file, with memory the task really holds.
    cgroup = TaskCgroup("counters-2", unified_only(), track.cgroup_parent)
    cgroup.create(Resources())
    files = CounterFiles()
    holder = None
    try:
        mem_dir = os.path.join(cgroup_mounts()["" if cgroup.v2 else "memory"], cgroup.relative)
        script = "import sys, time; held = bytearray(32 << 20); print(flush=True); time.sleep(120)"
        join = f"echo $$ > {mem_dir}/cgroup.procs; exec {sys.executable} -c '{script}'"
        holder = subprocess.Popen(["/bin/sh", "-c", join], stdout=subprocess.PIPE)
        assert holder.stdout is not None and holder.stdout.readline() == b"\n"  # the memory is held
        sample = cgroup.sample(files)
        stat = _keyed(f"{mem_dir}/memory.stat")
        rss, cache = ("anon", "file") if cgroup.v2 else ("total_rss", "total_cache")
        assert sample.memory_rss == stat[rss] >= 32 << 20
        assert sample.memory_cache == stat[cache]
        if not cgroup.v2:
            assert sample.memory_swap == stat.get("total_swap", 0)
            assert sample.memory_usage >= sample.memory_rss
            cpu_dir = os.path.join(cgroup_mounts()["cpu"], cgroup.relative)
            throttle = _keyed(f"{cpu_dir}/cpu.stat")
            assert (sample.throttled_periods, sample.throttled_ns) == (
                throttle["nr_throttled"],
                throttle["throttled_time"],
            )
    finally:
        files.close()
        if holder is not None:
            holder.kill()
            holder.wait()
        cgroup.remove()
