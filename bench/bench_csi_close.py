#!/usr/bin/env python3
"""What closing a CSI client costs: CSIClient.close() after one Probe vs a raw gRPC channel's
close() after the same call, and vs a channel dialled eagerly with channel_ready_future (which
leaves a connectivity poller that close() waits on). Against the hostpath plugin, same run.

Run: python3 bench/bench_csi_close.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.csi.client import CSIClient  # noqa: E402
from driversdk.pb import csi_pb2, csi_pb2_grpc  # noqa: E402


def _channel(socket: str, eager: bool) -> grpc.Channel:
    channel = grpc.insecure_channel(f"unix:{socket}", options=[("grpc.default_authority", "localhost")])
    if eager:
        grpc.channel_ready_future(channel).result(timeout=5)
    return channel


def timed_close(socket: str, kind: str) -> float:
    """Open, make one Probe, then time only the close."""
    if kind == "CSIClient":
        client = CSIClient(socket, plugin="hostpath")
        client.probe()
        close: Callable[[], None] = client.close
    else:
        channel = _channel(socket, eager=kind == "eager channel")
        csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=5)
        close = channel.close
    start = time.perf_counter()
    close()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-csi-close-") as work:
        socket = os.path.join(work, "csi.sock")
        proc = subprocess.Popen(
            [sys.executable, "-m", "driversdk.csi.hostpath", "--endpoint", f"unix://{socket}", "--root", work],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(socket):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the hostpath plugin did not start")
                time.sleep(0.05)
            print(f"close() after one Probe, {args.runs} runs each (median / max, ms)")
            for kind in ("raw channel", "CSIClient", "eager channel"):
                times = [timed_close(socket, kind) for _ in range(args.runs)]
                print(f"  {kind:<14} {statistics.median(times) * 1000:8.3f} {max(times) * 1000:8.3f}")
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
