"""CounterFiles: a task's cgroup counter files kept open between stats samples (real cgroups)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from drivers.exec.cgroups import CounterFiles, TaskCgroup, cgroup_mounts, unified_only
from driversdk.model import Resources
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
