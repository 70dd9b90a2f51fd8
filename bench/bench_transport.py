#!/usr/bin/env python3
"""Transport benchmarks, each beside its floor measured in the same run.

1. Plugin launch to first answered RPC (health Check) vs `python -c "import grpc"`.
2. Unary RPC round trip over the plugin's unix socket vs a bare gRPC echo server on a unix socket.

Run: python3 bench/bench_transport.py [--launches N] [--calls N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.plugin.host import launch_plugin  # noqa: E402

BARE = [sys.executable, str(ROOT / "tests" / "sdk" / "plugins" / "bare_plugin.py")]
HELLO = [sys.executable, str(ROOT / "examples" / "hello_driver.py")]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def time_import_floor() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import grpc"], check=True)
    return time.perf_counter() - start


def time_launch(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = launch_plugin(cmd, name="bench")
    health_pb2_grpc.HealthStub(proc.channel).Check(health_pb2.HealthCheckRequest(service="plugin"), timeout=30)
    elapsed = time.perf_counter() - start
    proc.kill()
    return elapsed


def _echo_server(path: str) -> grpc.Server:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


def time_calls(fn: object, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=10)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    # An installed package has bytecode; a checkout run with PYTHONDONTWRITEBYTECODE would
    # recompile our modules at every launch and measure the compiler, not the plugin.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "compileall",
            "-q",
            str(ROOT / "driversdk"),
            str(ROOT / "examples"),
            str(ROOT / "tests" / "sdk" / "plugins"),
        ],
        check=True,
        capture_output=True,
    )

    floor, bare, hello = [], [], []
    for _ in range(args.launches):  # interleaved so drift hits all three alike
        floor.append(time_import_floor())
        bare.append(time_launch(BARE))
        hello.append(time_launch(HELLO))
    print(f"launch -> first RPC, median of {args.launches}:")
    print(f"  floor  python -c 'import grpc'      {median_ms(floor):8.1f} ms")
    print(f"  ours   bare go-plugin server        {median_ms(bare):8.1f} ms   ratio {median(bare) / median(floor):.2f}")
    print(
        f"  ours   hello driver (full SDK)      {median_ms(hello):8.1f} ms   ratio {median(hello) / median(floor):.2f}"
    )

    with tempfile.TemporaryDirectory() as tmp:
        server = _echo_server(f"{tmp}/echo.sock")
        channel = grpc.insecure_channel(f"unix:{tmp}/echo.sock")
        echo = channel.unary_unary("/bench.Echo/Echo")
        payload = b"x" * 16
        time_calls(lambda: echo(payload, timeout=10), 200)
        raw = time_calls(lambda: echo(payload, timeout=10), args.calls)
        channel.close()
        server.stop(0)

    proc = launch_plugin(BARE, name="bench")
    stub = health_pb2_grpc.HealthStub(proc.channel)
    req = health_pb2.HealthCheckRequest(service="plugin")
    time_calls(lambda: stub.Check(req, timeout=10), 200)
    ours = time_calls(lambda: stub.Check(req, timeout=10), args.calls)
    proc.kill()
    print(f"unary round trip over a unix socket, median of {args.calls}:")
    print(f"  floor  bare grpc echo server        {median_ms(raw) * 1000:8.1f} us")
    print(
        f"  ours   plugin health Check          {median_ms(ours) * 1000:8.1f} us"
        f"   ratio {median(ours) / median(raw):.2f}"
    )


def median(samples: list[float]) -> float:
    return statistics.median(samples)


if __name__ == "__main__":
    main()
