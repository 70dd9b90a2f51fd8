"""Allocations of a count start side by side when nothing they share is ordered; a group with
CSI (plugins or volumes), a bridge network or a recovered allocation starts one at a time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from driversdk.agent.run import _batches
from driversdk.agent.state.runstate import AllocRecord
from driversdk.jobspec.job import Group, Job, Task, VolumeRequest
from tests.agent.runs import ROOT

Plan = list[tuple[Job, Group, int, AllocRecord | None]]


def _plan(*groups: Group) -> Plan:
    job = Job(file="job.hcl", name="j", groups=list(groups))
    return [(job, g, i, None) for g in groups for i in range(g.count)]


def _sizes(plan: Plan) -> list[int]:
    return [len(b) for b in _batches(plan)]


def test_a_plain_count_is_one_batch_per_group() -> None:
    a = Group("a", count=3, tasks=[Task("t", "raw_exec")])
    b = Group("b", count=2, tasks=[Task("t", "raw_exec")])
    assert _sizes(_plan(a, b)) == [3, 2]


def test_ordered_groups_start_one_allocation_at_a_time() -> None:
    bridge = Group("bridge", count=2, tasks=[Task("t", "exec")], network_mode="bridge")
    csi = Group("csi", count=2, tasks=[Task("t", "exec")], volumes={"v": VolumeRequest("v", "csi", "vol")})
    host = Group("host", count=2, tasks=[Task("t", "exec")], volumes={"v": VolumeRequest("v", "host", "shared")})
    assert _sizes(_plan(bridge, csi, host)) == [1, 1, 1, 1, 2]


def test_a_count_of_raw_exec_tasks_runs_every_allocation(tmp_path: Path) -> None:
    data = tmp_path / "data"
    job = tmp_path / "job.hcl"
    job.write_text(
        'job "many" {\n  type = "batch"\n  group "g" {\n    count = 5\n    task "t" {\n      driver = "raw_exec"\n'
        '      config {\n        command = "/bin/sh"\n        args = ["-c", "echo alloc ${NOMAD_ALLOC_INDEX}"]\n'
        "      }\n    }\n  }\n}\n"
    )
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{data}"\nplugin "raw_exec" {{\n  config {{\n    enabled = true\n  }}\n}}\n')
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count('task "t" finished with exit code 0') == 5
    outputs = sorted(p.read_text() for p in data.glob("allocs/*/alloc/logs/t.stdout.0"))
    assert outputs == [f"alloc {i}\n" for i in range(5)]
