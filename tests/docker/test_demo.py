"""The README demo runs and says what the README promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import docker

from drivers.docker.container import LABEL_TASK_ID
from driversdk.mountinfo import read_mountinfo
from tests.hostcheck import labelled_containers

ROOT = Path(__file__).resolve().parents[2]


def test_readme_demo(engine: docker.DockerClient) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # validate first finds the unregistered volume, then passes once it is registered
    assert 'CSI volume "demo-volume" is not registered in namespace "default"' in out
    assert 'registered CSI volume "demo-volume" (plugin "hostpath")' in out
    assert "job 'csi-demo': valid" in out
    assert '==> task "plugin": Plugin became healthy: plugin: hostpath' in out
    assert '==> volume "data": CSI volume "demo-volume" mounted at ' in out
    assert '==> task "app" finished with exit code 0' in out
    assert '==> volume "data": CSI volume "demo-volume" unmounted and released' in out
    mount_line = next(line for line in out.splitlines() if " /data " in line)
    assert "master:" in mount_line, "the task sees the volume host-to-task (rslave)"
    assert "wrote: " in out and '"claims": []' in out
    assert "left behind: 0 mount(s)" in out
    assert "no CSI plugins are registered on this client" in out
    left = [
        str(c["Name"]).lstrip("/")
        for c in labelled_containers(engine, LABEL_TASK_ID)
        if any("driversdk-demo-" in b for b in c["HostConfig"].get("Binds") or [])
    ]
    assert not left, f"the demo left containers behind: {left}"
    assert not [e for e in read_mountinfo() if "driversdk-demo-" in e.mount_point], "the demo left mounts behind"
