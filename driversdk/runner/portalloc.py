"""Group network ports on this host: static ports checked free, dynamic ones picked from the
client's range (``min_dynamic_port`` / ``max_dynamic_port``), and, for bridge groups, forwarding
from the host port to the group namespace's address and ``to`` port as Nomad's CNI ``portmap``
plugin does it.

Forwarding is iptables, in chains of our own so nothing else's rules are touched:

- ``nat DSDK-PORTMAP`` (jumped to from PREROUTING and OUTPUT for local destinations): one DNAT
  rule per port and protocol, host port → ``address:to``;
- ``nat DSDK-PORTMAP-MASQ`` (from POSTROUTING): traffic the host sends from 127.0.0.0/8 is
  masqueraded, so ``curl 127.0.0.1:<port>`` on the host works (with ``route_localnet`` on the
  interface that leads to the namespace, as portmap sets it);
- ``filter DSDK-PORTMAP-FWD`` (from FORWARD): forwarded traffic to the port is accepted (an
  engine may have set FORWARD's policy to DROP).

Every rule carries the comment ``driversdk alloc <id>``; :func:`unforward` removes the
allocation's rules (after a killed run too: they are found by that comment) and the chains and
jumps once no rule is left in them.
"""

from __future__ import annotations

import errno
import ipaddress
import random
import socket
import subprocess
import threading
from collections.abc import Iterable, Sequence

from driversdk.errors import ConfigError, DriverSDKError
from driversdk.runner.jobspec import Group
from driversdk.runner.taskenv import PortValue

NAT_CHAIN = "DSDK-PORTMAP"
MASQ_CHAIN = "DSDK-PORTMAP-MASQ"
FWD_CHAIN = "DSDK-PORTMAP-FWD"
# (table, chain, built-in chain jumping to it, match of the jump)
_JUMPS = [
    ("nat", NAT_CHAIN, "PREROUTING", ["-m", "addrtype", "--dst-type", "LOCAL"]),
    ("nat", NAT_CHAIN, "OUTPUT", ["-m", "addrtype", "--dst-type", "LOCAL"]),
    ("nat", MASQ_CHAIN, "POSTROUTING", []),
    ("filter", FWD_CHAIN, "FORWARD", []),
]
PROTOCOLS = ("tcp", "udp")


class PortUnavailable(ConfigError):
    """A static port is taken, or no dynamic port is free."""


class ForwardingFailed(DriverSDKError):
    """iptables refused a rule."""


# Ports this process has handed to allocations, by port: a port given to one allocation is not
# free for the next one even before anything listens on it.
_held: dict[int, str] = {}
_lock = threading.RLock()


def _bindable(port: int) -> bool:
    """Whether nothing on the host holds ``port`` (TCP or UDP, any address)."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError as err:
                if err.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
                raise
    return True


def _forwarded() -> set[int]:
    """Host ports another run forwards to a bridge group (nothing listens on them on the host)."""
    out: set[int] = set()
    for line in _rules("nat", NAT_CHAIN):
        parts = line.split()
        if "--dport" in parts:
            out.add(int(parts[parts.index("--dport") + 1]))
    return out


def _taken(port: int, forwarded: set[int]) -> str | None:
    if port in _held:
        return f"allocation {_held[port][:8]} of this run holds it"
    if port in forwarded:
        return "another driversdk run forwards it to a bridge group"
    if not _bindable(port):
        return "a process on this host listens on it"
    return None


def allocate(alloc_id: str, job: str, group: Group, low: int, high: int, host_ip: str) -> list[PortValue]:
    """The group's ports for one allocation; raises :class:`PortUnavailable` (holding nothing)."""
    where = f'job "{job}" group "{group.name}"'
    out: list[PortValue] = []
    with _lock:
        forwarded = _forwarded() if group.ports else set()
        try:
            for port in group.ports:
                if not port.static:
                    continue
                why = _taken(port.static, forwarded)
                if why is not None:
                    raise PortUnavailable(
                        f'{where}: static port {port.static} (port "{port.label}") is already in use on this host '
                        f'({why}); stop what holds it, or make the port dynamic (port "{port.label}" {{}})'
                    )
                _held[port.static] = alloc_id
                out.append(PortValue(port.label, port.static, port.to, host_ip))
            for port in group.ports:
                if port.static:
                    continue
                value = _dynamic(low, high, forwarded)
                if value is None:
                    raise PortUnavailable(
                        f'{where}: no free dynamic port for port "{port.label}" in the client\'s range {low}-{high}; '
                        "stop other allocations or widen client.min_dynamic_port/max_dynamic_port"
                    )
                _held[value] = alloc_id
                # Nomad: a dynamic port without `to` is the same port inside; `to = -1` also means that.
                out.append(PortValue(port.label, value, port.to if port.to > 0 else 0, host_ip))
        except BaseException:
            release(alloc_id)
            raise
    return out


def _dynamic(low: int, high: int, forwarded: set[int]) -> int | None:
    candidates = list(range(low, high + 1))
    random.shuffle(candidates)
    for port in candidates[:2000]:
        if _taken(port, forwarded) is None:
            return port
    return None


def hold(alloc_id: str, ports: Iterable[PortValue]) -> None:
    """A recovered allocation's ports, held again in this process."""
    with _lock:
        for port in ports:
            _held[port.value] = alloc_id


def release(alloc_id: str) -> None:
    with _lock:
        for port in [p for p, owner in _held.items() if owner == alloc_id]:
            del _held[port]


# --- forwarding (bridge mode) ------------------------------------------------------------------


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ForwardingFailed(f"iptables {' '.join(args)} failed: {done.stderr.strip() or done.returncode}")
    return done


def _rules(table: str, chain: str) -> list[str]:
    done = _iptables("-t", table, "-S", chain, check=False)
    if done.returncode != 0:
        return []  # no such chain
    return [line for line in done.stdout.splitlines() if line.startswith("-A ")]


def comment(alloc_id: str) -> str:
    return f"driversdk alloc {alloc_id}"


def _ensure_chains() -> None:
    for table, chain, parent, match in _JUMPS:
        _iptables("-t", table, "-N", chain, check=False)  # exists already: fine
        if _iptables("-t", table, "-C", parent, *match, "-j", chain, check=False).returncode != 0:
            _iptables("-t", table, "-I", parent, "1", *match, "-j", chain)


def _device_to(address: str) -> str | None:
    done = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True, check=False)
    parts = done.stdout.split()
    return parts[parts.index("dev") + 1] if "dev" in parts else None


def forward(alloc_id: str, ports: Sequence[PortValue], address: str) -> None:
    """Host port → ``address:to`` for every port; on failure nothing of it is left."""
    ipaddress.ip_address(address)  # refuses anything that is not an address
    tag = comment(alloc_id)
    try:
        with _lock:
            _ensure_chains()
            for port in ports:
                inside = str(port.to or port.value)
                for proto in PROTOCOLS:
                    _iptables("-t", "nat", "-A", NAT_CHAIN, "-p", proto, "--dport", str(port.value), "-m", "comment",
                              "--comment", tag, "-j", "DNAT", "--to-destination", f"{address}:{inside}")  # fmt: skip
                    _iptables("-t", "nat", "-A", MASQ_CHAIN, "-s", "127.0.0.0/8", "-d", address, "-p", proto,
                              "--dport", inside, "-m", "comment", "--comment", tag, "-j", "MASQUERADE")  # fmt: skip
                    _iptables("-t", "filter", "-A", FWD_CHAIN, "-d", address, "-p", proto, "--dport", inside, "-m",
                              "comment", "--comment", tag, "-j", "ACCEPT")  # fmt: skip
        device = _device_to(address)
        if device is not None and ports:
            # As portmap does: the host's own 127.0.0.1 may be routed to the namespace.
            path = f"/proc/sys/net/ipv4/conf/{device}/route_localnet"
            with open(path, "w") as fh:
                fh.write("1")
    except BaseException:
        unforward(alloc_id)
        raise


def unforward(alloc_id: str) -> list[str]:
    """Remove the allocation's rules; chains and jumps go once empty. Returns what failed."""
    tag = comment(alloc_id)
    failed: list[str] = []
    with _lock:
        for table, chain in (("nat", NAT_CHAIN), ("nat", MASQ_CHAIN), ("filter", FWD_CHAIN)):
            for line in _rules(table, chain):
                if f'"{tag}"' not in line and f"--comment {tag}" not in line:
                    continue
                args = _split(line)
                args[0] = "-D"
                done = _iptables("-t", table, *args, check=False)
                if done.returncode != 0:
                    failed.append(f"{table} {line}: {done.stderr.strip()}")
        _drop_empty_chains()
    return failed


def _drop_empty_chains() -> None:
    for table, chain, parent, match in _JUMPS:
        if _iptables("-t", table, "-S", chain, check=False).returncode != 0 or _rules(table, chain):
            continue
        while _iptables("-t", table, "-D", parent, *match, "-j", chain, check=False).returncode == 0:
            pass
    for table, chain in {(t, c) for t, c, _, _ in _JUMPS}:
        if not _rules(table, chain):
            _iptables("-t", table, "-X", chain, check=False)


def _split(line: str) -> list[str]:
    import shlex

    return shlex.split(line)


def rules_of(alloc_id: str) -> list[str]:
    """The forwarding rules the allocation has (for status and tests)."""
    tag = comment(alloc_id)
    return [
        line
        for table, chain in (("nat", NAT_CHAIN), ("nat", MASQ_CHAIN), ("filter", FWD_CHAIN))
        for line in _rules(table, chain)
        if tag in line
    ]
