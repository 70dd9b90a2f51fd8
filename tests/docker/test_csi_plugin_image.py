"""hack/build-csi-plugin-image.sh run from a virtualenv (as a contributor with a venv install does)
makes an image whose interpreter imports the plugin's packages, and its hash label follows what the
image is built from: a change in the venv's packages rebuilds it, nothing changed builds nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "driversdk-test/csi-hostpath-venv-check:local"
# What the reference plugin imports besides the standard library (pyproject's core dependencies).
PLUGIN_DEPS = ["grpcio", "grpcio-health-checking", "grpcio-status", "googleapis-common-protos", "protobuf", "msgpack"]


def _installed_version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv holding its own copies of the plugin's dependencies (no system site packages), at the
    versions installed here, so pip takes them from its cache where it can."""
    path = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pins = [f"{d}=={_installed_version(d)}" for d in PLUGIN_DEPS]
    done = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot install the plugin's dependencies into a venv: {done.stderr.strip()[-300:]}")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _build(venv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": str(venv / "bin" / "python"), "CSI_PLUGIN_IMAGE": IMAGE}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        ["bash", "hack/build-csi-plugin-image.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_an_image_built_from_a_venv_imports_the_plugin_and_rebuilds_on_change(venv: Path, engine: object) -> None:
    client = docker.from_env(timeout=30)
    try:
        first = _build(venv)
        assert first.returncode == 0, first.stderr
        assert "built" in first.stderr
        probe = client.containers.run(
            IMAGE,
            ["/usr/bin/python3", "-c", "import grpc, driversdk.csi.hostpath.main; print(grpc.__file__)"],
            remove=True,
        )
        assert b"/opt/site/grpc/" in probe, probe

        again = _build(venv)
        assert again.returncode == 0, again.stderr
        assert "built" not in again.stderr, "nothing changed, yet the image was built again"

        # A file of a package the image copies changes: the label no longer matches, so it rebuilds.
        grpc_dir = next((venv / "lib").glob("python3*/site-packages/grpc"))
        (grpc_dir / "_driversdk_change_marker.py").write_text("CHANGED = True\n")
        changed = _build(venv)
        assert changed.returncode == 0, changed.stderr
        assert "built" in changed.stderr, "a changed site package did not rebuild the image"
    finally:
        try:
            client.images.remove(IMAGE, force=True)
        except docker.errors.ImageNotFound:
            pass
