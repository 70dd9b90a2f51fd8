"""The hostpath plugin's shared state and rules.

Honest to the spec (v1.x): it advertises what it implements — ``CONTROLLER_CAPABILITIES`` and
``NODE_CAPABILITIES``, the spec's alpha ones only with ``--alpha`` (see ``Advertised``), and an
RPC whose capability is not advertised answers UNIMPLEMENTED — checks every
required argument before any lookup (INVALID_ARGUMENT), answers each documented error code, and
every call is idempotent. Each RPC's shared preamble is ``rpc.py``; the identity service lives in
``identity.py``, the controller service in ``controller.py``, the node service in ``node.py``, the
bookkeeping in ``store.py``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

import grpc
from google.protobuf.descriptor import EnumDescriptor

from driversdk.csi.hostpath.faults import Faults
from driversdk.csi.hostpath.store import Store
from driversdk.pb import csi_pb2

NAME = "hostpath.csi.driversdk.io"
VERSION = "0.1.0"
TOPOLOGY_KEY = "topology.hostpath.csi/node"
MAX_VOLUMES_PER_NODE = 64
# A volume or snapshot id is a directory name: never "." or "..", so it starts with a letter or digit.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# The spec's banned characters in names: control characters other than common whitespace.
_BANNED = re.compile("[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]")
_PAGE_PREFIX = "page:"

_MODE = csi_pb2.VolumeCapability.AccessMode
SUPPORTED_MODES = frozenset(
    {
        _MODE.SINGLE_NODE_WRITER,
        _MODE.SINGLE_NODE_READER_ONLY,
        _MODE.MULTI_NODE_READER_ONLY,
        _MODE.MULTI_NODE_SINGLE_WRITER,
        _MODE.MULTI_NODE_MULTI_WRITER,
    }
)
MULTI_NODE_MODES = frozenset(
    {_MODE.MULTI_NODE_READER_ONLY, _MODE.MULTI_NODE_SINGLE_WRITER, _MODE.MULTI_NODE_MULTI_WRITER}
)

_SERVICE = csi_pb2.PluginCapability.Service
_EXPANSION = csi_pb2.PluginCapability.VolumeExpansion
_CTRL = csi_pb2.ControllerServiceCapability.RPC
_NODE = csi_pb2.NodeServiceCapability.RPC

CONTROLLER_CAPABILITIES = (
    _CTRL.CREATE_DELETE_VOLUME,
    _CTRL.PUBLISH_UNPUBLISH_VOLUME,
    _CTRL.LIST_VOLUMES,
    _CTRL.GET_CAPACITY,
    _CTRL.CREATE_DELETE_SNAPSHOT,
    _CTRL.LIST_SNAPSHOTS,
    _CTRL.CLONE_VOLUME,
    _CTRL.PUBLISH_READONLY,
    _CTRL.EXPAND_VOLUME,
    _CTRL.LIST_VOLUMES_PUBLISHED_NODES,
    _CTRL.GET_VOLUME,
    _CTRL.GET_SNAPSHOT,
)
NODE_CAPABILITIES = (
    _NODE.STAGE_UNSTAGE_VOLUME,
    _NODE.GET_VOLUME_STATS,
    _NODE.EXPAND_VOLUME,
    _NODE.VOLUME_CONDITION,
)

# The RPCs a capability gates: one the plugin does not advertise answers UNIMPLEMENTED.
GATED_RPCS: dict[str, tuple[str, int]] = {
    "CreateVolume": ("controller", _CTRL.CREATE_DELETE_VOLUME),
    "DeleteVolume": ("controller", _CTRL.CREATE_DELETE_VOLUME),
    "ControllerPublishVolume": ("controller", _CTRL.PUBLISH_UNPUBLISH_VOLUME),
    "ControllerUnpublishVolume": ("controller", _CTRL.PUBLISH_UNPUBLISH_VOLUME),
    "ListVolumes": ("controller", _CTRL.LIST_VOLUMES),
    "GetCapacity": ("controller", _CTRL.GET_CAPACITY),
    "CreateSnapshot": ("controller", _CTRL.CREATE_DELETE_SNAPSHOT),
    "DeleteSnapshot": ("controller", _CTRL.CREATE_DELETE_SNAPSHOT),
    "ListSnapshots": ("controller", _CTRL.LIST_SNAPSHOTS),
    "ControllerExpandVolume": ("controller", _CTRL.EXPAND_VOLUME),
    "ControllerGetVolume": ("controller", _CTRL.GET_VOLUME),
    "GetSnapshot": ("controller", _CTRL.GET_SNAPSHOT),
    "NodeStageVolume": ("node", _NODE.STAGE_UNSTAGE_VOLUME),
    "NodeUnstageVolume": ("node", _NODE.STAGE_UNSTAGE_VOLUME),
    "NodeGetVolumeStats": ("node", _NODE.GET_VOLUME_STATS),
    "NodeExpandVolume": ("node", _NODE.EXPAND_VOLUME),
}


def is_alpha(enum: EnumDescriptor, value: int) -> bool:
    """Whether the spec marks an enum value alpha (``alpha_enum_value``): clients built against
    a spec without it (csi-sanity's switch, an older CO) take it for an unknown capability."""
    options = enum.values_by_number[value].GetOptions()
    return bool(options.Extensions[csi_pb2.alpha_enum_value])


def _capability_names(without: Iterable[str]) -> tuple[frozenset[int], frozenset[int]]:
    """Controller and node capabilities named by ``--without``: ``controller.X``, ``node.X`` or a
    bare ``X`` (whichever service has it); raises ValueError for one the plugin does not have."""
    ctrl: set[int] = set()
    node: set[int] = set()
    for item in without:
        role, _, name = item.strip().rpartition(".")
        role, name = role.lower(), name.upper()
        if role not in ("", "controller", "node"):
            raise ValueError(f"capability {item!r}: the service is controller or node, not {role!r}")
        ctrl_cap = _CTRL.Type.Value(name) if name in _CTRL.Type.keys() else None  # noqa: SIM118 - an enum wrapper
        node_cap = _NODE.Type.Value(name) if name in _NODE.Type.keys() else None  # noqa: SIM118
        found = False
        if role in ("", "controller") and ctrl_cap in CONTROLLER_CAPABILITIES:
            ctrl.add(ctrl_cap)
            found = True
        if role in ("", "node") and node_cap in NODE_CAPABILITIES:
            node.add(node_cap)
            found = True
        if not found:
            known = sorted({*(_CTRL.Type.Name(c) for c in CONTROLLER_CAPABILITIES),
                            *(_NODE.Type.Name(c) for c in NODE_CAPABILITIES)})  # fmt: skip
            raise ValueError(f"capability {item!r} is not one this plugin has; it has {', '.join(known)}")
    return frozenset(ctrl), frozenset(node)


@dataclass(frozen=True)
class Advertised:
    """What this plugin process advertises: the GA capabilities it implements, the alpha ones only
    when asked (``--alpha``), less any an operator or test turned off (``--without``)."""

    controller: tuple[csi_pb2.ControllerServiceCapability.RPC.Type.ValueType, ...]
    node: tuple[csi_pb2.NodeServiceCapability.RPC.Type.ValueType, ...]
    plugin: tuple[csi_pb2.PluginCapability, ...]

    @classmethod
    def choose(cls, *, alpha: bool = False, without: Iterable[str] = ()) -> Advertised:
        off_ctrl, off_node = _capability_names(without)
        ctrl = tuple(
            c
            for c in CONTROLLER_CAPABILITIES
            if c not in off_ctrl and (alpha or not is_alpha(_CTRL.Type.DESCRIPTOR, c))
        )
        node = tuple(
            c for c in NODE_CAPABILITIES if c not in off_node and (alpha or not is_alpha(_NODE.Type.DESCRIPTOR, c))
        )
        plugin = [
            csi_pb2.PluginCapability(service=_SERVICE(type=_SERVICE.CONTROLLER_SERVICE)),
            # NodeGetInfo and CreateVolume report topology, which the spec ties to this capability.
            csi_pb2.PluginCapability(service=_SERVICE(type=_SERVICE.VOLUME_ACCESSIBILITY_CONSTRAINTS)),
        ]
        if _CTRL.EXPAND_VOLUME in ctrl or _NODE.EXPAND_VOLUME in node:
            plugin.append(csi_pb2.PluginCapability(volume_expansion=_EXPANSION(type=_EXPANSION.ONLINE)))
        return cls(ctrl, node, tuple(plugin))

    def serves(self, rpc: str) -> bool:
        gate = GATED_RPCS.get(rpc)
        if gate is None:
            return True
        role, capability = gate
        return capability in (self.controller if role == "controller" else self.node)


class HostPathState:
    """What every service shares: the root, this node, the nodes sharing the root, the faults."""

    def __init__(
        self,
        root: str,
        node_id: str,
        faults: Faults,
        peer_nodes: Iterable[str] = (),
        advertised: Advertised | None = None,
        *,
        forget_node_state: bool = False,
    ) -> None:
        self.root = root
        self.volumes = os.path.join(root, "volumes")
        self.snapshots = os.path.join(root, "snapshots")
        self.partial = os.path.join(root, "partial")  # copies being made, renamed into place when whole
        for path in (self.volumes, self.snapshots, self.partial):
            os.makedirs(path, exist_ok=True)
        self.node_id = node_id
        # Other CSI node ids whose node plugins use the same root (a shared file system): the
        # controller may publish to them too. Without peers only this node is known.
        self.nodes = frozenset({node_id, *peer_nodes})
        self.faults = faults
        self.store = Store(root)
        self.advertised = advertised or Advertised.choose()
        # A fault mode: what third-party plugins that keep their node records in memory do after
        # a restart. The records are forgotten once, here; the node service then believes only
        # them (see node.Node), so a mount it no longer knows is left to the CO.
        self.trust_records = forget_node_state
        if forget_node_state:
            with self.store.transaction() as st:
                st.staged.clear()
                st.published.clear()

    def volume_dir(self, volume_id: str) -> str:
        return os.path.join(self.volumes, volume_id)

    def snapshot_dir(self, snapshot_id: str) -> str:
        return os.path.join(self.snapshots, snapshot_id)

    def volume_exists(self, volume_id: str) -> bool:
        return bool(_SAFE_ID.match(volume_id)) and os.path.isdir(self.volume_dir(volume_id))

    def snapshot_exists(self, snapshot_id: str) -> bool:
        return bool(_SAFE_ID.match(snapshot_id)) and os.path.isdir(self.snapshot_dir(snapshot_id))

    def topologies(self) -> list[csi_pb2.Topology]:
        """Where a volume under this root is reachable from: every node sharing the root."""
        return [csi_pb2.Topology(segments={TOPOLOGY_KEY: node}) for node in sorted(self.nodes)]


def fail(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("unreachable")  # pragma: no cover - abort raises


def invalid(context: grpc.ServicerContext, message: str) -> NoReturn:
    fail(context, grpc.StatusCode.INVALID_ARGUMENT, message)


def run_command(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(done.stderr.strip() or f"{args[0]} failed")


# --- argument checks: all of them run before any lookup -----------------------------------------


def require_path(context: grpc.ServicerContext, field: str, path: str, *, required: bool = True) -> None:
    if not path:
        if required:
            invalid(context, f"{field} is required")
        return
    if not os.path.isabs(path):
        invalid(context, f"{field} must be an absolute path, got {path!r}")


def check_capability(context: grpc.ServicerContext, cap: csi_pb2.VolumeCapability, field: str) -> None:
    """INVALID_ARGUMENT for a malformed or unsupported capability (volumes are directories)."""
    if not cap.HasField("access_mode"):
        invalid(context, f"{field}.access_mode is required")
    if not cap.HasField("mount") and not cap.HasField("block"):
        invalid(context, f"{field}.access_type is required: set mount (block is not supported)")
    if cap.HasField("block"):
        invalid(context, f"{field}: block access is not supported, hostpath volumes are directories")
    if cap.access_mode.mode not in SUPPORTED_MODES:
        invalid(context, f"{field}: access mode {_MODE.Mode.Name(cap.access_mode.mode)} is not supported")


def capability_problem(cap: csi_pb2.VolumeCapability) -> str:
    """Why a capability cannot be served ("" when it can), for answers that must not fail."""
    if cap.HasField("block"):
        return "hostpath volumes are directories: only file-system access is supported"
    if not cap.HasField("mount"):
        return "a capability needs an access type (mount)"
    if cap.access_mode.mode not in SUPPORTED_MODES:
        return f"access mode {_MODE.Mode.Name(cap.access_mode.mode)} is not supported"
    return ""


def check_name(context: grpc.ServicerContext, name: str, field: str = "name") -> None:
    if not name:
        invalid(context, f"{field} is required")
    if len(name.encode()) > 128:
        invalid(context, f"{field} is longer than the 128 bytes the spec allows")
    if _BANNED.search(name):
        invalid(context, f"{field} contains a control character the spec bans")


def check_range(context: grpc.ServicerContext, rng: csi_pb2.CapacityRange, field: str = "capacity_range") -> None:
    if rng.required_bytes < 0 or rng.limit_bytes < 0:
        invalid(context, f"{field} must not be negative")
    if not rng.required_bytes and not rng.limit_bytes:
        invalid(context, f"{field} needs required_bytes or limit_bytes")
    if rng.limit_bytes and rng.limit_bytes < rng.required_bytes:
        invalid(
            context,
            f"{field}.limit_bytes ({rng.limit_bytes}) is smaller than required_bytes ({rng.required_bytes})",
        )


def check_max_entries(context: grpc.ServicerContext, max_entries: int) -> None:
    if max_entries < 0:
        invalid(context, "max_entries must not be negative")


def capability_key(cap: csi_pb2.VolumeCapability) -> str:
    """A capability as a comparable string (deterministic serialization)."""
    return base64.b64encode(cap.SerializeToString(deterministic=True)).decode()


def capability_of(key: str) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability.FromString(base64.b64decode(key))


def derive_id(name: str, taken: Callable[[str], bool], prefix: str) -> str:
    """The id for a new object: its name when that is a safe, free directory name, else a hash."""
    if _SAFE_ID.match(name) and not taken(name):
        return name
    return f"{prefix}-{hashlib.sha256(name.encode()).hexdigest()[:24]}"


def page(context: grpc.ServicerContext, ids: list[str], max_entries: int, starting_token: str) -> tuple[list[str], str]:
    """One page of sorted ids and the token for the next, or ABORTED for a token we never issued.

    A token names the first id of the next page, so a page survives deletions between calls.
    """
    start = 0
    if starting_token:
        first = starting_token.removeprefix(_PAGE_PREFIX)
        if not starting_token.startswith(_PAGE_PREFIX) or not _SAFE_ID.match(first):
            fail(
                context, grpc.StatusCode.ABORTED, f"invalid starting_token {starting_token!r}: start again without one"
            )
        start = next((i for i, v in enumerate(ids) if v >= first), len(ids))
    end = len(ids) if not max_entries else min(len(ids), start + max_entries)
    token = f"{_PAGE_PREFIX}{ids[end]}" if end < len(ids) else ""
    return ids[start:end], token


def fs_sizes(path: str) -> tuple[int, int]:
    """(total, available) bytes of the file system holding ``path``."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def tree_bytes(path: str) -> int:
    """Bytes used by the regular files under ``path`` (symlinks are not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            total += st.st_size
    return total
