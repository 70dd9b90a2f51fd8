"""Running `driversdk run` from a test and checking what it left: the CLI's argv, a batch job and
client config of a test's own (its data dir, exec state dir and cgroup parent under tmp_path; a
raw_exec client config for tests/raw_exec's tracker), templates rendered by a raw_exec run, the
run's state.db rows, and every container, runc state, cgroup, mount, process and fifo still there."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import docker

from drivers.docker.container import LABEL_TASK_ID
from driversdk.mountinfo import read_mountinfo
from tests.hostcheck import labelled_containers, processes

if TYPE_CHECKING:
    from tests.raw_exec.conftest import Tracker

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "driversdk-test/busybox:local"


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "driversdk.cli", *args]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI run to its end from the checkout, its output captured."""
    return subprocess.run(cli(*args), capture_output=True, text=True, cwd=ROOT, timeout=180)


def ours(engine: docker.DockerClient, data_dir: Path) -> list[str]:
    """Containers whose binds come from this test's data dir."""
    return [
        str(c["Name"]).lstrip("/")
        for c in labelled_containers(engine, LABEL_TASK_ID)
        if any(str(data_dir) in b for b in c["HostConfig"].get("Binds") or [])
    ]


def cgroup_parent(tmp_path: Path) -> str:
    """A cgroup parent of this test's own, so its leak check sees no other test's tasks."""
    return f"dsx-faults-{abs(hash(str(tmp_path))) % 10**8}"


def leaks(engine: docker.DockerClient | None, tmp_path: Path) -> list[str]:
    """Everything of this test still on the host: containers, runc state, cgroups, mounts,
    processes, fifos."""
    data = tmp_path / "data"
    left = [f"container {n}" for n in ours(engine, data)] if engine is not None else []
    tasks = tmp_path / "exec-state" / "tasks"
    if tasks.exists():
        left += [f"exec state {p.name}" for p in tasks.iterdir()]
    parent = cgroup_parent(tmp_path)
    for root in Path("/sys/fs/cgroup").glob("*"):
        for where in (root / parent, root / "unified" / parent):
            if where.is_dir():
                left += [f"cgroup {c}" for c in where.iterdir() if c.is_dir()]
    left += [f"mount {m}" for m in mount_points() if m.startswith(str(tmp_path))]
    left += [f"process {p}" for p in processes(str(tmp_path))]
    left += [f"fifo {f}" for f in data.glob("allocs/*/alloc/logs/.*.fifo")]
    return left


def mount_points() -> list[str]:
    return [e.mount_point for e in read_mountinfo()]


# What a job whose task is meant to fail says, so the run ends at its first failure.
NO_RESTARTS = 'restart {\n      attempts = 0\n      mode = "fail"\n    }'


def write_job(tmp_path: Path, script: str, driver: str = "docker", restart: str = "") -> tuple[Path, Path, Path]:
    data = tmp_path / "data"
    if driver == "docker":
        config = f'image = "{IMAGE}"\n        command = "/bin/sh"\n        args = ["-c", "{script}"]'
    else:
        config = f'command = "/bin/sh"\n        args = ["-c", "{script}"]'
    job = tmp_path / "job.hcl"
    job.write_text(
        f"""job "faulty" {{
  type = "batch"
  group "g" {{
    {restart}
    task "work" {{
      driver = "{driver}"
      kill_timeout = "1s"
      config {{
        {config}
      }}
    }}
  }}
}}
"""
    )
    client = tmp_path / "client.hcl"
    client.write_text(
        f'data_dir = "{data}"\n'
        'plugin "docker" {\n  config {\n    gc {\n      image = false\n    }\n  }\n}\n'
        f'plugin "exec" {{\n  config {{\n    state_dir = "{tmp_path / "exec-state"}"\n'
        f'    cgroup_parent = "{cgroup_parent(tmp_path)}"\n  }}\n}}\n'
    )
    return job, client, data


def db_rows(data: Path, query: str) -> list[tuple[object, ...]]:
    db = data / "state.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(query).fetchall()
    except sqlite3.OperationalError:
        return []  # the run has not created its tables yet
    finally:
        conn.close()


def wait_for(what: str, check: object, timeout: float = 60.0, every: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check() if callable(check) else None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def plugin_pid(data: Path, driver: str) -> int:
    rows = db_rows(data, f"SELECT reattach FROM run_plugins WHERE driver='{driver}'")
    return int(json.loads(str(rows[0][0]))["pid"]) if rows else 0


def start_run(job: Path, client: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cli("run", str(job), "--client", str(client)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def raw_exec_job(
    path: Path, name: str, script: str, *, job_type: str = "", task: str = "work", group: str = ""
) -> Path:
    """A job file ``name`` at ``path`` (of ``job_type``, else Nomad's default) with one group "g" whose
    raw_exec task ``task`` runs ``/bin/sh -c script`` (kill_timeout 1s); ``group`` stands at the group's top."""
    kind = f'\n  type = "{job_type}"' if job_type else ""
    path.write_text(
        f"""job "{name}" {{{kind}
  group "g" {{
    {group}
    task "{task}" {{
      driver       = "raw_exec"
      kill_timeout = "1s"
      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}
    }}
  }}
}}
"""
    )
    return path


def write_raw_exec_client(base: Path, state_dir: Path, cgroup: str, *, enabled: bool = True, extra: str = "") -> Path:
    """``base``/client.hcl: data dir ``base``/data, raw_exec ``enabled`` with ``state_dir`` and cgroup
    parent ``cgroup``, ``extra`` at its top."""
    client = base / "client.hcl"
    client.write_text(
        f'data_dir = "{base / "data"}"\n{extra}'
        f'plugin "raw_exec" {{\n  config {{\n    enabled = {str(enabled).lower()}\n    state_dir = "{state_dir}"\n'
        f'    cgroup_parent = "{cgroup}"\n  }}\n}}\n'
    )
    return client


def raw_exec_client(track: Tracker, extra: str = "", *, enabled: bool = True) -> Path:
    """A client config enabling raw_exec (or not) with the tracked state dir and cgroup parent of
    ``track`` (tests/raw_exec/conftest.py), its data dir under the tracked base, ``extra`` at its top."""
    return write_raw_exec_client(track.base, track.state_dir, track.cgroup_parent, enabled=enabled, extra=extra)


def render_in_run(tmp_path: Path, templates: dict[str, str]) -> dict[str, str]:
    """Each template rendered into local/<name> by `driversdk run` of a raw_exec task."""
    blocks = "".join(
        f'      template {{\n        data = {json.dumps(text)}\n        destination = "local/{name}"\n      }}\n'
        for name, text in templates.items()
    )
    job = tmp_path / "job.hcl"
    job.write_text(
        'job "tpl" {\n  type = "batch"\n  group "g" {\n    task "t" {\n      driver = "raw_exec"\n'
        '      config {\n        command = "/bin/true"\n      }\n' + blocks + "    }\n  }\n}\n"
    )
    client = tmp_path / "client.hcl"
    client.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        f'plugin "raw_exec" {{\n  config {{\n    enabled = true\n    state_dir = "{tmp_path / "raw"}"\n  }}\n}}\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        capture_output=True, text=True, cwd=ROOT, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (alloc,) = (tmp_path / "data" / "allocs").iterdir()
    return {name: (alloc / "t" / "local" / name).read_text() for name in templates}
