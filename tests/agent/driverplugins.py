"""The exec driver's plugin processes of `driversdk run` as tests see them: a client config and a
long-running exec job of a test's own, a run started in the background, the lines it prints until
its tasks are recovered, the plugin processes it launched, and whether one of them still runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.agent.runs import ROOT, cgroup_parent
from tests.hostcheck import processes


def sleeping_exec_job(tmp_path: Path, name: str, count: int) -> Path:
    """A job file ``name`` of ``count`` allocations, each an exec task "t" that prints "up" and sleeps 300 s."""
    job = tmp_path / f"{name}.hcl"
    job.write_text(
        f'job "{name}" {{\n  group "g" {{\n    count = {count}\n    task "t" {{\n      driver = "exec"\n'
        '      kill_timeout = "1s"\n      config {\n        command = "/bin/sh"\n'
        '        args = ["-c", "echo up; sleep 300"]\n      }\n    }\n  }\n}\n'
    )
    return job


def exec_client(tmp_path: Path) -> tuple[Path, Path]:
    """A client config (and its data dir) whose exec plugin keeps state and cgroups under this test's own names."""
    data = tmp_path / "data"
    client = tmp_path / "client.hcl"
    client.write_text(
        f'data_dir = "{data}"\n'
        f'plugin "exec" {{\n  config {{\n    state_dir = "{tmp_path / "exec-state"}"\n'
        f'    cgroup_parent = "{cgroup_parent(tmp_path)}"\n  }}\n}}\n'
    )
    return client, data


def start(args: list[str]) -> subprocess.Popen[str]:
    """``args`` started from the checkout in the background, its stdout and stderr piped as text."""
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def read_until_recovered(run: subprocess.Popen[str], tasks: int) -> str:
    """What ``run`` printed up to its ``tasks``-th 'task "t" recovered' line; fails if it ends first."""
    assert run.stdout is not None
    seen: list[str] = []
    while sum('==> task "t" recovered' in line for line in seen) < tasks:
        seen.append(run.stdout.readline())
        assert seen[-1], "the run ended early: " + "".join(seen) + run.communicate()[1]
    return "".join(seen)


def exec_plugins(run_pid: int) -> list[int]:
    """Exec plugin processes launched by the run (its children running `drivers.exec.main`); every one for pid 0."""
    found = []
    for line in processes("drivers.exec.main"):
        pid = int(line.split(":", 1)[0])
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        if ppid == run_pid or run_pid == 0:
            found.append(pid)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie no one reaped, its parent being the killed run, counts as gone)."""
    try:
        return "\tZ" not in Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].splitlines()[0]
    except (OSError, IndexError):
        return False
