"""Claim states and the volume watcher's bookkeeping without a plugin (the plugin paths run in
test_volume_life.py), and the keys `volume create` reads from a volume file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from driversdk.agent.csi.volumes import (
    NODE_DETACHED,
    TAKEN,
    UNPUBLISHING,
    Claim,
    ClaimDetail,
    ClaimError,
    VolumeError,
    VolumeStore,
    claim_state_text,
    parse_volume_file,
)
from driversdk.agent.csi.volumewatcher import VolumeWatcher, backoff, describe
from driversdk.agent.state.runstate import RunState
from driversdk.csi.model import AccessMode, AttachmentMode, Volume, VolumeCapability, topology_reachable

FS = "file-system"
SNW = "single-node-writer"


def store_with(data: Path) -> VolumeStore:
    store = VolumeStore(str(data / "state.db"))
    cap = VolumeCapability(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.FILE_SYSTEM)
    store.register(Volume(id="vol", plugin_id="hostpath", capabilities=[cap]))
    return store


def take(store: VolumeStore, alloc: str, detail: ClaimDetail | None = None) -> None:
    store.claim(Claim("default", "vol", alloc, "job", "write", SNW, FS, detail=(detail or ClaimDetail()).to_json()))


def alloc(data: Path, alloc_id: str, state: str) -> None:
    runs = RunState(str(data))
    runs.alloc_started(alloc_id, "job", "app", 0, str(data / "allocs" / alloc_id))
    runs.alloc_update(alloc_id, state=state)
    runs.close()


def test_a_terminal_allocation_or_a_past_claim_never_blocks_a_new_claim(tmp_path: Path) -> None:
    store = store_with(tmp_path)
    alloc(tmp_path, "old", "running")
    take(store, "old")
    with pytest.raises(ClaimError, match="volume max claims reached"):
        take(store, "new")
    alloc(tmp_path, "old", "failed")  # its run ended it, but the release has not happened yet
    take(store, "new")
    assert {c.alloc_id: c.state for c in store.claims("vol")} == {"new": TAKEN, "old": TAKEN}
    assert store.set_claim_state("vol", "default", "new", UNPUBLISHING)
    take(store, "third")  # a past claim does not count either
    with pytest.raises(ClaimError, match="allocation new released its claim already"):
        take(store, "new")


def test_the_watcher_frees_a_claim_of_a_terminal_alloc_that_mounted_nothing(tmp_path: Path) -> None:
    store = store_with(tmp_path)
    alloc(tmp_path, "gone", "stopped")
    take(store, "gone", ClaimDetail(plugin_id="hostpath"))
    watcher = VolumeWatcher(str(tmp_path))
    try:
        outcome = watcher.reap()
    finally:
        watcher.close()
    assert [r.claim.alloc_id for r in outcome.released] == ["gone"] and outcome.failed == []
    assert describe(outcome.released[0]) == 'released the past claim of alloc gone (job job) on CSI volume "vol"'
    assert store.claims("vol") == []


def test_a_controller_step_without_a_plugin_backs_off_and_detach_frees_it_saying_what_is_left(
    tmp_path: Path,
) -> None:
    store = store_with(tmp_path)
    alloc(tmp_path, "a1", "stopped")
    take(store, "a1", ClaimDetail(plugin_id="hostpath", controller_published=True, csi_node_id="n1"))
    watcher = VolumeWatcher(str(tmp_path))
    try:
        first = watcher.reap()
        [(failed, error)] = first.failed
        assert failed.alloc_id == "a1"
        assert error.startswith('could not detach from controller: no controller instance of CSI plugin "hostpath"')
        [held] = store.claims("vol")
        assert held.state == NODE_DETACHED and held.attempts == 1 and held.last_error == error
        assert held.next_attempt > time.time() + backoff(0) - 1
        assert claim_state_text(held) == f"past, being released (next: controller unpublish); last error: {error}"
        assert watcher.reap().failed == [], "within its backoff the claim waits"
        detached = watcher.reap(volume_id="vol", force=True, detach=True)
    finally:
        watcher.close()
    [released] = detached.released
    assert released.not_undone == [
        'ControllerUnpublishVolume of volume "vol" from node "n1" (no controller instance of CSI plugin "hostpath" '
        "is registered; the plugin may still count the volume as published there)"
    ]
    assert store.claims("vol") == []


def test_backoff_doubles_to_a_minute() -> None:
    assert [backoff(n) for n in (0, 1, 2, 5, 6, 20)] == [1.0, 2.0, 4.0, 32.0, 60.0, 60.0]


def test_volume_file_create_keys(tmp_path: Path) -> None:
    path = tmp_path / "v.hcl"
    path.write_text(
        'id = "v"\nplugin_id = "p"\ncapacity_min = "1GiB"\ncapacity_max = "2G"\nsnapshot_id = "s1"\n'
        'capability {\n  access_mode = "single-node-writer"\n  attachment_mode = "file-system"\n}\n'
        'topology_request {\n  required {\n    topology {\n      segments = { "zone" = "a" }\n    }\n  }\n'
        '  preferred {\n    topology {\n      segments = { "zone" = "a", "rack" = "r1" }\n    }\n  }\n}\n'
    )
    volume = parse_volume_file(path)
    assert (volume.capacity_min, volume.capacity_max, volume.snapshot_id) == (2**30, 2 * 10**9, "s1")
    assert volume.requested_topologies.required == ({"zone": "a"},)
    assert volume.requested_topologies.preferred == ({"zone": "a", "rack": "r1"},)
    assert volume.topologies == [{"zone": "a"}], "registering states the required topology"
    assert topology_reachable(volume.topologies, {"zone": "a", "host": "h"})
    assert not topology_reachable(volume.topologies, {"zone": "b"})


def test_volume_file_create_keys_refused_with_sentences(tmp_path: Path) -> None:
    path = tmp_path / "v.hcl"
    path.write_text(
        'id = "v"\nplugin_id = "p"\ncapacity_min = "lots"\ncapacity_max = "1KB"\nsnapshot_id = "s"\n'
        'clone_id = "c"\ncapability {\n  access_mode = "single-node-writer"\n  attachment_mode = "file-system"\n}\n'
    )
    with pytest.raises(VolumeError) as err:
        parse_volume_file(path)
    assert str(err.value) == (
        f'{path}: validation: capacity_min "lots" is not a size; use e.g. "10GiB", "500MB" or a number of bytes, '
        "only one of snapshot_id and clone_id may be set"
    )
    path.write_text(
        'id = "v"\nplugin_id = "p"\ncapacity_min = "2MB"\ncapacity_max = "1MB"\n'
        'capability {\n  access_mode = "single-node-writer"\n  attachment_mode = "file-system"\n}\n'
    )
    with pytest.raises(VolumeError, match=r"capacity_max \(1000000 bytes\) is smaller than capacity_min \(2000000"):
        parse_volume_file(path)
