"""The README demo runs and says what the README promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import docker

from drivers.docker.container import LABEL_TASK_ID
from driversdk.mountinfo import read_mountinfo

ROOT = Path(__file__).resolve().parents[2]


def test_readme_demo(engine: docker.DockerClient) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert 'refused: task "web" volume "data": propagation_mode "bidirectional" needs a read-write mount' in out
    assert "which is private; run `mount --make-rshared" in out
    assert "task sees: mounted on the host after the task started" in out
    assert "exit code 0" in out
    left = [
        c.name
        for c in engine.containers.list(all=True, filters={"label": LABEL_TASK_ID})
        if any("driversdk-demo-" in b for b in c.attrs["HostConfig"].get("Binds") or [])
    ]
    assert not left, f"the demo left containers behind: {left}"
    assert not [e for e in read_mountinfo() if "driversdk-demo-" in e.mount_point], "the demo left mounts behind"
