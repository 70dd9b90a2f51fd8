"""The one-field mountinfo reader the volume manager checks its paths against."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from driversdk.agent.csi.manager import NodeVolumeManager
from driversdk.agent.csi.state import StateStore
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.mountinfo import mount_points, parse_line, read_mountinfo
from tests.csi.hostpathvol import MULTI, kept_stage, make_volume, tree

from .conftest import HostPathPlugin, mounts_under


def test_mount_points_match_the_full_parse() -> None:
    assert mount_points() == frozenset(e.mount_point for e in read_mountinfo())


def test_mount_points_unescape_like_the_full_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = r"36 35 98:0 / /mnt/with\040space\134x rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
    proc = tmp_path / "proc" / "7"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text(line + "\n\n")
    real_open = open

    def fake_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if path == "/proc/7/mountinfo":
            path = str(proc / "mountinfo")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert mount_points(7) == frozenset({parse_line(line).mount_point}) == frozenset({"/mnt/with space\\x"})


def test_csi_failed_unstage_keeps_the_stage_and_clears_the_publish_side(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path
) -> None:
    # The publish side's directories are removed while NodeUnstageVolume runs; when the unstage
    # fails they are gone all the same, the stage stays recorded, and a retry finishes the rest.
    p = plugin_factory("NodeUnstageVolume=INVALID_ARGUMENT:1")
    client = CSIClient(p.socket, plugin="hostpath")
    store = StateStore(str(tmp_path / "state.db"))
    root = tmp_path / "csi"
    manager = NodeVolumeManager(client, plugin_id="hostpath", host_root=str(root), store=store, requires_staging=True)
    volume = make_volume(client)
    manager.mount(volume, "alloc-a", MULTI)
    with pytest.raises(CSIError) as info:
        manager.unmount(volume, "alloc-a", MULTI)
    assert info.value.call == "NodeUnstageVolume"
    assert os.listdir(root / "per-alloc") == []  # the layout dir alone, kept empty
    assert mounts_under(root) == [str(root / "staging" / "default" / volume.id / MULTI.key)]
    assert store.staged("hostpath", "default", volume.id, MULTI.key)
    manager.unmount(volume, "alloc-a", MULTI)
    assert mounts_under(root) == [] and tree(root) == kept_stage(volume, MULTI)
    assert not store.staged("hostpath", "default", volume.id, MULTI.key)
    assert store.usages("hostpath") == []


def test_csi_failed_unstage_is_finished_by_resume_teardowns(
    plugin_factory: Callable[..., HostPathPlugin], tmp_path: Path
) -> None:
    # The alloc's use stays "unmounting" until NodeUnstageVolume is done, so a process that stops
    # after the unpublish (here: the unstage fails, then the process "restarts") still unstages.
    p = plugin_factory("NodeUnstageVolume=INVALID_ARGUMENT:1")
    client = CSIClient(p.socket, plugin="hostpath")
    db = str(tmp_path / "state.db")
    root = tmp_path / "csi"
    manager = NodeVolumeManager(client, plugin_id="hostpath", host_root=str(root), store=StateStore(db),
                                requires_staging=True)  # fmt: skip
    volume = make_volume(client)
    manager.mount(volume, "alloc-a", MULTI)
    with pytest.raises(CSIError):
        manager.unmount(volume, "alloc-a", MULTI)
    assert [(u.alloc_id, u.phase) for u in manager.store.usages("hostpath")] == [("alloc-a", "unmounting")]
    fresh = NodeVolumeManager(CSIClient(p.socket), plugin_id="hostpath", host_root=str(root), store=StateStore(db),
                              requires_staging=True)  # fmt: skip
    assert fresh.resume_teardowns() == ["alloc-a"]
    assert mounts_under(root) == [] and tree(root) == kept_stage(volume, MULTI)
    assert fresh.store.usages("hostpath") == []
    assert not fresh.store.staged("hostpath", "default", volume.id, MULTI.key)
