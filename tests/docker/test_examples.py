"""The examples run from an install outside the checkout: a venv with driversdk[all] installed
from a copy of this tree, whose `driversdk` runs the web job, whose port answers HTTP while it
runs, and which Ctrl-C stops leaving nothing."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from drivers.docker.container import LABEL_TASK_ID
from driversdk.agent.nodeattrs import host_ip
from driversdk.mountinfo import read_mountinfo
from tests.hostcheck import labelled_containers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# The checkout without its VCS data, caches and tests.
COPY_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", ".*_cache", "tests")


@pytest.fixture(scope="session")
def venv_bin() -> Iterator[Path]:
    """A venv outside the checkout with driversdk[all] installed from a copy of this tree (pip's
    cache off); removed after the session."""
    # Not under /tmp: exec tasks get a /tmp of their own, which would hide it from their chroot.
    where = Path(tempfile.mkdtemp(prefix="dsv-", dir="/var/tmp"))
    try:
        shutil.copytree(ROOT, where / "src", ignore=COPY_IGNORE)
        subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True)
        pip = [str(where / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-cache-dir"]
        subprocess.run([*pip, "--disable-pip-version-check", f"{where / 'src'}[all]"], check=True, timeout=600)
        yield where / "venv" / "bin"
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _client(work: Path, venv: Path) -> Path:
    """examples/jobs/client.hcl with this test's paths for the data dir and the host volumes, and
    the venv's directory in the exec plugin's chroot_env (as its comment says to add)."""
    text = (EXAMPLES / "jobs" / "client.hcl").read_text()
    for old, new in (
        ('"/var/lib/driversdk"', f'"{work / "data"}"'),
        ('"/srv/driversdk-shared"', f'"{work / "shared"}"'),
        ('"/srv/driversdk-csi"', f'"{work / "backing"}"'),
        ('"/usr"]', f'"/usr", "{venv.parents[1]}"]'),
        ('denied_host_gids = ""', f'denied_host_gids = ""\n    state_dir = "{work / "exec-state"}"'),
    ):
        assert old in text, old
        text = text.replace(old, new)
    path = work / "client.hcl"
    path.write_text(text)
    return path


def _no_leftovers(engine: docker.DockerClient, work: Path, own: str = "") -> None:
    mounts = [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(work))]
    assert not [m for m in mounts if m != own], "mounts left behind"
    left = [
        c["Name"]
        for c in labelled_containers(engine, LABEL_TASK_ID)
        if any(str(work) in b for b in c["HostConfig"].get("Binds") or [])
    ]
    assert not left, f"containers left behind: {left}"
    assert not subprocess.run(["pgrep", "-f", str(work)], capture_output=True).stdout, "processes left behind"


def test_web_example_serves_http_on_its_dynamic_port_until_ctrl_c(engine: docker.DockerClient, venv_bin: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="dsx-", dir="/tmp"))
    shared = work / "shared"
    shared.mkdir()
    (shared / "index.html").write_text("hello from the shared volume\n")
    # host-to-task propagation needs the source on a shared mount (README "Validate a job").
    subprocess.run(["mount", "--bind", str(shared), str(shared)], check=True)
    subprocess.run(["mount", "--make-rshared", str(shared)], check=True)
    run = subprocess.Popen(
        [str(venv_bin / "driversdk"), "run", str(EXAMPLES / "jobs" / "web.hcl"), "--client",
         str(_client(work, venv_bin))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/",
    )  # fmt: skip
    try:
        assert run.stdout is not None
        port = 0
        lines = []
        for line in run.stdout:
            lines.append(line)
            found = re.search(r"ports: http (\d+)->8080", line)
            if found:
                port = int(found.group(1))
            if 'task "web" started' in line:
                break
        assert port, "".join(lines)
        url = f"http://{host_ip()}:{port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    assert answer.read() == b"hello from the shared volume\n"
                    break
            except OSError:
                assert time.monotonic() < deadline, f"{url} never answered"
                time.sleep(0.2)
        run.send_signal(signal.SIGINT)
        rest, _ = run.communicate(timeout=120)
        assert run.returncode == 1, rest  # interrupted (README: Ctrl-C stops the tasks, exit 1)
        assert 'task "web" event: Container exited with code 0' in rest, rest
        _no_leftovers(engine, work, own=str(shared))
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        subprocess.run(["umount", "-l", str(shared)], check=False)
        shutil.rmtree(work, ignore_errors=True)
