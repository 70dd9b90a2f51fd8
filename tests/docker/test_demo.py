"""The README demo runs and says what the README promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[2]


def test_readme_demo(engine: docker.DockerClient, no_leaks: None) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert 'refused: task "web" volume "data": propagation_mode "bidirectional" needs a read-write mount' in out
    assert "which is private; run `mount --make-rshared" in out
    assert "task sees: mounted on the host after the task started" in out
    assert "exit code 0" in out
