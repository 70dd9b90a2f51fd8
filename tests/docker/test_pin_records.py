"""A docker plugin killed between pinning a bind source and starting its container leaves the
pin mounted in the alloc dir; the next plugin to start releases it (drivers/docker/pinrecord.py).
Played without the engine: a real pin, a record naming a process that no longer runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from drivers.docker import pinrecord, reconcile
from driversdk import pinning
from driversdk.mountinfo import mount_points

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pins are bind mounts: root only")


def _dead_identity() -> str:
    done = subprocess.run(["true"], check=True)
    assert done.returncode == 0
    # A pid that ran and ended: its identity can never be alive again (start time differs).
    proc = subprocess.Popen(["true"])
    identity = reconcile.identity(proc.pid)
    proc.wait()
    return identity


def _pin_dir(tmp_path: Path) -> tuple[Path, str]:
    alloc = tmp_path / "alloc-dir"
    (alloc / "alloc" / "logs").mkdir(parents=True)
    directory = pinning.private_dir(str(alloc / (pinrecord.PIN_DIR_PREFIX + "x")))
    fd = pinning.open_beneath(str(alloc), "alloc/logs")
    try:
        pinned = pinning.pin(fd, directory, "0").path
    finally:
        os.close(fd)
    return alloc, pinned


def test_the_pins_of_a_plugin_that_died_are_released_and_a_live_ones_kept(tmp_path: Path) -> None:
    records = str(tmp_path / "records")
    alloc, pinned = _pin_dir(tmp_path)
    try:
        assert pinned in mount_points()
        path = pinrecord.record(os.path.dirname(pinned), records)
        assert path is not None
        # Written by this (live) process: never touched.
        assert pinrecord.release_stale(records) == []
        assert pinned in mount_points()
        # The same record as a dead plugin left it.
        Path(path).write_text(f"{_dead_identity()}\n{os.path.dirname(pinned)}\n")
        assert pinrecord.release_stale(records) == [os.path.dirname(pinned)]
        assert pinned not in mount_points()
        assert not os.path.lexists(os.path.dirname(pinned)), "the pin dir goes with its pins"
        assert os.listdir(records) == [], "the record goes once acted on"
        assert (alloc / "alloc" / "logs").is_dir(), "the pinned dir itself is left as it was"
    finally:
        pinning.unpin(pinned)


def test_a_record_naming_anything_but_a_pin_dir_unmounts_nothing(tmp_path: Path) -> None:
    records = str(tmp_path / "records")
    victim = tmp_path / "victim"
    victim.mkdir()
    subprocess.run(["mount", "--bind", str(victim), str(victim)], check=True)
    try:
        path = pinrecord.record(str(victim), records)
        assert path is not None
        Path(path).write_text(f"{_dead_identity()}\n{victim}\n")
        assert pinrecord.release_stale(records) == [str(victim)]  # dropped, never acted on
        assert str(victim) in mount_points()
        assert os.listdir(records) == []
    finally:
        subprocess.run(["umount", str(victim)], check=False)
