"""A host "beyond this one" for egress tests, built on this machine: a network namespace joined to
the host by a veth pair on a /30 of its own, with no route back to any bridge subnet, running a
tiny HTTP server that answers with the address it saw the request come from.

A task in a bridge-mode group reaches it only if the host forwards its traffic and masquerades
it (the server could not answer the task's own address); the answer then names the host's end of
the veth, which is what proves the masquerade.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

SERVER = textwrap.dedent(
    """
    import socket, sys
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(sys.argv[1])))
    server.listen()
    print("ready", flush=True)
    while True:
        conn, (peer, _) = server.accept()
        with conn:
            conn.settimeout(10)
            try:
                conn.recv(65536)
            except OSError:
                continue
            body = f"seen-from {peer}\\n".encode()
            conn.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body)
    """
)


@dataclass(frozen=True)
class Outside:
    address: str  # the server, in its own namespace
    port: int
    host_side: str  # the host's end of the veth: what a masqueraded request comes from

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"

    def request_script(self, timeout: int = 20) -> str:
        """A shell line that asks the server and prints its answer (busybox nc: the static
        busybox's wget crashes resolving even a literal address)."""
        return f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w {timeout} {self.address} {self.port}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def outside_host(port: int = 8080) -> Iterator[Outside]:
    suffix = secrets.token_hex(3)
    ns, host_if, ns_if = f"dsxout-{suffix}", f"dsxo{suffix}", f"dsxi{suffix}"
    # A /30 of TEST-NET-2 (RFC 5737), picked at random so parallel runs do not meet.
    base = 4 * secrets.randbelow(64)
    host_side, address = f"198.51.100.{base + 1}", f"198.51.100.{base + 2}"
    server: subprocess.Popen[str] | None = None
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
        _ip("addr", "add", f"{host_side}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", ns, "addr", "add", f"{address}/30", "dev", ns_if)
        _ip("-n", ns, "link", "set", ns_if, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", SERVER, str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready", server.stderr.read() if server.stderr else ""
        yield Outside(address, port, host_side)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
