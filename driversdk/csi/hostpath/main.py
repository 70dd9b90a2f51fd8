"""``driversdk-csi-hostpath``: run the reference CSI plugin on a unix socket."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from concurrent import futures

import grpc

from driversdk.csi.hostpath.controller import Controller
from driversdk.csi.hostpath.faults import Faults
from driversdk.csi.hostpath.identity import Identity
from driversdk.csi.hostpath.node import Node
from driversdk.csi.hostpath.plugin import Advertised, HostPathState
from driversdk.pb import csi_pb2_grpc

log = logging.getLogger("driversdk.csi.hostpath")


def _socket_path(endpoint: str) -> str:
    path = endpoint.removeprefix("unix://") if endpoint.startswith("unix://") else endpoint
    if not os.path.isabs(path):
        raise SystemExit(f"CSI endpoint {endpoint!r} must be an absolute unix socket path (unix:///path/csi.sock)")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="driversdk-csi-hostpath", description=__doc__)
    parser.add_argument("--endpoint", default=os.environ.get("CSI_ENDPOINT", ""), help="unix:///path/csi.sock")
    parser.add_argument("--root", default=os.environ.get("CSI_HOSTPATH_ROOT", "/var/lib/driversdk-csi-hostpath"))
    parser.add_argument("--node-id", default=os.environ.get("CSI_NODE_ID", socket.gethostname()))
    parser.add_argument(
        "--peer-node-id",
        action="append",
        default=[p for p in os.environ.get("CSI_HOSTPATH_PEER_NODES", "").split(",") if p],
        help="another CSI node id whose node plugin shares this root; the controller publishes to it too",
    )
    parser.add_argument("--fault", default=os.environ.get("CSI_HOSTPATH_FAULTS", ""), help="e.g. Probe=UNAVAILABLE:2")
    parser.add_argument(
        "--call-log", default=os.environ.get("CSI_HOSTPATH_CALL_LOG", ""), help="a file to append each RPC's name to"
    )
    parser.add_argument(
        "--call-times",
        action="store_true",
        default=os.environ.get("CSI_HOSTPATH_CALL_TIMES", "") not in ("", "0", "false"),
        help="add each call's wall-clock time to the call log, and a line when the socket starts listening",
    )
    parser.add_argument(
        "--forget-node-state",
        action="store_true",
        default=os.environ.get("CSI_HOSTPATH_FORGET_NODE_STATE", "") not in ("", "0", "false"),
        help="behave like a plugin that keeps its node records in memory: forget every staging and publish "
        "record at start, and trust the records alone (an unknown path is answered OK and left mounted)",
    )
    parser.add_argument(
        "--alpha",
        action="store_true",
        default=os.environ.get("CSI_HOSTPATH_ALPHA", "") not in ("", "0", "false"),
        help="also advertise the spec's alpha capabilities it implements (GET_VOLUME, GET_SNAPSHOT, node "
        "VOLUME_CONDITION); clients built against an older spec reject them as unknown",
    )
    parser.add_argument(
        "--without",
        action="append",
        default=[c for c in os.environ.get("CSI_HOSTPATH_WITHOUT", "").split(",") if c.strip()],
        help="do not advertise (nor serve) this capability, e.g. LIST_SNAPSHOTS or node.EXPAND_VOLUME",
    )
    args = parser.parse_args(argv)
    try:
        advertised = Advertised.choose(alpha=args.alpha, without=args.without)
    except ValueError as err:
        raise SystemExit(f"--without / CSI_HOSTPATH_WITHOUT: {err}") from None
    if not args.endpoint:
        raise SystemExit("set --endpoint or CSI_ENDPOINT to unix:///path/to/csi.sock")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    path = _socket_path(args.endpoint)
    # A plugin killed hard leaves its socket behind; a restart must clear it before listening.
    if os.path.exists(path):
        os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    faults = Faults(args.fault, args.call_log, args.call_times)
    state = HostPathState(
        args.root, args.node_id, faults, args.peer_node_id, advertised,
        forget_node_state=args.forget_node_state,
    )  # fmt: skip
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    csi_pb2_grpc.add_IdentityServicer_to_server(Identity(state), server)
    # RPCs the plugin does not advertise (ControllerModifyVolume) keep grpc's default answer,
    # UNIMPLEMENTED; the stubs declare it abstract, hence the ignore. The GroupController and
    # SnapshotMetadata services are not served at all, which also answers UNIMPLEMENTED.
    csi_pb2_grpc.add_ControllerServicer_to_server(Controller(state), server)  # type: ignore[abstract]
    csi_pb2_grpc.add_NodeServicer_to_server(Node(state), server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    os.chmod(path, 0o600)
    faults.listening()
    log.info("hostpath CSI plugin listening on %s (node %s)", path, args.node_id)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(1).wait()
    if os.path.exists(path):
        os.unlink(path)


if __name__ == "__main__":
    main()
