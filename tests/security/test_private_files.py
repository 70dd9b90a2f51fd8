"""A local unprivileged user (nobody) hunts for secrets in what `driversdk run` writes.

The data dir holds state.db (CSI secrets, plugin reattach configs, task handles), the exec
driver's state dir holds each task's OCI config (its environment); both live below a directory
every user may traverse, as /var/lib does. nobody must find none of the secrets, and a data
dir an older version left readable is tightened on the next start.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import sqlite3
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.runs import ROOT, cli

ENV_SECRET = "s3cr3t-env-value-4242"
CSI_SECRET = "s3cr3t-csi-value-1717"


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A work dir every local user can traverse (as /var/lib is), unlike pytest's tmp_path."""
    path = Path(tempfile.mkdtemp(prefix="dsx-priv-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), user="nobody", group="nogroup", extra_groups=[], capture_output=True, text=True, timeout=60
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def write_files(work: Path) -> tuple[Path, Path, Path]:
    data = work / "data"
    job = work / "job.hcl"
    job.write_text(
        f"""job "private" {{
  group "g" {{
    task "app" {{
      driver = "exec"
      kill_timeout = "1s"
      env {{
        API_TOKEN = "{ENV_SECRET}"
      }}
      config {{
        command = "/bin/sh"
        args    = ["-c", "echo up; sleep 300"]
      }}
    }}
  }}
}}
"""
    )
    client = work / "client.hcl"
    client.write_text(
        f'data_dir = "{data}"\nplugin "exec" {{\n  config {{\n    state_dir = "{work / "exec"}"\n  }}\n}}\n'
    )
    volume = work / "volume.hcl"
    volume.write_text(
        f"""id = "vol"
name = "vol"
type = "csi"
plugin_id = "hostpath"
capability {{
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}}
secrets {{
  password = "{CSI_SECRET}"
}}
"""
    )
    return job, client, data


def test_nobody_reads_no_secret_of_a_running_task_or_a_volume(open_dir: Path) -> None:
    job, client, data = write_files(open_dir)
    reg = subprocess.run(
        cli("volume", "register", str(open_dir / "volume.hcl"), "--client", str(client)),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert reg.returncode == 0, reg.stderr
    proc = subprocess.Popen(
        cli("run", str(job), "--client", str(client)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        seen = [""]
        while '==> task "app" started' not in seen[-1]:
            seen.append(proc.stdout.readline())
            assert seen[-1], proc.communicate()[1]
        # The attacker: every file below the work dir that nobody can open, searched for both secrets.
        # (The operator's own job and volume files are theirs to protect: they are made 0600 here.)
        for own in ("job.hcl", "volume.hcl"):
            (open_dir / own).chmod(0o600)
        hunt = as_nobody("grep", "-r", "-a", "-l", "-e", ENV_SECRET, "-e", CSI_SECRET, str(open_dir))
        assert hunt.stdout == "", f"nobody read a secret in: {hunt.stdout}"
        # ... and the same search as root finds them, so the hunt looked in the right places.
        found = subprocess.run(
            ["grep", "-r", "-a", "-l", "-e", ENV_SECRET, "-e", CSI_SECRET, str(open_dir)],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert any(p.endswith("state.db") or "state.db-" in p for p in found), found
        assert any(p.startswith(str(open_dir / "exec")) for p in found), found

        assert mode(data) == 0o700
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            if (data / name).exists():
                assert mode(data / name) == 0o600, name
        (alloc,) = (data / "allocs").iterdir()
        secrets_dir = alloc / "app" / "secrets"
        assert mode(secrets_dir) == 0o700
        # The task names no user, so exec runs it as nobody: its user owns secrets/ (the hunt above
        # still found nothing, as the data dir above it is closed to every other user).
        assert secrets_dir.stat().st_uid == pwd.getpwnam("nobody").pw_uid
        listing = as_nobody("ls", str(data))
        assert listing.returncode != 0 and "Permission denied" in listing.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)


def test_a_readable_data_dir_left_by_an_older_version_is_tightened(open_dir: Path) -> None:
    data = open_dir / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    db = sqlite3.connect(data / "state.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    (data / "state.db").chmod(0o644)
    assert as_nobody("ls", str(data)).returncode == 0  # the old, readable layout
    done = subprocess.run(cli("volume", "status", "--data-dir", str(data)), capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert mode(data) == 0o700
    assert mode(data / "state.db") == 0o600
    for name in ("state.db-wal", "state.db-shm"):
        if (data / name).exists():
            assert mode(data / name) == 0o600


def test_secrets_dir_belongs_to_the_task_user(open_dir: Path) -> None:
    job, client, data = write_files(open_dir)
    job.write_text(job.read_text().replace('driver = "exec"', 'driver = "exec"\n      user = "nobody"'))
    proc = subprocess.Popen(
        cli("run", str(job), "--client", str(client)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        secrets_dir = None
        while time.monotonic() < deadline:
            found = list((data / "allocs").glob("*/app/secrets")) if (data / "allocs").exists() else []
            if found:
                secrets_dir = found[0]
                break
            time.sleep(0.05)
        assert secrets_dir is not None, "no secrets dir was made"
        st = os.stat(secrets_dir)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (65534, 0o700)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
