"""The CSI volume store: volumes registered on this client, with Nomad's register/merge rules.

Volume specification files follow Nomad's format (``id``, ``name``, ``type = "csi"``,
``plugin_id``, ``external_id``, ``capability {}`` blocks, ``mount_options {}``, ``secrets {}``,
``parameters {}``, ``context {}``). Secrets and mount flags never appear in ``status`` output.
"""

from __future__ import annotations

import builtins
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driversdk.csi.model import (
    REDACTED,
    AccessMode,
    AttachmentMode,
    MountOptions,
    Secrets,
    Volume,
    VolumeCapability,
)
from driversdk.errors import ConfigError
from driversdk.paths import check_name, show
from driversdk.runner.hclload import is_blocks, load_hcl, single
from driversdk.statedb import open_state

_KEYS = {"id", "name", "namespace", "type", "plugin_id", "external_id", "capability", "mount_options", "secrets",
         "parameters", "context"}  # fmt: skip


class VolumeError(ConfigError):
    """A volume specification or registration that cannot be accepted."""


class ClaimError(VolumeError):
    """A claim the volume's access mode (or its current claims) does not allow."""


@dataclass(frozen=True)
class Claim:
    namespace: str
    volume_id: str
    alloc_id: str
    job: str
    mode: str  # "read" | "write", as Nomad's claim modes
    access_mode: str
    attachment_mode: str


def _claim_refusal(current: str, mode: str, readers: int, writers: int) -> str | None:
    """Nomad's free-slot rules per current access mode (csi reference §3.4); None = allowed."""
    if mode == "read":
        if current == "single-node-reader-only" and readers:
            return "single-node-reader-only allows one reader"
        if current == "single-node-writer" and (readers or writers):
            return "single-node-writer allows one reader or writer"
        return None
    if current in ("single-node-reader-only", "multi-node-reader-only"):
        return f"{current} allows no writer"
    if current in ("single-node-writer", "multi-node-single-writer") and writers:
        return f"{current} allows one writer"
    return None


def _string(data: dict[str, Any], key: str, problems: list[str]) -> str:
    """A string argument; numbers, bools and blocks are refused rather than turned into text."""
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        problems.append(f"{key} must be a string, not {show(repr(value))[1:-1]}")
        return ""
    return value


def _string_map(data: dict[str, Any], key: str, problems: list[str]) -> dict[str, str]:
    value = data.get(key)
    body = single(value)
    if value is not None and not (isinstance(value, dict) or is_blocks(value)):
        problems.append(f"{key} must be a block ({key} {{ … }})")
    return {str(k): str(v) for k, v in body.items()}


def parse_volume_file(path: str | Path) -> Volume:
    data = load_hcl(path)
    problems = [f"unsupported argument or block {k!r}" for k in sorted(set(data) - _KEYS)]
    if (data.get("type") or "csi") != "csi":
        problems.append(f'type {data.get("type")!r} is not supported here; register CSI volumes (type = "csi")')
    caps = []
    blocks = data.get("capability")
    if blocks is not None and not is_blocks(blocks):
        problems.append("capability must be blocks (capability { access_mode = …, attachment_mode = … })")
    cap_blocks: list[dict[str, Any]] = data["capability"] if is_blocks(blocks) else []
    # Set when a capability block was given but refused: "at least one is required" would then mislead.
    capability_refused = blocks is not None and not is_blocks(blocks)
    for i, block in enumerate(cap_blocks):
        try:
            caps.append(
                VolumeCapability(
                    AccessMode.parse(str(block.get("access_mode", ""))),
                    AttachmentMode.parse(str(block.get("attachment_mode", ""))),
                )
            )
        except ConfigError as err:
            problems.append(f"capability[{i}]: {err}")
            capability_refused = True
    raw_opts = data.get("mount_options")
    if raw_opts is not None and not (isinstance(raw_opts, dict) or is_blocks(raw_opts)):
        problems.append("mount_options must be a block (mount_options { … })")
    opts = single(raw_opts)
    flags = opts.get("mount_flags") or []
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        problems.append("mount_options.mount_flags must be a list of strings")
        flags = []
    fs_type = opts.get("fs_type") or ""
    if not isinstance(fs_type, str):
        problems.append("mount_options.fs_type must be a string")
        fs_type = ""
    volume = Volume(
        id=_string(data, "id", problems),
        plugin_id=_string(data, "plugin_id", problems),
        namespace=_string(data, "namespace", problems) or "default",
        name=_string(data, "name", problems),
        external_id=_string(data, "external_id", problems),
        capabilities=caps,
        mount_options=MountOptions(fs_type, tuple(flags)) if opts else None,
        secrets=Secrets(_string_map(data, "secrets", problems)),
        parameters=_string_map(data, "parameters", problems),
        context=_string_map(data, "context", problems),
    )
    if not volume.id:
        problems.append("missing id")
    if not volume.plugin_id:
        problems.append("missing plugin_id")
    # The id, plugin id and namespace become directory names (staging and publish paths).
    for value, what in ((volume.id, "id"), (volume.plugin_id, "plugin_id"), (volume.namespace, "namespace")):
        problem = check_name(value, what) if value else None
        if problem is not None:
            problems.append(problem)
    if not caps and not capability_refused:
        problems.append("at least one capability { access_mode, attachment_mode } block is required")
    if problems:
        raise VolumeError(f"{path}: validation: " + ", ".join(problems))
    return volume


def merge(existing: Volume, update: Volume) -> Volume:
    """Nomad's CSIVolume.Merge for an unclaimed volume: identity fields are immutable."""
    errors = []
    for field, label in (("name", "name"), ("external_id", "external ID")):
        new, old = getattr(update, field), getattr(existing, field)
        if new and old and new != old:
            errors.append(f"volume {label} cannot be updated ({old!r} -> {new!r})")
    if update.plugin_id != existing.plugin_id:
        errors.append(f"volume plugin ID cannot be updated ({existing.plugin_id!r} -> {update.plugin_id!r})")
    if update.parameters and existing.parameters and update.parameters != existing.parameters:
        errors.append("volume parameters cannot be updated")
    if errors:
        raise VolumeError(f'unable to update volume "{existing.id}": ' + "; ".join(errors))
    return Volume(
        id=existing.id,
        plugin_id=existing.plugin_id,
        namespace=existing.namespace,
        name=existing.name or update.name,
        external_id=existing.external_id or update.external_id,
        capabilities=update.capabilities,
        mount_options=update.mount_options,  # not in use: replaced, even by nothing
        secrets=update.secrets,  # always replaced: an update without secrets erases them
        parameters=existing.parameters or update.parameters,
        context=update.context or existing.context,
    )


def _to_json(volume: Volume) -> str:
    return json.dumps(
        {
            "id": volume.id,
            "plugin_id": volume.plugin_id,
            "namespace": volume.namespace,
            "name": volume.name,
            "external_id": volume.external_id,
            "capabilities": [[c.access_mode.value, c.attachment_mode.value] for c in volume.capabilities],
            "mount_options": None
            if volume.mount_options is None
            else [volume.mount_options.fs_type, list(volume.mount_options.mount_flags)],
            "secrets": dict(volume.secrets),
            "parameters": volume.parameters,
            "context": volume.context,
        },
        sort_keys=True,
    )


def _from_json(text: str) -> Volume:
    d = json.loads(text)
    opts = d["mount_options"]
    return Volume(
        id=d["id"],
        plugin_id=d["plugin_id"],
        namespace=d["namespace"],
        name=d["name"],
        external_id=d["external_id"],
        capabilities=[VolumeCapability(AccessMode.parse(a), AttachmentMode.parse(b)) for a, b in d["capabilities"]],
        mount_options=None if opts is None else MountOptions(opts[0], tuple(opts[1])),
        secrets=Secrets(d["secrets"]),
        parameters=d["parameters"],
        context=d["context"],
    )


def public_view(volume: Volume) -> dict[str, Any]:
    """What status shows: secrets by key only, mount flags redacted."""
    return {
        "id": volume.id,
        "namespace": volume.namespace,
        "name": volume.name,
        "plugin_id": volume.plugin_id,
        "external_id": volume.external_id,
        "capabilities": [f"{c.access_mode.value}/{c.attachment_mode.value}" for c in volume.capabilities],
        "mount_options": None
        if volume.mount_options is None
        else {
            "fs_type": volume.mount_options.fs_type,
            "mount_flags": [REDACTED] if volume.mount_options.mount_flags else [],
        },
        "secrets": {k: REDACTED for k in sorted(volume.secrets)},
        "parameters": volume.parameters,
        "context": volume.context,
    }


@dataclass
class VolumeStore:
    path: str

    def __post_init__(self) -> None:
        self._db = open_state(self.path)  # tables: driversdk.state.migrations
        self._lock = threading.Lock()

    @classmethod
    def for_data_dir(cls, data_dir: str) -> VolumeStore:
        return cls(os.path.join(data_dir, "state.db"))

    def get(self, volume_id: str, namespace: str = "default") -> Volume | None:
        with self._lock:
            row = self._db.execute(
                "SELECT record FROM volumes WHERE namespace=? AND id=?", (namespace, volume_id)
            ).fetchone()
        return _from_json(row[0]) if row else None

    def list(self) -> list[Volume]:
        with self._lock:
            rows = self._db.execute("SELECT record FROM volumes ORDER BY namespace, id").fetchall()
        return [_from_json(r[0]) for r in rows]

    def register(self, volume: Volume) -> tuple[Volume, bool]:
        """Insert, or merge onto an existing registration; returns (stored, created)."""
        existing = self.get(volume.id, volume.namespace)
        stored = volume if existing is None else merge(existing, volume)
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO volumes VALUES (?, ?, ?)", (stored.namespace, stored.id, _to_json(stored))
            )
        return stored, existing is None

    def deregister(self, volume_id: str, namespace: str = "default") -> None:
        if self.get(volume_id, namespace) is None:
            raise VolumeError(f'volume "{volume_id}" is not registered in namespace "{namespace}"')
        held = self.claims(volume_id, namespace)
        if held:
            users = ", ".join(sorted({f"{c.alloc_id[:8]} (job {c.job})" for c in held}))
            raise VolumeError(
                f'volume "{volume_id}" is in use by allocation(s) {users}; stop them before deregistering it'
            )
        with self._lock:
            self._db.execute("DELETE FROM volumes WHERE namespace=? AND id=?", (namespace, volume_id))

    # --- claims ----------------------------------------------------------------------------------

    def claims(self, volume_id: str, namespace: str = "default") -> builtins.list[Claim]:
        with self._lock:
            rows = self._db.execute(
                "SELECT namespace, volume_id, alloc_id, job, mode, access_mode, attachment_mode FROM volume_claims "
                "WHERE namespace=? AND volume_id=? ORDER BY alloc_id",
                (namespace, volume_id),
            ).fetchall()
        return [Claim(*r) for r in rows]

    def claim(self, claim: Claim) -> None:
        """Take a read or write claim, in one transaction so two runs cannot both get the last slot."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._claim_locked(claim)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _claim_locked(self, claim: Claim) -> None:
        row = self._db.execute(
            "SELECT record FROM volumes WHERE namespace=? AND id=?", (claim.namespace, claim.volume_id)
        ).fetchone()
        if row is None:
            raise ClaimError(
                f'volume "{claim.volume_id}" is not registered in namespace "{claim.namespace}"; register it '
                "with `driversdk volume register <file>`"
            )
        others = [
            Claim(*r)
            for r in self._db.execute(
                "SELECT namespace, volume_id, alloc_id, job, mode, access_mode, attachment_mode FROM volume_claims "
                "WHERE namespace=? AND volume_id=? AND alloc_id != ?",
                (claim.namespace, claim.volume_id, claim.alloc_id),
            ).fetchall()
        ]
        if others and others[0].attachment_mode != claim.attachment_mode:
            raise ClaimError(
                f'volume "{claim.volume_id}": cannot change attachment mode of claimed volume '
                f"(claimed as {others[0].attachment_mode}, asked for {claim.attachment_mode})"
            )
        current = others[0].access_mode if others else claim.access_mode
        readers = sum(1 for c in others if c.mode == "read")
        writers = sum(1 for c in others if c.mode == "write")
        refusal = _claim_refusal(current, claim.mode, readers, writers)
        if refusal is not None:
            holders = ", ".join(f"alloc {c.alloc_id[:8]} of job {c.job} ({c.mode})" for c in others)
            raise ClaimError(
                f'volume "{claim.volume_id}": volume max claims reached: {refusal} and it is claimed by '
                f"{holders}; stop that job, or use per_alloc or an access mode that allows more claims"
            )
        self._db.execute(
            "INSERT OR REPLACE INTO volume_claims VALUES (?, ?, ?, ?, ?, ?, ?)",
            (claim.namespace, claim.volume_id, claim.alloc_id, claim.job, claim.mode, claim.access_mode,
             claim.attachment_mode),
        )  # fmt: skip

    def release(self, volume_id: str, namespace: str, alloc_id: str) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM volume_claims WHERE namespace=? AND volume_id=? AND alloc_id=?",
                (namespace, volume_id, alloc_id),
            )

    def close(self) -> None:
        self._db.close()
