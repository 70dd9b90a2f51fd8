"""Property: a generated job that `validate` accepts is run by `driversdk run` without a crash and
without leaving anything behind (processes, exec state, containers, mounts, fifos).

Each example is a real run (real plugins, runc, the docker engine), so the sample is small; the
generator varies what the runner acts on: names, counts, several groups and tasks, env values,
kill timeouts and signals, log settings, exit codes, and the driver."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import docker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drivers.docker.container import LABEL_TASK_ID
from driversdk.mountinfo import read_mountinfo
from tests.hostcheck import labelled_containers

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "driversdk-test/busybox:local"

name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=20).filter(
    lambda n: n not in (".", "..")
)
env_value = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\$%'), max_size=20)


@st.composite
def task_blocks(draw: st.DrawFn) -> str:
    driver = draw(st.sampled_from(["exec", "docker"]))
    code = draw(st.integers(min_value=0, max_value=3))
    script = f"echo out $NOMAD_TASK_NAME; echo err >&2; exit {code}"
    config = f'command = "/bin/sh"\n        args = ["-c", "{script}"]'
    if driver == "docker":
        config = f'image = "{IMAGE}"\n        ' + config
    env = draw(st.dictionaries(st.sampled_from(["A", "B_C", "TOKEN"]), env_value, max_size=2))
    env_block = "".join(f'        {k} = "{v}"\n' for k, v in env.items())
    kill_timeout = draw(st.sampled_from(["1s", "500ms", "2s"]))
    kill_signal = draw(st.sampled_from(["", "SIGTERM", "SIGINT", "SIGKILL"]))
    logs = draw(st.sampled_from(["", "logs {\n        max_files = 1\n        max_file_size = 1\n      }"]))
    return f"""    task "{draw(name)}" {{
      driver = "{driver}"
      kill_timeout = "{kill_timeout}"
      {f'kill_signal = "{kill_signal}"' if kill_signal else ""}
      env {{
{env_block}      }}
      config {{
        {config}
      }}
      {logs}
    }}
"""


@st.composite
def jobs(draw: st.DrawFn) -> str:
    groups = []
    for _ in range(draw(st.integers(min_value=1, max_value=2))):
        tasks = "".join(draw(st.lists(task_blocks(), min_size=1, max_size=2)))
        # Tasks exit with any code; each runs once (the default policy would retry a failure 15s apart).
        restart = '    restart {\n      attempts = 0\n      mode = "fail"\n    }\n'
        groups.append(f'  group "{draw(name)}" {{\n    count = {draw(st.integers(1, 2))}\n{restart}{tasks}  }}\n')
    return f'job "{draw(name)}" {{\n  type = "batch"\n{"".join(groups)}}}\n'


def _leftovers(work: Path, engine: docker.DockerClient) -> list[str]:
    left = [f"mount {e.mount_point}" for e in read_mountinfo() if e.mount_point.startswith(str(work))]
    for c in labelled_containers(engine, LABEL_TASK_ID):
        if any(str(work) in b for b in c["HostConfig"].get("Binds") or []):
            left.append(f"container {str(c['Name']).lstrip('/')}")
    tasks = work / "exec" / "tasks"
    if tasks.exists():
        left += [f"exec state {p.name}" for p in tasks.iterdir()]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(work) in cmdline and int(pid) != os.getpid():
            left.append(f"process {pid}: {cmdline}")
    left += [f"fifo {p}" for p in work.glob("data/allocs/*/alloc/logs/.*.fifo")]
    return left


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(job_text=jobs())
def test_what_validate_accepts_runs_without_a_crash_or_a_leftover(engine: docker.DockerClient, job_text: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="dsx-prop-", dir="/tmp"))
    try:
        job = work / "job.hcl"
        job.write_text(job_text)
        client = work / "client.hcl"
        client.write_text(
            f'data_dir = "{work / "data"}"\n'
            'plugin "docker" {\n  config {\n    gc {\n      image = false\n    }\n  }\n}\n'
            f'plugin "exec" {{\n  config {{\n    state_dir = "{work / "exec"}"\n  }}\n}}\n'
        )
        cli = [sys.executable, "-m", "driversdk.cli"]
        checked = subprocess.run([*cli, "validate", str(job), "--client", str(client)], capture_output=True, text=True)
        assert "Traceback" not in checked.stdout + checked.stderr, checked.stderr
        if checked.returncode != 0:
            return  # refused with sentences: nothing to run
        ran = subprocess.run(
            [*cli, "run", str(job), "--client", str(client)], capture_output=True, text=True, cwd=ROOT, timeout=240
        )
        assert ran.returncode in (0, 1), ran.stdout + ran.stderr
        assert "Traceback" not in ran.stdout + ran.stderr, ran.stdout + ran.stderr
        assert "finished with exit code" in ran.stdout, ran.stdout + ran.stderr
        assert _leftovers(work, engine) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)
