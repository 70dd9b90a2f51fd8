"""Static and dynamic ports that cannot capture the host's traffic.

The attacker's job asks for a static port a host service already holds (a DNS stub's UDP socket on
127.0.0.53, a TCP listener on ::1 only), forwards a bridge group's port and expects the host's own
queries to 127.0.0.1 to reach it, races a second `driversdk run` (another data dir) for the same
port, or writes a port number outside 1-65535. Only loopback, this machine's own addresses and
the namespaces the runs make are ever addressed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from driversdk.agent import nodeattrs
from driversdk.agent.allocrunner import portalloc
from driversdk.jobspec.job import Group, Port
from tests.agent.csienv import Env, make_env, wait_for_line
from tests.agent.netjobs import no_forwarding_rules, stop, web_job

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="iptables, namespaces and /run/driversdk: root only")


def bound(family: int, kind: int, address: str, port: int = 0) -> socket.socket:
    sock = socket.socket(family, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a DNS stub sets it
    sock.bind((address, port))
    if kind == socket.SOCK_STREAM:
        sock.listen()
    return sock


def refused_static(port: int) -> str:
    group = Group("web", ports=[Port("dns", static=port)])
    with pytest.raises(portalloc.PortUnavailable) as err:
        portalloc.allocate("alloc-attacker", "j", group, 20000, 32000, "192.0.2.9")
    assert not any(owner == "alloc-attacker" for owner in portalloc._held.values())
    return str(err.value)


def test_a_host_udp_socket_on_127_0_0_53_makes_the_static_port_refused() -> None:
    with bound(socket.AF_INET, socket.SOCK_DGRAM, "127.0.0.53") as stub:
        port = stub.getsockname()[1]
        message = refused_static(port)
    assert message == (
        f'job "j" group "web": static port {port} (port "dns") is already in use on this host (a UDP socket on '
        f'127.0.0.53 holds it); stop what holds it, or make the port dynamic (port "dns" {{}})'
    )


def test_a_host_tcp_listener_on_ipv6_loopback_makes_the_static_port_refused() -> None:
    with bound(socket.AF_INET6, socket.SOCK_STREAM, "::1") as listener:
        port = listener.getsockname()[1]
        message = refused_static(port)
    assert message == (
        f'job "j" group "web": static port {port} (port "dns") is already in use on this host (a TCP socket on '
        f'[::1] holds it); stop what holds it, or make the port dynamic (port "dns" {{}})'
    )


def test_dynamic_ports_skip_what_host_sockets_of_any_address_hold() -> None:
    for low in range(43000, 60000, 7):
        try:
            udp = bound(socket.AF_INET, socket.SOCK_DGRAM, "127.0.0.53", low)
        except OSError:
            continue
        try:
            tcp = bound(socket.AF_INET6, socket.SOCK_STREAM, "::1", low + 1)
        except OSError:
            udp.close()
            continue
        break
    with udp, tcp:
        group = Group("web", ports=[Port("a")])
        with pytest.raises(portalloc.PortUnavailable) as err:
            portalloc.allocate("alloc-dyn", "j", group, low, low + 1, "192.0.2.9")
    assert str(err.value).startswith(
        f'job "j" group "web": no free dynamic port for port "a" in the client\'s range {low}-{low + 1}; '
    )
    assert not any(owner == "alloc-dyn" for owner in portalloc._held.values())


# --- a bridge group's forwarded port never takes the host's loopback traffic --------------------

SERVER = """
    task "server" {
      driver = "exec"
      kill_timeout = "1s"
      template {
        destination = "local/serve.py"
        data = <<EOF
import socket, threading
def tcp():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(('0.0.0.0', 8080))
    s.listen()
    while True:
        c, _ = s.accept()
        c.sendall(b'task')
        c.close()
threading.Thread(target=tcp, daemon=True).start()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(('0.0.0.0', 8080))
while True:
    _, peer = u.recvfrom(100)
    u.sendto(b'task', peer)
EOF
      }
      config {
        command = "PYTHON"
        args    = ["local/serve.py"]
      }
    }"""


def free_port() -> int:
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("0.0.0.0", 0))
        port = int(tcp.getsockname()[1])
        udp.bind(("0.0.0.0", port))
        return port


def tcp_answer(address: str, port: int) -> bytes:
    with socket.create_connection((address, port), timeout=5) as conn:
        return conn.recv(100)


def wait_for_task(address: str, port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if tcp_answer(address, port) == b"task":
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the task never answered on {address}:{port}")
        time.sleep(0.3)


@pytest.fixture
def env(engine: docker.DockerClient, short_dir: Path) -> Env:
    return make_env(engine, short_dir / "a")


def test_the_hosts_loopback_traffic_to_a_forwarded_port_never_reaches_the_task(env: Env) -> None:
    static = free_port()
    network = f'      mode = "bridge"\n      port "dns" {{\n        static = {static}\n        to = 8080\n      }}'
    job = web_job(env, "capture", network, SERVER.replace("PYTHON", os.path.realpath(sys.executable)))
    proc = env.start(job)
    try:
        wait_for_line(proc, '==> task "server" started')
        host = nodeattrs.host_ip()
        assert host and not host.startswith("127.")
        # The host's own address reaches the task, over TCP and UDP.
        wait_for_task(host, static)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.settimeout(10)
            client.sendto(b"q", (host, static))
            assert client.recvfrom(100)[0] == b"task"
        # 127.0.0.1 is the host's: nothing listens there, so the connection is refused.
        with pytest.raises(ConnectionRefusedError):
            tcp_answer("127.0.0.1", static)
        # A DNS stub started on 127.0.0.53 after the allocation gets its own queries.
        with bound(socket.AF_INET, socket.SOCK_DGRAM, "127.0.0.53", static) as stub:
            stub.settimeout(10)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
                client.settimeout(10)
                client.sendto(b"query", ("127.0.0.53", static))
                data, peer = stub.recvfrom(100)
                assert data == b"query"
                stub.sendto(b"stub", peer)
                assert client.recvfrom(100)[0] == b"stub"
        rules = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True).stdout
        assert f"-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j {portalloc.NAT_CHAIN}" in rules, rules
    finally:
        stop(proc)
    env.assert_clean()
    no_forwarding_rules()


# --- two runs on two data dirs ------------------------------------------------------------------

SLEEPER = """
    task "sleeper" {
      driver = "exec"
      kill_timeout = "1s"
      config {
        command = "/bin/busybox"
        args    = ["sleep", "300"]
      }
    }"""


def test_two_runs_on_two_data_dirs_never_get_the_same_static_port(engine: docker.DockerClient, short_dir: Path) -> None:
    first_env, second_env = make_env(engine, short_dir / "a"), make_env(engine, short_dir / "b")
    static = free_port()
    network = f'      port "http" {{\n        static = {static}\n      }}'
    jobs = [web_job(e, "twice", network, SLEEPER) for e in (first_env, second_env)]
    procs = [e.start(j) for e, j in zip((first_env, second_env), jobs, strict=True)]
    outs: list[str] = []
    try:
        # Both start at once; the one that is refused exits on its own, the other runs its task.
        deadline = time.monotonic() + 180
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        refused = [p for p in procs if p.poll() is not None]
        assert len(refused) == 1, "both runs kept running with the same static port"
        running = next(p for p in procs if p is not refused[0])
        out, err = refused[0].communicate(timeout=60)
        assert refused[0].returncode == 2, out + err  # refused by the allocation's port hook
        assert f'static port {static} (port "http") is already in use on this host (another driversdk run ' in (
            out + err
        ), out + err
        assert "Traceback" not in out + err
        wait_for_line(running, '==> task "sleeper" started')
    finally:
        for proc in procs:
            if proc.poll() is None:
                outs.append(stop(proc))
    first_env.assert_clean()
    second_env.assert_clean()


# --- port numbers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("70000", 'network.port "http".static: 70000 is not a port number (1-65535); use a port in that range'),
        ("-5", 'network.port "http".static: -5 is not a port number (1-65535); use a port in that range'),
    ],
)
def test_a_static_port_out_of_range_is_refused_at_validate(env: Env, value: str, message: str) -> None:
    network = f'      port "http" {{\n        static = {value}\n      }}'
    job = web_job(env, "range", network, SLEEPER)
    checked = env.cli("validate", str(job), "--client", str(env.client))
    assert checked.returncode == 1 and f'group "web": {message}' in checked.stdout, checked.stdout + checked.stderr
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stdout + done.stderr and "Traceback" not in done.stdout + done.stderr
    assert not (env.data / "allocs").exists()
    env.assert_clean()


def test_a_port_the_client_reserves_is_refused_and_never_handed_out(env: Env) -> None:
    with env.client.open("r+") as fh:
        text = fh.read().replace("client {", 'client {\n  reserved {\n    reserved_ports = "22,80,8500-8600"\n  }', 1)
        fh.seek(0)
        fh.write(text)
    network = '      port "http" {\n        static = 8501\n      }'
    job = web_job(env, "reserved", network, SLEEPER)
    sentence = (
        'static port 8501 (port "http") is reserved by the client config (client.reserved.reserved_ports '
        '"22,80,8500-8600"); use another static port or a dynamic one'
    )
    checked = env.cli("validate", str(job), "--client", str(env.client))
    assert checked.returncode == 1 and sentence in checked.stdout, checked.stdout + checked.stderr
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 2 and sentence in done.stdout + done.stderr, done.stdout + done.stderr
    assert not (env.data / "allocs").exists()
    env.assert_clean()


def test_a_malformed_reserved_ports_list_is_refused_with_a_sentence(tmp_path: Path) -> None:
    from driversdk.jobspec.clientconfig import load_client
    from driversdk.jobspec.problems import ValidationFailed

    config = tmp_path / "client.hcl"
    config.write_text('client {\n  reserved {\n    reserved_ports = "22,80-70000"\n  }\n}\n')
    with pytest.raises(ValidationFailed) as err:
        load_client(config)
    assert (
        'client.reserved.reserved_ports must be ports and ranges of 1-65535 in quotes, such as "22,80,8500-8600", '
        'not "22,80-70000"' in str(err.value)
    )
    config.write_text('client {\n  reserved {\n    reserved_ports = "22, 8500-8502"\n    cpu = 500\n  }\n}\n')
    loaded = load_client(config)
    assert loaded.reserved_ports == frozenset({22, 8500, 8501, 8502})
    assert any("client.reserved.cpu" in note for note in loaded.notes)
