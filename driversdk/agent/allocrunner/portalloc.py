"""Group network ports on this host: static ports checked free, dynamic ones picked from the
client's range (``min_dynamic_port`` / ``max_dynamic_port``) less its ``reserved_ports``, and, for
bridge groups, forwarding from the host port to the group namespace's address and ``to`` port as
Nomad's CNI ``portmap`` plugin does it.

A port is free when no socket of this host holds it (the kernel's tables, any address and family:
:func:`driversdk.agent.allocrunner.hostports.sockets`), no live ``driversdk run`` on this host (any data dir)
has handed it out (:func:`driversdk.agent.allocrunner.hostports.locked`, a host-wide lock and record), and no
run forwards it to a bridge group. The check and the record are made under that lock, so two runs
started at once never get the same port.

Forwarding is iptables, in chains of our own so nothing else's rules are touched:

- ``nat DSDK-PORTMAP`` (jumped to from PREROUTING and OUTPUT for local destinations outside
  127.0.0.0/8): one DNAT rule per port and protocol, host port → ``address:to``. Traffic to the
  host's own addresses (its external IP, a bridge's gateway) reaches the task; the host's loopback
  traffic never does: a DNS stub on 127.0.0.53, or anything on 127.0.0.1, keeps its own queries
  (Nomad's portmap, with ``snat``, also forwards 127.0.0.1; a job must not capture those). Only
  IPv4 is forwarded, so ``::1`` is never touched either;
- ``nat DSDK-PORTMAP-MASQ`` (from POSTROUTING): a task reaching its own port through the host's
  address (hairpin) is masqueraded, so the answer comes back the way the question went;
- ``filter DSDK-PORTMAP-FWD`` (from FORWARD): forwarded traffic to the port is accepted (an
  engine may have set FORWARD's policy to DROP).

Every rule carries the comment ``driversdk alloc <id>``; :func:`unforward` removes the
allocation's rules (after a killed run too: they are found by that comment) and the chains and
jumps once no rule is left in them.
"""

from __future__ import annotations

import ipaddress
import random
import subprocess
import threading
from collections.abc import Collection, Iterable, Sequence

from driversdk.agent.allocrunner import hostports
from driversdk.errors import ConfigError, DriverSDKError
from driversdk.jobspec.clientconfig import ClientConfig
from driversdk.jobspec.job import Group, Job
from driversdk.jobspec.problems import Problem
from driversdk.jobspec.taskenv import PortValue

NAT_CHAIN = "DSDK-PORTMAP"
MASQ_CHAIN = "DSDK-PORTMAP-MASQ"
FWD_CHAIN = "DSDK-PORTMAP-FWD"
_LOCAL_NOT_LOOPBACK = ["!", "-d", "127.0.0.0/8", "-m", "addrtype", "--dst-type", "LOCAL"]
# (table, chain, built-in chain jumping to it, match of the jump)
_JUMPS = [
    ("nat", NAT_CHAIN, "PREROUTING", _LOCAL_NOT_LOOPBACK),
    ("nat", NAT_CHAIN, "OUTPUT", _LOCAL_NOT_LOOPBACK),
    ("nat", MASQ_CHAIN, "POSTROUTING", []),
    ("filter", FWD_CHAIN, "FORWARD", []),
]
# Jumps an earlier driversdk made (loopback included): removed with ours once the chain is empty.
_OLD_JUMPS = [
    ("nat", NAT_CHAIN, "PREROUTING", ["-m", "addrtype", "--dst-type", "LOCAL"]),
    ("nat", NAT_CHAIN, "OUTPUT", ["-m", "addrtype", "--dst-type", "LOCAL"]),
]
PROTOCOLS = ("tcp", "udp")
PORT_MAX = 65535


class PortUnavailable(ConfigError):
    """A static port is taken or reserved, or no dynamic port is free."""


class ForwardingFailed(DriverSDKError):
    """iptables refused a rule."""


# Ports this process has handed to allocations, by port (also in the host-wide record).
_held: dict[int, str] = {}
_lock = threading.RLock()


def _forwarded() -> set[int]:
    """Host ports a run forwards to a bridge group (nothing listens on them on the host)."""
    out: set[int] = set()
    for line in _rules("nat", NAT_CHAIN):
        parts = line.split()
        if "--dport" in parts:
            out.add(int(parts[parts.index("--dport") + 1]))
    return out


class _Taken:
    """Why each port is not free, read once per allocation under the host-wide lock."""

    def __init__(self, record: dict[int, hostports.Entry]) -> None:
        self.record = record
        self.sockets = hostports.sockets()
        self.forwarded = _forwarded()
        self.me = hostports.me()

    def why(self, port: int) -> str | None:
        if port in _held:
            return f"allocation {_held[port][:8]} of this run holds it"
        entry = self.record.get(port)
        if entry is not None and (entry.pid, entry.start) != self.me:
            return f"another driversdk run (pid {entry.pid}) holds it for allocation {entry.alloc[:8]}"
        if port in self.forwarded:
            return "another driversdk run forwards it to a bridge group"
        holder = self.sockets.get(port)
        if holder is not None:
            return f"a {holder.proto} socket on {holder.address} holds it"
        return None

    def take(self, port: int, alloc_id: str) -> None:
        _held[port] = alloc_id
        self.record[port] = hostports.Entry(*self.me, alloc_id)


def allocate(
    alloc_id: str,
    job: str,
    group: Group,
    low: int,
    high: int,
    host_ip: str,
    reserved: Collection[int] = frozenset(),
) -> list[PortValue]:
    """The group's ports for one allocation; raises :class:`PortUnavailable` (holding nothing)."""
    where = f'job "{job}" group "{group.name}"'
    out: list[PortValue] = []
    if not group.ports:
        return out
    with _lock:
        try:
            with hostports.locked() as record:
                taken = _Taken(record)
                for port in group.ports:
                    if not port.static:
                        continue
                    if port.static in reserved:
                        raise PortUnavailable(
                            f'{where}: static port {port.static} (port "{port.label}") is reserved by the client '
                            f"config (client.reserved.reserved_ports); use another static port or a dynamic one"
                        )
                    why = taken.why(port.static)
                    if why is not None:
                        raise PortUnavailable(
                            f'{where}: static port {port.static} (port "{port.label}") is already in use on this '
                            f'host ({why}); stop what holds it, or make the port dynamic (port "{port.label}" {{}})'
                        )
                    taken.take(port.static, alloc_id)
                    out.append(PortValue(port.label, port.static, port.to, host_ip))
                for port in group.ports:
                    if port.static:
                        continue
                    free = [p for p in range(low, high + 1) if p not in reserved and taken.why(p) is None]
                    if not free:
                        raise PortUnavailable(
                            f'{where}: no free dynamic port for port "{port.label}" in the client\'s range '
                            f"{low}-{high}; stop other allocations or widen client.min_dynamic_port/max_dynamic_port"
                        )
                    value = random.choice(free)
                    taken.take(value, alloc_id)
                    # Nomad: a dynamic port without `to` is the same port inside; `to = -1` also means that.
                    out.append(PortValue(port.label, value, port.to if port.to > 0 else 0, host_ip))
        except BaseException:
            # The record was not written (the lock block ended in an exception): only this run's map.
            for number in [p for p, owner in _held.items() if owner == alloc_id]:
                del _held[number]
            raise
    return out


def hold(alloc_id: str, ports: Iterable[PortValue]) -> None:
    """A recovered allocation's ports, held again by this run (here and in the host-wide record)."""
    values = [p.value for p in ports]
    if not values:
        return
    with _lock, hostports.locked() as record:
        me = hostports.me()
        for value in values:
            _held[value] = alloc_id
            record[value] = hostports.Entry(*me, alloc_id)


def release(alloc_id: str) -> None:
    with _lock:
        mine = [p for p, owner in _held.items() if owner == alloc_id]
        if not mine:
            return
        for port in mine:
            del _held[port]
        with hostports.locked() as record:
            me = hostports.me()
            for port in mine:
                entry = record.get(port)
                if entry is not None and entry.alloc == alloc_id and (entry.pid, entry.start) == me:
                    del record[port]


def reserved_problems(job: Job, client: ClientConfig) -> list[Problem]:
    """Static ports the client config reserves: Nomad's scheduler never places such a group there."""
    out: list[Problem] = []
    for group in job.groups:
        for port in group.ports:
            if port.static and port.static in client.reserved_ports:
                where = {"job": job.name, "group": group.name, "field": f'network.port "{port.label}".static'}
                message = (
                    f'static port {port.static} (port "{port.label}") is reserved by the client config '
                    f'(client.reserved.reserved_ports "{client.reserved_ports_text}"); use another static port or a '
                    "dynamic one"
                )
                out.append(Problem(job.file, message, **where))
    return out


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
    for table, chain, parent, match in _OLD_JUMPS:
        # An earlier driversdk's jump would still send the host's loopback traffic to the chain.
        while _iptables("-t", table, "-D", parent, *match, "-j", chain, check=False).returncode == 0:
            pass
    for table, chain, parent, match in _JUMPS:
        _iptables("-t", table, "-N", chain, check=False)  # exists already: fine
        if _iptables("-t", table, "-C", parent, *match, "-j", chain, check=False).returncode != 0:
            _iptables("-t", table, "-I", parent, "1", *match, "-j", chain)


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
                    _iptables("-t", "nat", "-A", MASQ_CHAIN, "-s", address, "-d", address, "-p", proto,
                              "--dport", inside, "-m", "comment", "--comment", tag, "-j", "MASQUERADE")  # fmt: skip
                    _iptables("-t", "filter", "-A", FWD_CHAIN, "-d", address, "-p", proto, "--dport", inside, "-m",
                              "comment", "--comment", tag, "-j", "ACCEPT")  # fmt: skip
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
    for table, chain, parent, match in _JUMPS + _OLD_JUMPS:
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
