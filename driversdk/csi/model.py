"""The CSI volume model as a node sees it: ids, capabilities, mount options, secrets.

Secrets and mount flags never appear in a repr or a log line; capability names map to the
CSI enums exactly as Nomad maps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from driversdk.errors import ConfigError
from driversdk.pb import csi_pb2

REDACTED = "[REDACTED]"


class AccessMode(Enum):
    SINGLE_NODE_READER_ONLY = "single-node-reader-only"
    SINGLE_NODE_WRITER = "single-node-writer"
    MULTI_NODE_READER_ONLY = "multi-node-reader-only"
    MULTI_NODE_SINGLE_WRITER = "multi-node-single-writer"
    MULTI_NODE_MULTI_WRITER = "multi-node-multi-writer"

    @classmethod
    def parse(cls, text: str) -> AccessMode:
        for mode in cls:
            if mode.value == text:
                return mode
        raise ConfigError(f"unknown volume access mode: {text!r}; use one of {', '.join(m.value for m in cls)}")

    @property
    def csi(self) -> int:
        return int(getattr(csi_pb2.VolumeCapability.AccessMode, self.name))

    @property
    def read_only(self) -> bool:
        return self.value.endswith("reader-only")


class AttachmentMode(Enum):
    FILE_SYSTEM = "file-system"
    BLOCK_DEVICE = "block-device"

    @classmethod
    def parse(cls, text: str) -> AttachmentMode:
        for mode in cls:
            if mode.value == text:
                return mode
        raise ConfigError(f"unknown volume attachment mode: {text!r}; use file-system or block-device")


@dataclass(frozen=True)
class MountOptions:
    fs_type: str = ""
    mount_flags: tuple[str, ...] = field(default=(), repr=False)

    def __repr__(self) -> str:
        flags = f"[{REDACTED}]" if self.mount_flags else "nil"
        return f"MountOptions(fs_type={self.fs_type!r}, mount_flags={flags})"

    __str__ = __repr__

    def merged(self, request: MountOptions | None) -> MountOptions:
        """A request's options on top of the volume's: fs_type wins when set, flags replace."""
        if request is None:
            return self
        return MountOptions(
            fs_type=request.fs_type or self.fs_type,
            mount_flags=request.mount_flags if request.mount_flags else self.mount_flags,
        )


class Secrets(dict[str, str]):
    """CSI secrets: passed to the plugin untouched, never printed."""

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {REDACTED!r}" for k in sorted(self)) + "}"

    __str__ = __repr__


@dataclass(frozen=True)
class VolumeCapability:
    access_mode: AccessMode
    attachment_mode: AttachmentMode
    mount_options: MountOptions | None = None

    def to_proto(self) -> csi_pb2.VolumeCapability:
        cap = csi_pb2.VolumeCapability(
            access_mode=csi_pb2.VolumeCapability.AccessMode(
                mode=csi_pb2.VolumeCapability.AccessMode.Mode.ValueType(self.access_mode.csi)
            )
        )
        if self.attachment_mode is AttachmentMode.BLOCK_DEVICE:
            cap.block.CopyFrom(csi_pb2.VolumeCapability.BlockVolume())  # set even though empty
        else:
            opts = self.mount_options or MountOptions()
            cap.mount.CopyFrom(
                csi_pb2.VolumeCapability.MountVolume(fs_type=opts.fs_type, mount_flags=list(opts.mount_flags))
            )
        return cap

    def usage(self, read_only: bool) -> str:
        """The usage key of staging/publish paths, e.g. ``rw-file-system-single-node-writer``."""
        return f"{'ro' if read_only else 'rw'}-{self.attachment_mode.value}-{self.access_mode.value}"


@dataclass(frozen=True)
class TopologyRequest:
    """A volume file's ``topology_request``: where the volume must (required) or should
    (preferred) be reachable from; each entry is one topology's segments."""

    required: tuple[dict[str, str], ...] = ()
    preferred: tuple[dict[str, str], ...] = ()


def topology_reachable(volume_topologies: list[dict[str, str]], node_segments: dict[str, str]) -> bool:
    """Nomad's scheduler rule: a volume with topologies is usable on a node whose plugin topology
    contains every segment of at least one of them; a volume without any is usable everywhere."""
    if not volume_topologies:
        return True
    return any(all(node_segments.get(k) == v for k, v in t.items()) for t in volume_topologies)


@dataclass
class Volume:
    """A registered CSI volume. ``id`` names it here; ``external_id`` is what the plugin knows."""

    id: str
    plugin_id: str
    namespace: str = "default"
    name: str = ""
    external_id: str = ""
    capabilities: list[VolumeCapability] = field(default_factory=list)
    mount_options: MountOptions | None = None
    secrets: Secrets = field(default_factory=Secrets)
    parameters: dict[str, str] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)
    # What `volume create` asks for (capacity in bytes, 0 = unset; a content source) ...
    capacity_min: int = 0
    capacity_max: int = 0
    snapshot_id: str = ""
    clone_id: str = ""
    requested_topologies: TopologyRequest = field(default_factory=lambda: TopologyRequest())
    # ... and what the plugin reported (or registration stated): size, where it is reachable.
    capacity: int = 0
    topologies: list[dict[str, str]] = field(default_factory=list)

    @property
    def remote_id(self) -> str:
        """The id sent at the RPC boundary: the external id if set, else ours."""
        return self.external_id or self.id
