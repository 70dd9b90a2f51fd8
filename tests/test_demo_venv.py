"""The CSI demo runs from a venv install outside the checkout, and leaves nothing behind.

driversdk is installed from a copy of this tree into a venv made with ``--system-site-packages``
(``--no-deps --no-build-isolation``: its dependencies are the system's, nothing is downloaded);
the examples are copied out of the checkout too, and the demo runs with the venv's interpreter
from ``/``, so nothing of the checkout can be imported. The demo job finds the reference CSI
plugin as the install provides it (the venv's ``driversdk-csi-hostpath``, with the venv in the
exec plugin's chroot_env). Then what the demo may have left is compared with before: processes,
mounts, containers, images, and dirs outside its data dir and the venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from drivers.docker.container import LABEL_TASK_ID
from driversdk.mountinfo import read_mountinfo
from tests.hostcheck import labelled_containers, processes, runc_containers

pytestmark = [pytest.mark.docker, pytest.mark.root]

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "driversdk-test/busybox:local"
# The checkout without its VCS data, caches, tests and builds.
COPY_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", "tests")
# Where the bundled drivers and the runner kept (or keep) state outside a data dir; ports, docker-pins
# and bridge under /run/driversdk are host-wide records shared by every data dir (README).
HOST_PLACES = [Path("/var/lib/driversdk-exec"), Path("/var/lib/driversdk-raw-exec"),
               Path("/var/lib/driversdk-csi-hostpath"), Path("/var/lib/driversdk")]  # fmt: skip
HOST_WIDE = {"ports", "docker-pins", "bridge"}


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    try:
        client = docker.from_env()
        client.ping()
    except Exception as err:  # no engine: the test cannot run here
        pytest.skip(f"no Docker engine: {err}")
    return client


@pytest.fixture(scope="module")
def venv() -> Iterator[Path]:
    """A venv (with the system's site-packages) holding driversdk installed from a copy of this tree."""
    where = Path(tempfile.mkdtemp(prefix="dsdv-"))
    try:
        shutil.copytree(ROOT, where / "src", ignore=COPY_IGNORE)
        # Without a pip of its own: the system's pip and setuptools (seen through the system
        # site-packages) install into the venv, as nothing can be downloaded here.
        venv = [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where / "venv")]
        subprocess.run(venv, check=True)
        pip = [str(where / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-cache-dir"]
        subprocess.run(
            [*pip, "--disable-pip-version-check", "--no-deps", "--no-build-isolation", str(where / "src")],
            check=True, timeout=600, cwd="/",
        )  # fmt: skip
        shutil.rmtree(where / "src")  # the install must not need its source
        yield where / "venv"
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _tree(path: Path) -> set[str]:
    return {str(p) for p in path.rglob("*")} | {str(path)} if path.is_dir() else set()


def local_image_tags(engine: docker.DockerClient) -> set[str]:
    """Tags of images with no registry host: what a build or import makes here. (Tests of other
    files running meanwhile push to and pull from a local registry, whose tags name its host.)"""
    tags = {t for image in engine.images.list(all=True) for t in image.tags}
    return {t for t in tags if not _registry_host(t)}


def _registry_host(tag: str) -> bool:
    first, slash, _ = tag.partition("/")
    return bool(slash) and (first == "localhost" or "." in first or ":" in first)


def host_state() -> dict[str, set[str]]:
    """What of the demo's kind is on the host: dirs outside any data dir, demo temp dirs, runc
    state, mounts, containers of a demo, images, processes of a demo."""
    dirs: set[str] = set()
    for place in HOST_PLACES:
        dirs |= _tree(place)
    run = Path("/run/driversdk")
    if run.is_dir():
        for entry in run.iterdir():
            if entry.name not in HOST_WIDE:
                dirs |= _tree(entry)
    engine = docker.from_env()
    return {
        "dirs outside a data dir": dirs,
        "demo temp dirs": {str(p) for p in Path("/tmp").glob("driversdk-demo-*")},
        "runc state": set(runc_containers("/tmp/driversdk-demo-")),
        "mounts": {e.mount_point for e in read_mountinfo() if "driversdk-demo-" in e.mount_point},
        "containers": {
            str(c["Name"])
            for c in labelled_containers(engine, LABEL_TASK_ID)
            if any("driversdk-demo-" in b for b in c["HostConfig"].get("Binds") or [])
        },
        "images": local_image_tags(engine),
        "processes": set(processes("driversdk-demo-")),
    }


def test_the_csi_demo_runs_from_a_venv_install_and_leaves_nothing(engine: docker.DockerClient, venv: Path) -> None:
    engine.images.get(IMAGE)  # the one image the demo uses (hack/build-test-images.sh busybox)
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import driversdk; print(driversdk.__file__)"],
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout.strip()  # fmt: skip
    assert installed.startswith(str(venv) + "/"), installed
    work = Path(tempfile.mkdtemp(prefix="dsdw-"))
    try:
        shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__", "tests"))
        (work / "tmp").mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["TMPDIR"] = str(work / "tmp")  # whatever the run and its plugins put in the temp dir lands here
        before = host_state()
        done = subprocess.run(
            [str(venv / "bin" / "python"), str(work / "examples" / "demo.py")],
            capture_output=True, text=True, timeout=300, cwd="/", env=env,
        )  # fmt: skip
        after = host_state()
        out = done.stdout
        assert done.returncode == 0, out + done.stderr
        # The job ran the venv's plugin executable, found through the -var the demo passes.
        assert f"-var csi_plugin_command={venv}/bin/driversdk-csi-hostpath" in out
        assert '==> task "plugin": Plugin became healthy: plugin: hostpath' in out
        assert '==> task "app" finished with exit code 0' in out
        assert "wrote: " in out and "left behind: 0 mount(s)" in out
        assert "ModuleNotFoundError" not in out + done.stderr
        left = {what: sorted(after[what] - before[what]) for what in before}
        assert {what: found for what, found in left.items() if found} == {}, "the demo left these behind"
        assert sorted(os.listdir(work / "tmp")) == [], "the run left files in its temp dir"
        assert processes(str(venv)) == [], "processes of the venv's install still run"
    finally:
        shutil.rmtree(work, ignore_errors=True)
