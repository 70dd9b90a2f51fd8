"""A volume of the reference hostpath plugin as tests use it: created through the plugin's
controller, claimed multi-node multi-writer, and the plugin's own count of each RPC it answered."""

from __future__ import annotations

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
