"""Port allocation on this host: dynamic ports from the client's range, never one another
allocation of the run holds or a process listens on; a taken static port is one sentence."""

from __future__ import annotations

import os
import socket

import pytest

from driversdk.agent.allocrunner import hostports, portalloc
from driversdk.jobspec.job import Group, Port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reads the iptables forwarding chains: root only")


def free_range(size: int) -> int:
    """The first port of ``size`` consecutive ports no socket of this host holds."""
    held = hostports.sockets()
    for start in range(41000, 60000, size):
        if not any(p in held for p in range(start, start + size)):
            return start
    raise AssertionError("no free range")


def test_dynamic_ports_come_from_the_range_and_are_not_handed_out_twice() -> None:
    low = free_range(3)
    group = Group("g", ports=[Port("a"), Port("b", to=8080)])
    first = portalloc.allocate("alloc-1", "j", group, low, low + 2, "192.0.2.9")
    try:
        assert {p.value for p in first} <= {low, low + 1, low + 2} and len({p.value for p in first}) == 2
        assert [p.to for p in first] == [0, 8080] and {p.host_ip for p in first} == {"192.0.2.9"}
        with pytest.raises(portalloc.PortUnavailable) as err:
            portalloc.allocate("alloc-2", "j", group, low, low + 2, "192.0.2.9")
        assert str(err.value) == (
            f'job "j" group "g": no free dynamic port for port "b" in the client\'s range {low}-{low + 2}; '
            "stop other allocations or widen client.min_dynamic_port/max_dynamic_port"
        )
        # The failed allocation holds nothing: the one port it had taken is free again.
        assert sorted(p for p, owner in portalloc._held.items() if owner == "alloc-2") == []
    finally:
        portalloc.release("alloc-1")
    assert not any(owner == "alloc-1" for owner in portalloc._held.values())


def test_static_port_held_by_a_process_is_refused_with_a_sentence() -> None:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        group = Group("web", ports=[Port("http", static=port)])
        with pytest.raises(portalloc.PortUnavailable) as err:
            portalloc.allocate("alloc-3", "j", group, 20000, 32000, "192.0.2.9")
    assert str(err.value).startswith(
        f'job "j" group "web": static port {port} (port "http") is already in use on this host '
        "(a TCP socket on 0.0.0.0 holds it); "
    )
    assert not any(owner == "alloc-3" for owner in portalloc._held.values())
