"""A data dir whose file system fills up under `driversdk run`: the state write that fails ends
the run at once with one sentence, tears everything down and leaves state.db sound.

Real CLI (a subprocess), a real tmpfs as the data dir filled with dd until ENOSPC, a real docker
engine and real exec tasks; each test ends in a leak check (containers, processes, mounts)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from drivers.docker.container import LABEL_TASK_ID
from driversdk.mountinfo import read_mountinfo
from tests.hostcheck import labelled_containers, processes

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "driversdk-test/busybox:local"
# Every process the run starts inherits this variable: how a test finds the plugins a run left
# behind, whatever their command line says.
MARKER = "DSX_FULL_DISK_TEST"
FS_SIZE = "48m"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_fs() -> Iterator[Path]:
    """A small tmpfs of its own (unmounted, even when busy, at teardown)."""
    where = Path(tempfile.mkdtemp(prefix="dsx-full-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE},mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        os.rmdir(where)


def fill(fs: Path) -> Path:
    """Write a file until the file system has no byte left (dd ends with ENOSPC)."""
    filler = fs / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, check=False)
    left = os.statvfs(fs)
    assert left.f_bavail == 0, f"{left.f_bavail} blocks still free"
    return filler


def write_job(work: Path, data: Path, driver: str, script: str) -> tuple[Path, Path]:
    if driver == "docker":
        config = f'image = "{IMAGE}"\n        command = "/bin/sh"\n        args = ["-c", "{script}"]'
    else:
        config = f'command = "/bin/sh"\n        args = ["-c", "{script}"]'
    job = work / "job.hcl"
    job.write_text(
        f"""job "fulldisk" {{
  type = "batch"
  group "g" {{
    # The task runs once: the run ends with its first exit (or with the disk's sentence).
    restart {{
      attempts = 0
      mode     = "fail"
    }}
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
    client = work / "client.hcl"
    client.write_text(
        f'data_dir = "{data}"\n'
        'plugin "docker" {\n  config {\n    gc {\n      image = false\n    }\n  }\n}\n'
        f'plugin "exec" {{\n  config {{\n    state_dir = "{work / "exec-state"}"\n  }}\n}}\n'
    )
    return job, client


def start_run(job: Path, client: Path, marker: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, MARKER: marker},
    )


def marked(marker: str) -> list[str]:
    """Processes (a run, its plugins, their children) that inherited the run's marker."""
    found = []
    needle = f"{MARKER}={marker}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(f"{pid}: {cmdline}")
    return found


def leaks(engine: docker.DockerClient, data: Path, marker: str) -> list[str]:
    left = [
        f"container {c['Name']}"
        for c in labelled_containers(engine, LABEL_TASK_ID)
        if any(str(data) in b for b in c["HostConfig"].get("Binds") or [])
    ]
    left += [f"process {p}" for p in marked(marker)]
    left += [f"process {p}" for p in processes(str(data))]
    left += [f"mount {e.mount_point}" for e in read_mountinfo() if e.mount_point.startswith(str(data) + "/")]
    return left


def wait_for(what: str, check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def running(data: Path) -> bool:
    db = data / "state.db"
    if not db.exists():
        return False
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return bool(conn.execute("SELECT 1 FROM run_tasks WHERE state='running'").fetchall())
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def integrity(data: Path) -> str:
    conn = sqlite3.connect(str(data / "state.db"), timeout=10)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the run did not end within {timeout:.0f}s:\n{out}\n{err}") from None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_a_task_exit_that_cannot_be_recorded_ends_the_run_with_one_sentence_and_leaves_nothing(
    engine: docker.DockerClient, small_fs: Path, tmp_path: Path, driver: str
) -> None:
    data = small_fs / "data"
    # The task runs until the test says go: by then the file system is full.
    script = "echo up; while [ ! -e /alloc/data/go ]; do sleep 0.1; done; exit 3"
    job, client = write_job(tmp_path, data, driver, script)
    marker = uuid.uuid4().hex
    proc = start_run(job, client, marker)
    try:
        wait_for("the task to run", lambda: running(data))
        [alloc] = list((data / "allocs").iterdir())
        filler = fill(small_fs)
        (alloc / "alloc" / "data" / "go").touch()  # an empty file: an inode, no block
        out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    sentence = lines[0]
    assert 'task "work" of job "fulldisk"' in sentence, sentence
    assert str(data / "state.db") in sentence, sentence
    assert "database or disk is full" in sentence, sentence
    assert f"free space on {small_fs}" in sentence, sentence
    assert leaks(engine, data, marker) == []
    filler.unlink()
    assert integrity(data) == "ok"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_a_run_started_on_a_full_data_dir_fails_with_one_sentence_and_leaves_no_plugin(
    engine: docker.DockerClient, small_fs: Path, tmp_path: Path, driver: str
) -> None:
    data = small_fs / "data"
    job, client = write_job(tmp_path, data, driver, "exit 0")
    first = start_run(job, client, uuid.uuid4().hex)  # a run before: state.db exists with its tables
    out, err = finish(first)
    assert first.returncode == 0, out + err
    filler = fill(small_fs)
    marker = uuid.uuid4().hex
    proc = start_run(job, client, marker)
    out, err = finish(proc)
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert "database or disk is full" in lines[0] and f"free space on {small_fs}" in lines[0], lines[0]
    assert leaks(engine, data, marker) == []
    filler.unlink()
    assert integrity(data) == "ok"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_a_first_run_on_a_full_data_dir_fails_with_one_sentence_and_leaves_no_plugin(
    engine: docker.DockerClient, small_fs: Path, tmp_path: Path, driver: str
) -> None:
    data = small_fs / "data"
    job, client = write_job(tmp_path, data, driver, "exit 0")
    filler = fill(small_fs)
    marker = uuid.uuid4().hex
    proc = start_run(job, client, marker)
    out, err = finish(proc)
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert "database or disk is full" in lines[0] and f"free space on {small_fs}" in lines[0], lines[0]
    assert leaks(engine, data, marker) == []
    filler.unlink()
