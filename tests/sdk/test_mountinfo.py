"""mountinfo.is_mount_point against real bind mounts: the one is-mounted check the SDK, the CSI
stack and the drivers share."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.mountinfo import is_mount_point, parse_line, read_mountinfo

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[list[str]]:
    """Mount points made by a test, unmounted (innermost first) whatever happens."""
    made: list[str] = []
    yield made
    for point in reversed(made):
        subprocess.run(["umount", "-l", point], capture_output=True)
    left = [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(tmp_path))]
    assert left == [], f"mounts left behind: {left}"


def _bind_self(path: Path, made: list[str]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True, capture_output=True)
    made.append(str(path))


def test_root_is_a_mount_point_and_a_fresh_dir_is_not(tmp_path: Path) -> None:
    assert is_mount_point("/")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert not is_mount_point(str(plain))
    assert not is_mount_point(str(tmp_path / "missing"))


def test_given_entries_are_used_instead_of_reading_proc() -> None:
    # The kernel writes a space as \040 and a backslash as \134; the parsed entry holds the
    # real characters, which is what a caller's path holds too.
    entry = parse_line(r"36 35 98:0 / /mnt/a\040b\134c rw - ext3 /dev/root rw")
    assert is_mount_point("/mnt/a b\\c", [entry])
    assert not is_mount_point("/mnt/a\\040b\\134c", [entry])
    assert not is_mount_point("/", [entry])


@needs_root
def test_bind_mount_is_seen_and_its_subdir_and_parent_are_not(tmp_path: Path, mounted: list[str]) -> None:
    point = tmp_path / "point"
    _bind_self(point, mounted)
    (point / "sub").mkdir()
    assert is_mount_point(str(point))
    assert is_mount_point(str(point) + "/")
    assert is_mount_point(str(point / "sub" / ".."))
    assert not is_mount_point(str(point / "sub"))
    assert not is_mount_point(str(tmp_path))
    entries = read_mountinfo()
    assert is_mount_point(str(point), entries)
    subprocess.run(["umount", str(point)], check=True, capture_output=True)
    mounted.remove(str(point))
    assert not is_mount_point(str(point))
    # A snapshot taken while it was mounted still says so: the caller chose that read.
    assert is_mount_point(str(point), entries)


@needs_root
@pytest.mark.parametrize("name", ["with space", "tab\there", "back\\slash"])
def test_names_the_kernel_escapes(tmp_path: Path, mounted: list[str], name: str) -> None:
    point = tmp_path / name
    _bind_self(point, mounted)
    raw = Path("/proc/self/mountinfo").read_text()
    assert str(point) not in raw  # the kernel really did escape it
    assert is_mount_point(str(point))
    # The escaped spelling names a different (absent) path.
    escaped = name.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")
    assert not is_mount_point(str(tmp_path / escaped))


@needs_root
def test_symlink_to_a_mount_point_is_resolved(tmp_path: Path, mounted: list[str]) -> None:
    point = tmp_path / "real point"
    _bind_self(point, mounted)
    link = tmp_path / "link"
    link.symlink_to(point)
    rel = tmp_path / "rel"
    rel.symlink_to("real point")
    assert is_mount_point(str(link))
    assert is_mount_point(str(rel))
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert not is_mount_point(str(dangling))


@needs_root
def test_symlinked_parent_of_a_mount_point(tmp_path: Path, mounted: list[str]) -> None:
    point = tmp_path / "base" / "vol"
    _bind_self(point, mounted)
    (tmp_path / "alias").symlink_to(tmp_path / "base")
    assert is_mount_point(str(tmp_path / "alias" / "vol"))
