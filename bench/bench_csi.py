#!/usr/bin/env python3
"""CSI benchmark: stage + publish + unpublish + unstage through our node volume manager vs the
same four RPCs issued directly on the generated stub, against the hostpath plugin, same run.

Run as root: python3 bench/bench_csi.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.agent.csi.manager import NodeVolumeManager, UsageOptions  # noqa: E402
from driversdk.agent.csi.state import StateStore  # noqa: E402
from driversdk.csi.client import CSIClient  # noqa: E402
from driversdk.csi.model import AccessMode, AttachmentMode, Volume, VolumeCapability  # noqa: E402
from driversdk.pb import csi_pb2  # noqa: E402

USAGE = UsageOptions(AccessMode.MULTI_NODE_MULTI_WRITER, AttachmentMode.FILE_SYSTEM)


def raw_cycle(client: CSIClient, root: str, volume_id: str, cap: csi_pb2.VolumeCapability) -> float:
    stage = os.path.join(root, "raw-staging")
    target = os.path.join(root, "raw-target")
    start = time.perf_counter()
    os.makedirs(stage, exist_ok=True)
    client.node.NodeStageVolume(
        csi_pb2.NodeStageVolumeRequest(volume_id=volume_id, staging_target_path=stage, volume_capability=cap)
    )
    client.node.NodePublishVolume(
        csi_pb2.NodePublishVolumeRequest(
            volume_id=volume_id, staging_target_path=stage, target_path=target, volume_capability=cap
        )
    )
    client.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target))
    client.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=stage))
    return time.perf_counter() - start


def ours_cycle(manager: NodeVolumeManager, volume: Volume) -> float:
    start = time.perf_counter()
    manager.mount(volume, "bench-alloc", USAGE)
    manager.unmount(volume, "bench-alloc", USAGE)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "plugin", "csi.sock")
        plugin = subprocess.Popen(
            [sys.executable, "-m", "driversdk.csi.hostpath", "--endpoint", f"unix://{sock}", "--root",
             os.path.join(tmp, "root"), "--node-id", "bench"],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            while not os.path.exists(sock):
                time.sleep(0.05)
            client = CSIClient(sock)
            cap = VolumeCapability(USAGE.access_mode, USAGE.attachment_mode).to_proto()
            client.controller.CreateVolume(csi_pb2.CreateVolumeRequest(name="bench", volume_capabilities=[cap]))
            volume = Volume(id="bench", plugin_id="hostpath", external_id="bench")
            manager = NodeVolumeManager(
                client,
                plugin_id="hostpath",
                host_root=os.path.join(tmp, "csi"),
                store=StateStore(os.path.join(tmp, "state.db")),
                requires_staging=True,
            )
            raw_cycle(client, tmp, "bench", cap)
            ours_cycle(manager, volume)
            raw: list[float] = []
            ours: list[float] = []
            for _ in range(args.runs):
                raw.append(raw_cycle(client, tmp, "bench", cap))
                ours.append(ours_cycle(manager, volume))
            r, o = statistics.median(raw), statistics.median(ours)
            print(f"stage+publish+unpublish+unstage, median of {args.runs}:")
            print(f"  raw    four RPCs on the stub        {r * 1000:8.1f} ms")
            print(f"  ours   NodeVolumeManager            {o * 1000:8.1f} ms   ratio {o / r:.2f}")
            per_round = statistics.median(x / y for x, y in zip(ours, raw, strict=True))
            print(f"  median of the per-round ratios (ours / raw, interleaved)  {per_round:.2f}")
            print("  (ours keeps the volume's staging path between cycles, as Nomad does: only a volume's first")
            print("   stage on a node makes it, three mkdirs; each cycle makes and removes the allocation's dirs)")
        finally:
            plugin.terminate()
            plugin.wait(10)


if __name__ == "__main__":
    main()
