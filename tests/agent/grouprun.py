"""A job of one group of sh tasks run by `driversdk run` to its end: task blocks for docker or exec,
the job and a client config of the test's own (its data dir, exec state dir and cgroup parent under
tmp_path, so runs.leaks sees only its tasks), and the allocation dir the run made."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.agent.runs import IMAGE, ROOT, cgroup_parent, cli

CLIENT = (
    'data_dir = "{data}"\nplugin "docker" {{\n  config {{\n    gc {{\n      image = false\n    }}\n  }}\n}}\n'
    'plugin "exec" {{\n  config {{\n    state_dir = "{state}"\n    cgroup_parent = "{cgroup}"\n  }}\n}}\n'
)


def task(name: str, script: str, extra: str = "", driver: str = "docker") -> str:
    """A task block: ``script`` run by /bin/sh (busybox under docker), ``extra`` inside the task."""
    script = script.replace("\\", "\\\\").replace('"', '\\"')
    image = f'image   = "{IMAGE}"' if driver == "docker" else ""
    return f"""
    task "{name}" {{
      driver       = "{driver}"
      kill_timeout = "5s"
      config {{
        {image}
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}
      {extra}
    }}"""


def write(tmp_path: Path, body: str, job_type: str = "batch", group_extra: str = "") -> tuple[Path, Path, Path]:
    """A job "life" of one group "g" holding ``body`` (task blocks), and a client config whose data dir,
    exec state dir and cgroup parent are this test's own; returns (job, client, data dir)."""
    data = tmp_path / "data"
    job = tmp_path / "job.hcl"
    job.write_text(f'job "life" {{\n  type = "{job_type}"\n  group "g" {{\n{group_extra}\n{body}\n  }}\n}}\n')
    client = tmp_path / "client.hcl"
    client.write_text(CLIENT.format(data=data, state=tmp_path / "exec-state", cgroup=cgroup_parent(tmp_path)))
    return job, client, data


def run(job: Path, client: Path) -> subprocess.CompletedProcess[str]:
    """`driversdk run` of the job to its end."""
    return subprocess.run(
        cli("run", str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def alloc_dir(data: Path) -> Path:
    """The one allocation dir under the data dir."""
    (alloc,) = (data / "allocs").iterdir()
    return alloc
