"""What the group network tests of a run share: a job of one group with a network block and a
task, stopping its run and reading all it printed, and the check that no iptables rule of an
allocation is left."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.agent.csienv import Env


def no_forwarding_rules() -> None:
    for table in ("nat", "filter"):
        out = subprocess.run(["iptables", "-w", "-t", table, "-S"], capture_output=True, text=True).stdout
        assert "driversdk alloc" not in out and "DSDK-PORTMAP" not in out, out
        assert "driversdk egress" not in out, out


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(2)
    out, err = proc.communicate(timeout=120)
    return out + err


def web_job(env: Env, name: str, network: str, task: str) -> Path:
    job = env.work / f"{name}.hcl"
    job.write_text(f'job "{name}" {{\n  group "web" {{\n    network {{\n{network}\n    }}\n{task}\n  }}\n}}\n')
    return job
