"""go-sockaddr's functions in templates, rendered by the real template hook in a real
`driversdk run` of a raw_exec task, against this host's interfaces as `ip -j addr` and
`ip -j route` report them (read here on their own, not through the code under test)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path
from typing import Any

from tests.agent.runs import render_in_run

# go-sockaddr's RFC 6890 table and its list of blocks that are not forwardable.
RFC6890 = [
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
        "203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32", "::1/128", "::/128", "64:ff9b::/96",
        "::ffff:0:0/96", "100::/64", "2001::/16", "2002::/16", "fc00::/7", "fe80::/10",
    )
]  # fmt: skip
NOT_FORWARDABLE = [
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "192.0.0.0/24", "192.0.2.0/24", "198.51.100.0/24",
        "203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32", "::1/128", "::/128", "::ffff:0:0/96",
        "2001:db8::/32", "2001:10::/28", "fe80::/10",
    )
]  # fmt: skip


def host() -> tuple[str, list[dict[str, Any]]]:
    """The default route's device and every address as (ifname, flags, address, prefix, index)."""
    routes = json.loads(subprocess.run(["ip", "-j", "route"], capture_output=True, check=True).stdout)
    default = next((r["dev"] for r in routes if r.get("dst") == "default"), "")
    links = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, check=True).stdout)
    addrs = [
        {"name": link["ifname"], "up": "UP" in link["flags"], "ip": ipaddress.ip_address(a["local"]),
         "prefix": a["prefixlen"], "index": link["ifindex"]}
        for link in sorted(links, key=lambda x: x["ifindex"])
        for a in link.get("addr_info", [])
    ]  # fmt: skip
    return default, addrs


def inside(ip: Any, nets: list[Any]) -> bool:
    return any(ip.version == n.version and ip in n for n in nets)


def usable(addrs: list[dict[str, Any]], default: str) -> list[dict[str, Any]]:
    """go-sockaddr's order for its Get…IP functions: forwardable addresses of up interfaces, the
    default interface first, IPv4 before IPv6, the larger network first."""
    kept = [a for a in addrs if a["up"] and not inside(a["ip"], NOT_FORWARDABLE)]
    return sorted(kept, key=lambda a: (a["name"] != default, a["ip"].version, a["prefix"]))


def test_sockaddr_functions_render_this_hosts_addresses(tmp_path: Path) -> None:
    default, addrs = host()
    got = render_in_run(
        tmp_path,
        {
            "default": '{{ GetDefaultInterfaces | attr "address" }}',
            "private": "{{ GetPrivateIP }}",
            "iface": f'{{{{ GetInterfaceIP "{default}" }}}}',
            "up": '{{ GetAllInterfaces | include "flags" "up" | join "address" " " }}',
            "form": '{{ sockaddr "GetPrivateIP" }}',
            "v4names": '{{ GetAllInterfaces | include "type" "IPv4" | exclude "name" "^lo$" | attr "name" }}',
        },
    )
    on_default = [a for a in addrs if a["name"] == default]
    assert got["default"] == (str(on_default[0]["ip"]) if on_default else "")
    private = [a for a in usable(addrs, default) if inside(a["ip"], RFC6890)]
    assert got["private"] == (str(private[0]["ip"]) if private else "")
    assert got["form"] == got["private"]
    mine = [a for a in usable(addrs, default) if a["name"] == default]
    assert got["iface"] == (str(mine[0]["ip"]) if mine else "")
    assert got["up"] == " ".join(str(a["ip"]) for a in addrs if a["up"])
    v4 = [a for a in addrs if a["ip"].version == 4 and a["name"] != "lo"]
    assert got["v4names"] == (v4[0]["name"] if v4 else "")
