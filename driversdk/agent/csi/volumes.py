"""The CSI volume store: volumes registered on this client, with Nomad's register/merge rules.

Volume specification files follow Nomad's format (``id``, ``name``, ``type = "csi"``,
``plugin_id``, ``external_id``, ``capability {}`` blocks, ``mount_options {}``, ``secrets {}``,
``parameters {}``, ``context {}``, and for ``volume create`` ``capacity_min`` / ``capacity_max``,
``snapshot_id`` / ``clone_id``, ``topology_request {}``). Secrets and mount flags never appear in
``status`` output.

Claims have a life, as Nomad's: ``taken`` while the allocation uses the volume; once it is
terminal the claim is *past* (``unpublishing``, then ``node-detached`` when the node side is
undone) until the volume watcher (:mod:`driversdk.agent.csi.volumewatcher`) has released it, and
then it is gone. A past claim, or a taken one whose allocation is terminal, never blocks a new
claim.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driversdk.agent.state.store import STATE_FILE, Store, Table
from driversdk.csi.model import (
    REDACTED,
    AccessMode,
    AttachmentMode,
    MountOptions,
    Secrets,
    TopologyRequest,
    Volume,
    VolumeCapability,
)
from driversdk.errors import ConfigError
from driversdk.jobspec.hclload import is_blocks, load_hcl, single
from driversdk.paths import check_name, show

_KEYS = {"id", "name", "namespace", "type", "plugin_id", "external_id", "capability", "mount_options", "secrets",
         "parameters", "context", "capacity_min", "capacity_max", "snapshot_id", "clone_id",
         "topology_request"}  # fmt: skip

# Claim states (Nomad's CSIVolumeClaimState): taken is live; the others are past claims.
TAKEN = "taken"
UNPUBLISHING = "unpublishing"
NODE_DETACHED = "node-detached"
PAST_STATES = (UNPUBLISHING, NODE_DETACHED)
# Allocation states of the run state that end an allocation.
TERMINAL_ALLOC_STATES = ("stopped", "failed", "complete")


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
    state: str = TAKEN
    detail: str = "{}"  # JSON: what releasing it needs (see ClaimDetail)
    last_error: str = ""
    attempts: int = 0
    next_attempt: float = 0.0
    updated: float = 0.0

    @property
    def past(self) -> bool:
        return self.state in PAST_STATES

    def details(self) -> ClaimDetail:
        return ClaimDetail.from_json(self.detail)


@dataclass
class ClaimDetail:
    """What releasing a claim needs once its allocation is gone, recorded before each step is
    taken (intent first), so a release after any restart knows what may have been done."""

    plugin_id: str = ""
    read_only: bool = False
    host_root: str = ""  # the node plugin's host tree (<state>/csi/<type>/<id>)
    plugin_root: str = ""  # the same tree as the plugin sees it
    requires_staging: bool = False
    csi_node_id: str = ""
    controller_published: bool = False  # ControllerPublishVolume was (or may have been) sent
    node_mounting: bool = False  # NodeStage/NodePublish was (or may have been) sent
    source: str = ""  # the published target on the host

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClaimDetail:
        data = json.loads(text or "{}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


_CLAIM_COLUMNS = (
    "namespace, volume_id, alloc_id, job, mode, access_mode, attachment_mode, state, detail, last_error, attempts, "
    "next_attempt, updated"
)
# A claim that counts against the access mode: taken, by an allocation that is not terminal.
_LIVE = (
    f"state='{TAKEN}' AND NOT EXISTS (SELECT 1 FROM run_allocs a WHERE a.alloc_id=volume_claims.alloc_id "
    f"AND a.state IN {TERMINAL_ALLOC_STATES!r})"
)

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "ki": 2**10, "mib": 2**20, "mi": 2**20, "gib": 2**30,
          "gi": 2**30, "tib": 2**40, "ti": 2**40}  # fmt: skip


def parse_size(text: object, key: str, problems: list[str]) -> int:
    """A human size as Nomad reads it ("10GiB", "500MB", "1G", a number of bytes); 0 when unset."""
    if text is None or text == "":
        return 0
    if isinstance(text, bool) or not isinstance(text, str | int):
        problems.append(f'{key} must be a size such as "10GiB"')
        return 0
    match = _SIZE.match(str(text))
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        problems.append(f'{key} {show(str(text))} is not a size; use e.g. "10GiB", "500MB" or a number of bytes')
        return 0
    return int(float(match.group(1)) * unit)


def _topologies(value: object, where: str, problems: list[str]) -> tuple[dict[str, str], ...]:
    """``topology { segments { key = "value" } }`` blocks of a required/preferred block."""
    out = []
    blocks = single(value).get("topology")
    if blocks is None:
        return ()
    if not is_blocks(blocks):
        problems.append(f"{where}.topology must be blocks (topology {{ segments {{ … }} }})")
        return ()
    for i, block in enumerate(blocks):
        segments = {str(k): str(v) for k, v in single(block.get("segments")).items()}
        if not segments:
            problems.append(f'{where}.topology[{i}] needs segments {{ key = "value" }}')
        out.append(segments)
    return tuple(out)


def _topology_request(data: dict[str, Any], problems: list[str]) -> TopologyRequest:
    raw = data.get("topology_request")
    if raw is None:
        return TopologyRequest()
    if not (isinstance(raw, dict) or is_blocks(raw)):
        problems.append("topology_request must be a block (topology_request { required { … } preferred { … } })")
        return TopologyRequest()
    body = single(raw)
    unknown = sorted(set(body) - {"required", "preferred"})
    problems.extend(f"topology_request: unsupported block {k!r}" for k in unknown)
    return TopologyRequest(
        _topologies(body.get("required"), "topology_request.required", problems),
        _topologies(body.get("preferred"), "topology_request.preferred", problems),
    )


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


def capability_of(access_mode: object, attachment_mode: object) -> VolumeCapability:
    """A capability from its two modes as written; ConfigError names a mode that is not one."""
    return VolumeCapability(AccessMode.parse(str(access_mode)), AttachmentMode.parse(str(attachment_mode)))


@dataclass(frozen=True)
class FieldNames:
    """How a volume's fields are called where it came from (a volume file, Nomad's CSIVolume
    JSON), so one set of rules speaks the reader's names."""

    id: str
    plugin_id: str
    namespace: str
    snapshot_id: str
    clone_id: str
    capacity_min: str
    capacity_max: str
    capability: str  # the sentence asking for one


FILE_NAMES = FieldNames("id", "plugin_id", "namespace", "snapshot_id", "clone_id", "capacity_min", "capacity_max",
                        "at least one capability { access_mode, attachment_mode } block is required")  # fmt: skip


def volume_problems(volume: Volume, names: FieldNames, *, capability_refused: bool = False) -> list[str]:
    """What a volume may not be, however it was written: an id, a plugin id and a namespace that
    are safe directory names (staging and publish paths are made of them), at least one
    capability, one source at most, and sizes that fit."""
    problems = []
    if volume.snapshot_id and volume.clone_id:
        problems.append(f"only one of {names.snapshot_id} and {names.clone_id} may be set")
    if volume.capacity_max and volume.capacity_max < volume.capacity_min:
        problems.append(
            f"{names.capacity_max} ({volume.capacity_max} bytes) is smaller than {names.capacity_min} "
            f"({volume.capacity_min} bytes)"
        )
    if not volume.id:
        problems.append(f"missing {names.id}")
    if not volume.plugin_id:
        problems.append(f"missing {names.plugin_id}")
    for value, what in ((volume.id, names.id), (volume.plugin_id, names.plugin_id),
                        (volume.namespace, names.namespace)):  # fmt: skip
        problem = check_name(value, what) if value else None
        if problem is not None:
            problems.append(problem)
    if not volume.capabilities and not capability_refused:
        problems.append(names.capability)
    return problems


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
            caps.append(capability_of(block.get("access_mode", ""), block.get("attachment_mode", "")))
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
        capacity_min=parse_size(data.get("capacity_min"), "capacity_min", problems),
        capacity_max=parse_size(data.get("capacity_max"), "capacity_max", problems),
        snapshot_id=_string(data, "snapshot_id", problems),
        clone_id=_string(data, "clone_id", problems),
        requested_topologies=_topology_request(data, problems),
    )
    # Registering states where the volume is; creating asks for it (the plugin answers).
    volume.topologies = [dict(t) for t in volume.requested_topologies.required]
    problems += volume_problems(volume, FILE_NAMES, capability_refused=capability_refused)
    if problems:
        raise VolumeError(f"{path}: validation: " + ", ".join(problems))
    return volume


def merge(existing: Volume, update: Volume) -> Volume:
    """Nomad's CSIVolume.Merge for an unclaimed volume: identity fields are immutable."""
    errors = []
    for attr, label in (("name", "name"), ("external_id", "external ID"), ("snapshot_id", "snapshot ID"),
                        ("clone_id", "clone ID")):  # fmt: skip
        new, old = getattr(update, attr), getattr(existing, attr)
        if new and old and new != old:
            errors.append(f"volume {label} cannot be updated ({old!r} -> {new!r})")
    if update.plugin_id != existing.plugin_id:
        errors.append(f"volume plugin ID cannot be updated ({existing.plugin_id!r} -> {update.plugin_id!r})")
    if update.parameters and existing.parameters and update.parameters != existing.parameters:
        errors.append("volume parameters cannot be updated")
    if existing.topologies and update.topologies and update.topologies != existing.topologies:
        errors.append("volume topology request cannot be changed once the volume has topologies")
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
        capacity_min=update.capacity_min or existing.capacity_min,
        capacity_max=update.capacity_max or existing.capacity_max,
        snapshot_id=existing.snapshot_id or update.snapshot_id,
        clone_id=existing.clone_id or update.clone_id,
        requested_topologies=existing.requested_topologies,
        capacity=existing.capacity,
        topologies=existing.topologies or update.topologies,
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
            "capacity_min": volume.capacity_min,
            "capacity_max": volume.capacity_max,
            "snapshot_id": volume.snapshot_id,
            "clone_id": volume.clone_id,
            "topology_request": {
                "required": list(volume.requested_topologies.required),
                "preferred": list(volume.requested_topologies.preferred),
            },
            "capacity": volume.capacity,
            "topologies": volume.topologies,
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
        # Records written before `volume create` existed lack the keys below.
        capacity_min=d.get("capacity_min", 0),
        capacity_max=d.get("capacity_max", 0),
        snapshot_id=d.get("snapshot_id", ""),
        clone_id=d.get("clone_id", ""),
        requested_topologies=TopologyRequest(
            tuple(d.get("topology_request", {}).get("required", [])),
            tuple(d.get("topology_request", {}).get("preferred", [])),
        ),
        capacity=d.get("capacity", 0),
        topologies=d.get("topologies", []),
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
        "capacity_bytes": volume.capacity,
        "capacity_min": volume.capacity_min,
        "capacity_max": volume.capacity_max,
        "topologies": volume.topologies,
        "snapshot_id": volume.snapshot_id,
        "clone_id": volume.clone_id,
    }


class VolumeStore(Table):
    """The volumes and claims tables on a :class:`Store`, or on the store of a state file path."""

    def __init__(self, store: Store | str) -> None:
        super().__init__(store, file=True)
        self.path = self.store.path

    @classmethod
    def for_data_dir(cls, data_dir: str) -> VolumeStore:
        return cls(os.path.join(data_dir, STATE_FILE))

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
            raise VolumeError(claims_refusal(self, volume_id, held, "deregistering"))
        with self._lock:
            self._db.execute("DELETE FROM volumes WHERE namespace=? AND id=?", (namespace, volume_id))

    def update_record(self, volume: Volume) -> None:
        """Store facts the plugin reported (capacity, topologies, external id) on a registration."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO volumes VALUES (?, ?, ?)", (volume.namespace, volume.id, _to_json(volume))
            )

    # --- claims ----------------------------------------------------------------------------------

    def claims(self, volume_id: str, namespace: str = "default") -> builtins.list[Claim]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_CLAIM_COLUMNS} FROM volume_claims WHERE namespace=? AND volume_id=? ORDER BY alloc_id",
                (namespace, volume_id),
            ).fetchall()
        return [Claim(*r) for r in rows]

    def all_claims(self) -> builtins.list[Claim]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_CLAIM_COLUMNS} FROM volume_claims ORDER BY namespace, volume_id, alloc_id"
            ).fetchall()
        return [Claim(*r) for r in rows]

    def get_claim(self, volume_id: str, namespace: str, alloc_id: str) -> Claim | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_CLAIM_COLUMNS} FROM volume_claims WHERE namespace=? AND volume_id=? AND alloc_id=?",
                (namespace, volume_id, alloc_id),
            ).fetchone()
        return Claim(*row) if row else None

    def alloc_state(self, alloc_id: str) -> tuple[str, int] | None:
        """The run state's (state, run pid) of an allocation; None when it never was recorded."""
        with self._lock:
            row = self._db.execute("SELECT state, run_pid FROM run_allocs WHERE alloc_id=?", (alloc_id,)).fetchone()
        return (str(row[0]), int(row[1])) if row else None

    def alloc_terminal(self, alloc_id: str) -> bool:
        found = self.alloc_state(alloc_id)
        return found is not None and found[0] in TERMINAL_ALLOC_STATES

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
        mine = self._db.execute(
            "SELECT state FROM volume_claims WHERE namespace=? AND volume_id=? AND alloc_id=?",
            (claim.namespace, claim.volume_id, claim.alloc_id),
        ).fetchone()
        if mine is not None and mine[0] != TAKEN:
            raise ClaimError(
                f'volume "{claim.volume_id}": allocation {claim.alloc_id[:8]} released its claim already '
                f"({mine[0]}); a released claim is not taken again"
            )
        # Only live claims count: past ones, and taken ones whose allocation is terminal, are
        # being released and never block a new claim (Nomad's denormalization).
        others = [
            Claim(*r)
            for r in self._db.execute(
                f"SELECT {_CLAIM_COLUMNS} FROM volume_claims WHERE namespace=? AND volume_id=? AND alloc_id != ? "
                f"AND {_LIVE}",
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
        if mine is not None:
            return  # idempotent: this alloc holds it already (its detail is kept)
        self._db.execute(
            f"INSERT INTO volume_claims ({_CLAIM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, '', 0, 0, ?)",
            (claim.namespace, claim.volume_id, claim.alloc_id, claim.job, claim.mode, claim.access_mode,
             claim.attachment_mode, TAKEN, claim.detail, time.time()),
        )  # fmt: skip

    def set_detail(self, volume_id: str, namespace: str, alloc_id: str, detail: ClaimDetail) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE volume_claims SET detail=?, updated=? WHERE namespace=? AND volume_id=? AND alloc_id=?",
                (detail.to_json(), time.time(), namespace, volume_id, alloc_id),
            )

    def set_claim_state(
        self, volume_id: str, namespace: str, alloc_id: str, state: str, *, only_from: tuple[str, ...] = ()
    ) -> bool:
        """Move a claim to ``state`` (only from one of ``only_from`` when given); False if it did not move."""
        query = "UPDATE volume_claims SET state=?, updated=? WHERE namespace=? AND volume_id=? AND alloc_id=?"
        params: tuple[object, ...] = (state, time.time(), namespace, volume_id, alloc_id)
        if only_from:
            query += f" AND state IN ({', '.join('?' for _ in only_from)})"
            params += only_from
        with self._lock:
            moved = self._db.execute(query, params).rowcount
        return bool(moved)

    def claim_failed(self, volume_id: str, namespace: str, alloc_id: str, error: str, backoff: float) -> None:
        """Record why a release step failed and when the watcher tries again."""
        with self._lock:
            self._db.execute(
                "UPDATE volume_claims SET last_error=?, attempts=attempts+1, next_attempt=?, updated=? "
                "WHERE namespace=? AND volume_id=? AND alloc_id=?",
                (error, time.time() + backoff, time.time(), namespace, volume_id, alloc_id),
            )

    def release(self, volume_id: str, namespace: str, alloc_id: str) -> None:
        """Free a claim: the last step of its release (or undoing one that mounted nothing)."""
        with self._lock:
            self._db.execute(
                "DELETE FROM volume_claims WHERE namespace=? AND volume_id=? AND alloc_id=?",
                (namespace, volume_id, alloc_id),
            )


def claims_refusal(store: VolumeStore, volume_id: str, held: builtins.list[Claim], doing: str) -> str:
    """Why a claimed volume cannot be deleted or deregistered, and what to do: stop the jobs of
    live claims; a claim whose allocation is over only waits for its release."""
    live = [c for c in held if c.state == TAKEN and not store.alloc_terminal(c.alloc_id)]
    past = ", ".join(f"alloc {c.alloc_id[:8]} of job {c.job}" for c in held if c not in live)
    release = (
        f"the volume watcher of a run with its plugin releases them, or `driversdk volume detach {volume_id}` does now"
    )
    if not live:
        return (
            f'volume "{volume_id}" still has past claims ({past}: their allocations are over) being released; '
            f"{release}; {doing} it works once they are released"
        )
    users = ", ".join(f"alloc {c.alloc_id[:8]} of job {c.job} ({claim_state_text(c)})" for c in live)
    text = f'volume "{volume_id}" is claimed by {users}; stop those jobs before {doing} it'
    return text + (f" (its past claims of {past} are being released: {release})" if past else "")


def _next_release_step(claim: Claim) -> str:
    """The release step a past claim waits for. A node-side release unpublishes, then unstages
    when it was the last use: once its publish target is gone (the plugin unpublished it and
    the target was removed) the step left is the unstage."""
    if claim.state != UNPUBLISHING:
        return "controller unpublish"
    detail = claim.details()
    if detail.requires_staging and detail.source and not os.path.lexists(detail.source):
        return "node unstage"
    return "node unpublish"


def claim_state_text(claim: Claim) -> str:
    """How ``volume status`` names a claim's state: in use, past (waiting to be released), or
    being released, with the next step and the last error."""
    if claim.state == TAKEN:
        return "in use"
    step = _next_release_step(claim)
    text = f"past, being released (next: {step})"
    if claim.last_error:
        text += f"; last error: {claim.last_error}"
    return text
