"""A volume of the reference hostpath plugin as tests use it: created through the plugin's
controller, claimed multi-node multi-writer, the plugin's own count of each RPC it answered, and the
plugin's mount tree as a test reads it (every path, and what the last unmount keeps)."""

from __future__ import annotations

import os
from pathlib import Path

from driversdk.agent.csi.manager import UsageOptions
from driversdk.csi.client import CSIClient
from driversdk.csi.model import AccessMode, AttachmentMode, Secrets, Volume, VolumeCapability
from driversdk.pb import csi_pb2

MULTI = UsageOptions(AccessMode.MULTI_NODE_MULTI_WRITER, AttachmentMode.FILE_SYSTEM)


def calls(client: CSIClient, rpc: str) -> int:
    """How many times the reference plugin has answered ``rpc`` (its manifest counts them)."""
    return int(client.plugin_info().manifest.get(f"calls.{rpc}", "0"))


def make_volume(client: CSIClient, name: str = "vol1") -> Volume:
    """A volume created on the reference plugin, as the agent registers it (multi-node multi-writer)."""
    cap = VolumeCapability(AccessMode.MULTI_NODE_MULTI_WRITER, AttachmentMode.FILE_SYSTEM).to_proto()
    resp = client.controller.CreateVolume(csi_pb2.CreateVolumeRequest(name=name, volume_capabilities=[cap]))
    return Volume(
        id=f"nomad-{name}",
        plugin_id="hostpath",
        external_id=resp.volume.volume_id,
        context=dict(resp.volume.volume_context),
        capabilities=[VolumeCapability(AccessMode.MULTI_NODE_MULTI_WRITER, AttachmentMode.FILE_SYSTEM)],
        secrets=Secrets(token="s3cret"),
    )


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative, sorted; symlinks listed, never followed."""
    found = []
    for top, dirs, files in os.walk(root):
        found += [os.path.relpath(os.path.join(top, name), root) for name in dirs + files]
    return sorted(found)


def kept_stage(volume: Volume, usage: UsageOptions, namespace: str = "default") -> list[str]:
    """What a plugin's mount tree holds after the last unmount of a volume: the layout dirs and
    the volume's staging path (empty, no mount), kept for its next stage, as Nomad keeps it."""
    return ["per-alloc", "staging", f"staging/{namespace}", f"staging/{namespace}/{volume.id}",
            f"staging/{namespace}/{volume.id}/{usage.key}"]  # fmt: skip
