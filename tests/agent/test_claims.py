"""Claim rules of the volume store (csi reference §3.4), and the duration texts of the supervisor."""

from __future__ import annotations

from pathlib import Path

import pytest

from driversdk.agent.csi.pluginsupervisor import go_duration, parse_duration
from driversdk.agent.csi.volumes import Claim, ClaimError, VolumeStore
from driversdk.csi.model import AccessMode, AttachmentMode, Volume, VolumeCapability
from driversdk.errors import ConfigError

FS = "file-system"


def store_with(tmp_path: Path, mode: str) -> VolumeStore:
    store = VolumeStore(str(tmp_path / "state.db"))
    cap = VolumeCapability(AccessMode.parse(mode), AttachmentMode.FILE_SYSTEM)
    store.register(Volume(id="vol", plugin_id="hostpath", capabilities=[cap]))
    return store


def claim(store: VolumeStore, alloc: str, kind: str, mode: str, attachment: str = FS) -> None:
    store.claim(Claim("default", "vol", alloc, "job", kind, mode, attachment))


# (current access mode, held claims, new claim kind) -> allowed; straight from the reference table.
CASES = [
    ("single-node-reader-only", [], "read", True),
    ("single-node-reader-only", ["read"], "read", False),
    ("single-node-reader-only", [], "write", False),
    ("single-node-writer", [], "read", True),
    ("single-node-writer", ["read"], "read", False),
    ("single-node-writer", ["write"], "read", False),
    ("single-node-writer", [], "write", True),
    ("single-node-writer", ["read"], "write", True),  # readers are not checked for a new writer
    ("single-node-writer", ["write"], "write", False),
    ("multi-node-reader-only", ["read", "read"], "read", True),
    ("multi-node-reader-only", [], "write", False),
    ("multi-node-single-writer", ["read", "write"], "read", True),
    ("multi-node-single-writer", ["read"], "write", True),
    ("multi-node-single-writer", ["write"], "write", False),
    ("multi-node-multi-writer", ["write", "write", "read"], "write", True),
    ("multi-node-multi-writer", ["write"], "read", True),
]


@pytest.mark.parametrize(("mode", "held", "kind", "allowed"), CASES)
def test_claim_slots_follow_the_access_mode(
    tmp_path: Path, mode: str, held: list[str], kind: str, allowed: bool
) -> None:
    store = store_with(tmp_path, mode)
    for i, existing in enumerate(held):
        store.claim(Claim("default", "vol", f"held-{i}", "job", existing, mode, FS))
    if allowed:
        claim(store, "new", kind, mode)
        assert "new" in {c.alloc_id for c in store.claims("vol")}
    else:
        with pytest.raises(ClaimError, match="volume max claims reached: "):
            claim(store, "new", kind, mode)
        assert "new" not in {c.alloc_id for c in store.claims("vol")}


def test_claim_is_idempotent_for_the_same_alloc_and_released(tmp_path: Path) -> None:
    store = store_with(tmp_path, "single-node-writer")
    claim(store, "a", "write", "single-node-writer")
    claim(store, "a", "write", "single-node-writer")
    assert [c.alloc_id for c in store.claims("vol")] == ["a"]
    store.release("vol", "default", "a")
    assert store.claims("vol") == []
    claim(store, "b", "write", "single-node-writer")


def test_claim_refuses_another_attachment_mode_and_unknown_volumes(tmp_path: Path) -> None:
    store = store_with(tmp_path, "multi-node-multi-writer")
    claim(store, "a", "write", "multi-node-multi-writer")
    with pytest.raises(ClaimError, match="cannot change attachment mode of claimed volume"):
        claim(store, "b", "write", "multi-node-multi-writer", attachment="block-device")
    with pytest.raises(ClaimError, match='volume "other" is not registered in namespace "default"'):
        store.claim(Claim("default", "other", "a", "job", "write", "single-node-writer", FS))


def test_deregister_refuses_a_claimed_volume(tmp_path: Path) -> None:
    store = store_with(tmp_path, "single-node-writer")
    claim(store, "abcdef123456", "write", "single-node-writer")
    with pytest.raises(
        ConfigError,
        match=r'^volume "vol" is claimed by alloc abcdef12 of job job \(in use\); stop those jobs before deregistering',
    ):
        store.deregister("vol")
    store.release("vol", "default", "abcdef123456")
    store.deregister("vol")


@pytest.mark.parametrize(
    ("text", "seconds", "go"),
    [("30s", 30.0, "30s"), ("500ms", 0.5, "500ms"), ("1m30s", 90.0, "1m30s"), ("2h", 7200.0, "2h0m0s")],
)
def test_durations(text: str, seconds: float, go: str) -> None:
    assert parse_duration(text, "health_timeout") == seconds
    assert go_duration(seconds) == go


@pytest.mark.parametrize("bad", ["", "30", "s", "3x", "1.5.2s"])
def test_bad_durations_name_the_field(bad: str) -> None:
    with pytest.raises(ConfigError, match=f"health_timeout {bad!r} is not a duration"):
        parse_duration(bad, "health_timeout")
