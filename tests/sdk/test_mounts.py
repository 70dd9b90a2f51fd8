"""Mount rules: pure logic for each rule, and real bind mounts whose propagation we read back."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.model import MountConfigSupport
from driversdk.mountinfo import find_mount, parse_line, read_mountinfo, unescape
from driversdk.mounts import (
    Mount,
    MountRequest,
    MountValidationError,
    Propagation,
    UnknownPropagationError,
    check_host_preconditions,
    check_mounts,
    ensure_mounts_usable,
)

ALL = int(MountConfigSupport.ALL)
NONE = int(MountConfigSupport.NONE)


def test_propagation_wire_strings_and_linux_meaning() -> None:
    assert Propagation.parse("") is Propagation.PRIVATE
    assert {m.value: m.linux for m in Propagation} == {
        "private": "rprivate",
        "host-to-task": "rslave",
        "bidirectional": "rshared",
    }
    with pytest.raises(UnknownPropagationError) as info:
        Propagation.parse("rshared")
    assert str(info.value) == (
        "unknown propagation_mode 'rshared': use one of 'private', 'host-to-task', 'bidirectional' "
        "(empty means 'private')"
    )


def test_check_mounts_builds_mounts(tmp_path: Path) -> None:
    mounts = check_mounts(
        [MountRequest("data", "/data", str(tmp_path), read_only=True)],
        task="web",
        driver="docker",
        mount_configs=ALL,
    )
    assert mounts == [Mount("/data", str(tmp_path), readonly=True, request_name="data")]


def test_driver_without_mount_support_names_driver_task_and_volumes(tmp_path: Path) -> None:
    reqs = [
        MountRequest("data", "/data", str(tmp_path)),
        MountRequest("cache", "/cache", str(tmp_path), kind="csi"),
    ]
    with pytest.raises(MountValidationError) as info:
        check_mounts(reqs, task="web", driver="raw", mount_configs=NONE)
    text = str(info.value)
    assert 'task driver "raw" for "web" does not support host volumes: volume "data" cannot be mounted' in text
    assert 'task driver "raw" for "web" does not support CSI: volume "cache" cannot be mounted' in text
    assert len(info.value.problems) == 2


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    reqs = [
        MountRequest("a", "relative", str(tmp_path)),
        MountRequest("b", "/same", str(tmp_path), propagation="bidirectional", read_only=True),
        MountRequest("c", "/same", str(tmp_path / "missing")),
        MountRequest("d", "/d", str(tmp_path), propagation="sideways"),
    ]
    with pytest.raises(MountValidationError) as info:
        check_mounts(reqs, task="web", driver="docker", mount_configs=ALL, check_host=True)
    fields = [(p.volume, p.field) for p in info.value.problems]
    assert ("a", "destination") in fields
    assert ("b", "propagation_mode") in fields
    assert ("c", "destination") in fields
    assert ("c", "host_path") in fields
    assert ("d", "propagation_mode") in fields
    text = str(info.value)
    assert 'task "web" volume "a": destination "relative" must be an absolute path inside the task' in text
    assert (
        'task "web" volume "b": propagation_mode "bidirectional" needs a read-write mount, but the mount is '
        "read-only; set read_only = false" in text
    )
    assert 'task "web": volumes "b" and "c" both mount at "/same"' in text
    assert f'task "web" volume "c": host path "{tmp_path / "missing"}" does not exist' in text
    assert 'task "web" volume "d": unknown propagation_mode "sideways"' in text
    # bidirectional on read-only is one problem, not two
    assert text.count('"bidirectional" needs a read-write mount') == 1


def test_mountinfo_line_parsing_with_escapes_and_optional_fields() -> None:
    line = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 shared:7 - ext3 /dev/root rw,errors=continue\n"
    entry = parse_line(line)
    assert entry.mount_point == "/mnt/with space"
    assert entry.root == "/mnt1"
    assert entry.shared and entry.slave and entry.propagation == "shared,slave"
    assert entry.fs_type == "ext3" and entry.source == "/dev/root"
    assert parse_line("1 0 0:1 / / rw - tmpfs none rw").propagation == "private"
    assert unescape("a\\011b\\134c") == "a\tb\\c"


def test_mountinfo_agrees_with_findmnt_for_every_mount() -> None:
    out = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET,PROPAGATION"], capture_output=True, text=True, check=True
    ).stdout
    expected = {}
    for line in out.splitlines():
        target, prop = line.rsplit(" ", 1)
        expected[target.encode().decode("unicode_escape")] = prop
    ours = {e.mount_point: e.propagation for e in read_mountinfo()}
    for target, prop in expected.items():
        if target in ours:
            assert ours[target] == prop, target


# --- real mounts ------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True)


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[list[str]]:
    """Mount points made by a test, unmounted (innermost first) whatever happens."""
    made: list[str] = []
    yield made
    for point in reversed(made):
        subprocess.run(["umount", "-l", point], capture_output=True)
    left = [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(tmp_path))]
    assert left == [], f"mounts left behind: {left}"


def _bind_self(path: Path, made: list[str], mode: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "--bind", str(path), str(path))
    made.append(str(path))
    _run("mount", f"--make-{mode}", str(path))


@needs_root
@pytest.mark.parametrize("mode", ["host-to-task", "bidirectional"])
def test_private_source_refused_for_rslave_and_rshared(tmp_path: Path, mounted: list[str], mode: str) -> None:
    src = tmp_path / "private"
    _bind_self(src, mounted, "private")
    assert find_mount(str(src)).propagation == "private"
    problems = check_host_preconditions([Mount("/data", str(src), propagation=Propagation.parse(mode))], task="web")
    assert len(problems) == 1
    linux = Propagation.parse(mode).linux
    assert problems[0].message == (
        f'task "web" volume "/data": propagation_mode "{mode}" ({linux}) needs the host source "{src}" on a shared '
        f'or slave mount, but it sits on "{src}", which is private; make that path a shared mount on the host: '
        f'`mount --make-shared {src}` (or use propagation_mode = "private")'
    )
    # private propagation is always fine
    assert check_host_preconditions([Mount("/data", str(src))], task="web") == []


@needs_root
def test_shared_and_slave_sources_accepted(tmp_path: Path, mounted: list[str]) -> None:
    shared = tmp_path / "shared"
    _bind_self(shared, mounted, "shared")
    slave = tmp_path / "slave"
    slave.mkdir()
    _run("mount", "--bind", str(shared), str(slave))
    mounted.append(str(slave))
    _run("mount", "--make-slave", str(slave))
    assert find_mount(str(shared / "sub")).propagation == "shared"
    assert find_mount(str(slave)).propagation == "slave"
    for src in (shared, slave):
        for mode in (Propagation.HOST_TO_TASK, Propagation.BIDIRECTIONAL):
            ensure_mounts_usable([Mount("/data", str(src), propagation=mode, request_name="v")], task="web")


@needs_root
def test_path_with_space_resolves_to_its_mount(tmp_path: Path, mounted: list[str]) -> None:
    spaced = tmp_path / "with space"
    _bind_self(spaced, mounted, "shared")
    entry = find_mount(str(spaced))
    assert entry.mount_point == str(spaced)
    assert entry.propagation == "shared"
