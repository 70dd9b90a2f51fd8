"""go-sockaddr's template functions, answered from this node's interfaces.

Nomad's templates (consul-template) carry hashicorp/go-sockaddr's functions: sources
(``GetAllInterfaces``, ``GetDefaultInterfaces``, ``GetPrivateIP`` …) and helpers over their
results (``include``/``exclude``, ``sort``, ``attr``, ``join``, ``limit`` …). Job files use them
to bind a service to the node's address. The addresses come from ``getifaddrs(3)`` through
ctypes (the standard library has no wrapper, and the runner must not need the exec driver's
pyroute2); the default interface is the one holding the default route in ``/proc/net/route``,
as go-sockaddr asks ``ip route`` for it.

Private means inside go-sockaddr's RFC 6890 table and forwardable means outside its list of
non-forwardable blocks, so an address in a documentation range (192.0.2.0/24) is neither
private-and-usable nor public: it is not forwardable, as go-sockaddr decides.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from driversdk.errors import ConfigError

IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
IPIface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


class SockaddrError(ConfigError):
    """A sockaddr function given an argument it cannot use; the sentence names it."""


def _nets(*cidrs: str) -> tuple[IPNet, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# The RFC numbers job files filter on, with the blocks go-sockaddr's table gives them.
RFCS: dict[int, tuple[IPNet, ...]] = {
    919: _nets("255.255.255.255/32"),
    1112: _nets("224.0.0.0/4"),
    1122: _nets("0.0.0.0/8", "127.0.0.0/8"),
    1918: _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"),
    2544: _nets("198.18.0.0/15"),
    3171: _nets("224.0.0.0/4"),
    3849: _nets("2001:db8::/32"),
    3927: _nets("169.254.0.0/16"),
    4193: _nets("fc00::/7"),
    4291: _nets("::/128", "::1/128", "::/96", "::ffff:0:0/96", "fe80::/10", "fec0::/10", "ff00::/8"),
    5737: _nets("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"),
    6052: _nets("64:ff9b::/96"),
    6598: _nets("100.64.0.0/10"),
    6666: _nets("100::/64"),
    6890: _nets(
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.0.0/29",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "240.0.0.0/4",
        "255.255.255.255/32",
        "::1/128",
        "::/128",
        "64:ff9b::/96",
        "::ffff:0:0/96",
        "100::/64",
        "2001::/16",
        "2002::/16",
        "fc00::/7",
        "fe80::/10",
    ),
}
NOT_FORWARDABLE = _nets(
    "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "192.0.0.0/24", "192.0.2.0/24", "198.51.100.0/24",
    "203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32", "::1/128", "::/128", "::ffff:0:0/96",
    "2001:db8::/32", "2001:10::/28", "fe80::/10",
)  # fmt: skip

# Linux's IFF_* bits, named and ordered as Go's net.Flags prints them.
_FLAG_BITS = (("up", 0x1), ("broadcast", 0x2), ("loopback", 0x8), ("pointtopoint", 0x10), ("multicast", 0x1000),
              ("running", 0x40))  # fmt: skip


@dataclass(frozen=True)
class IfAddr:
    """One address of one interface (go-sockaddr's IfAddr)."""

    name: str
    index: int
    flags: int
    address: IPIface

    def in_any(self, nets: tuple[IPNet, ...]) -> bool:
        ip = self.address.ip
        return any(ip.version == n.version and ip in n for n in nets)

    @property
    def forwardable(self) -> bool:
        return not self.in_any(NOT_FORWARDABLE)

    def flag_names(self) -> list[str]:
        return [name for name, bit in _FLAG_BITS if self.flags & bit]

    def text(self) -> str:
        """go-sockaddr's String(): the bare address for a host mask, else address/prefix."""
        iface = self.address
        if iface.network.prefixlen == iface.max_prefixlen:
            return str(iface.ip)
        return str(iface)

    def __str__(self) -> str:
        return f"{self.text()} {self.name}"


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_Ifaddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.c_void_p),
    ("ifa_netmask", ctypes.c_void_p),
    ("ifa_ifu", ctypes.c_void_p),
    ("ifa_data", ctypes.c_void_p),
]


def _ip_at(pointer: int | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not pointer:
        return None
    family = ctypes.c_ushort.from_address(pointer).value
    if family == socket.AF_INET:
        return ipaddress.IPv4Address(ctypes.string_at(pointer + 4, 4))  # sockaddr_in: family, port, addr
    if family == socket.AF_INET6:
        return ipaddress.IPv6Address(ctypes.string_at(pointer + 8, 16))  # family, port, flowinfo, addr
    return None


def all_interfaces() -> list[IfAddr]:
    """Every IP address of every interface, in interface-index order, IPv4 before IPv6 (the
    order Go's net.Interfaces and Addrs give)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise SockaddrError(f"cannot list this node's network interfaces: {ctypes.get_errno()}")
    out: list[IfAddr] = []
    try:
        node = head
        while node:
            entry = node.contents
            ip = _ip_at(entry.ifa_addr)
            mask = _ip_at(entry.ifa_netmask)
            if ip is not None:
                name = (entry.ifa_name or b"").decode()
                prefix = bin(int(mask)).count("1") if mask is not None else ip.max_prefixlen
                try:
                    index = socket.if_nametoindex(name)
                except OSError:
                    index = 0
                address = ipaddress.ip_interface(f"{ip}/{prefix}")
                out.append(IfAddr(name, index, int(entry.ifa_flags), address))
            node = entry.ifa_next
    finally:
        libc.freeifaddrs(head)
    return sorted(out, key=lambda a: (a.index, a.address.version))


def default_interface(route_table: str = "/proc/net/route") -> str | None:
    """The interface of the default IPv4 route with the lowest metric, or None."""
    try:
        with open(route_table, encoding="ascii") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return None
    defaults = [
        (int(r[6]), i, r[0]) for i, r in enumerate(rows) if len(r) > 7 and r[1] == "00000000" and r[7] == "00000000"
    ]
    return min(defaults)[2] if defaults else None


# --- attributes -------------------------------------------------------------------------------


def attr(name: str, value: Any) -> str:
    """``attr "address"`` on an IfAddr, or the first of a list ("" for an empty list)."""
    if isinstance(value, list):
        if not value:
            return ""
        value = value[0]
    if not isinstance(value, IfAddr):
        raise SockaddrError(f'attr "{name}" needs interface addresses (such as GetAllInterfaces), not {value!r}')
    key = name.lower()
    iface = value.address
    net = iface.network
    getters: dict[str, Callable[[], str]] = {
        "name": lambda: value.name,
        "flags": lambda: "|".join(value.flag_names()) or "0",
        "address": lambda: str(iface.ip),
        "string": value.text,
        "type": lambda: f"IPv{iface.version}",
        "network": lambda: str(net.network_address),
        "mask": lambda: str(net.netmask) if iface.version == 4 else f"{int(net.netmask):032x}",
        "size": lambda: str(net.num_addresses),
        "port": lambda: "0",
        "host": lambda: f"{iface.ip}/{iface.max_prefixlen}",
        "broadcast": lambda: str(net.broadcast_address),
    }
    getter = getters.get(key)
    if getter is None:
        raise SockaddrError(f'attr "{name}" is not an attribute sockaddr knows (use one of {", ".join(getters)})')
    return getter()


def _addrs(value: Any, what: str) -> list[IfAddr]:
    if isinstance(value, IfAddr):
        return [value]
    if isinstance(value, list) and all(isinstance(v, IfAddr) for v in value):
        return list(value)
    raise SockaddrError(f"{what} needs interface addresses (such as GetAllInterfaces), not {value!r}")


def _rfc(number: str) -> tuple[IPNet, ...]:
    try:
        return RFCS[int(number)]
    except (ValueError, KeyError):
        raise SockaddrError(f"RFC {number!r} is not one sockaddr knows (use one of {sorted(RFCS)})") from None


def _flag(name: str, a: IfAddr) -> bool:
    ip = a.address.ip
    tests: dict[str, Callable[[], bool]] = {
        "up": lambda: bool(a.flags & 0x1),
        "down": lambda: not a.flags & 0x1,
        "broadcast": lambda: bool(a.flags & 0x2),
        "loopback": lambda: bool(a.flags & 0x8),
        "point-to-point": lambda: bool(a.flags & 0x10),
        "multicast": lambda: bool(a.flags & 0x1000),
        "forwardable": lambda: a.forwardable,
        "unspecified": lambda: ip.is_unspecified,
        "global unicast": lambda: ip.is_global and not ip.is_multicast,
        "link-local unicast": lambda: ip.is_link_local,
        "link-local multicast": lambda: ip.is_multicast and ip in ipaddress.ip_network(
            "224.0.0.0/24" if ip.version == 4 else "ff02::/16"),
        "interface-local multicast": lambda: ip.version == 6 and ip in ipaddress.ip_network("ff01::/16"),
    }  # fmt: skip
    test = tests.get(name.lower())
    if test is None:
        raise SockaddrError(f'flag "{name}" is not one sockaddr knows (use one of {", ".join(tests)})')
    return test()


def _matcher(selector: str, param: str) -> Callable[[IfAddr], bool]:
    key = selector.lower()
    if key in ("name", "address", "port"):
        try:
            pattern = re.compile(param)
        except re.error:
            raise SockaddrError(f'{selector} "{param}" is not a regular expression') from None
        field: Callable[[IfAddr], str] = {"name": lambda a: a.name, "address": IfAddr.text, "port": lambda a: "0"}[key]
        return lambda a: pattern.search(field(a)) is not None
    if key == "flag" or key == "flags":
        names = param.split("|")
        return lambda a: any(_flag(n, a) for n in names)
    if key in ("rfc", "rfcs"):
        nets = tuple(n for number in param.split("|") for n in _rfc(number))
        return lambda a: a.in_any(nets)
    if key == "type":
        kinds = {k.lower() for k in param.split("|")}
        return lambda a: bool(kinds & {"ip", f"ipv{a.address.version}"})
    if key == "size":
        return lambda a: str(a.address.network.prefixlen) == param
    if key == "network":
        try:
            net = ipaddress.ip_network(param, strict=False)
        except ValueError:
            raise SockaddrError(f'network "{param}" is not an address block') from None
        return lambda a: a.address.ip.version == net.version and a.address.ip in net
    raise SockaddrError(
        f'"{selector}" is not a sockaddr selector (use address, flag, name, network, port, rfc, size or type)'
    )


def include(selector: str, param: str, value: Any) -> list[IfAddr]:
    match = _matcher(str(selector), str(param))
    return [a for a in _addrs(value, "include") if match(a)]


def exclude(selector: str, param: str, value: Any) -> list[IfAddr]:
    match = _matcher(str(selector), str(param))
    return [a for a in _addrs(value, "exclude") if not match(a)]


def sort(keys: str, value: Any) -> list[IfAddr]:
    """go-sockaddr's multi-key sort: comma-separated keys, each ``+`` (default) or ``-``."""
    addrs = _addrs(value, "sort")
    default = default_interface()
    key_funcs: dict[str, Callable[[IfAddr], Any]] = {
        "address": lambda a: (a.address.version, int(a.address.ip)),
        "default": lambda a: a.name != default,
        "name": lambda a: a.name,
        "port": lambda a: 0,
        "private": lambda a: not a.in_any(RFCS[6890]),
        "size": lambda a: (a.address.version, a.address.network.prefixlen),
        "type": lambda a: a.address.version,
    }
    for raw in reversed([k.strip() for k in str(keys).split(",") if k.strip()]):
        descending = raw.startswith("-")
        name = raw.lstrip("+-").lower()
        func = key_funcs.get(name)
        if func is None:
            raise SockaddrError(f'sort key "{raw}" is not one sockaddr knows (use one of {", ".join(key_funcs)})')
        addrs.sort(key=func, reverse=descending)
    return addrs


def join(name: str, sep: str, value: Any) -> str:
    return str(sep).join(attr(name, a) for a in _addrs(value, "join"))


def limit(n: int, value: Any) -> list[IfAddr]:
    return _addrs(value, "limit")[: max(int(n), 0)]


def offset(n: int, value: Any) -> list[IfAddr]:
    return _addrs(value, "offset")[int(n) :]  # a negative offset counts from the end


def reverse(value: Any) -> list[IfAddr]:
    return list(reversed(_addrs(value, "reverse")))


def unique(name: str, value: Any) -> list[IfAddr]:
    seen: set[str] = set()
    out: list[IfAddr] = []
    for a in _addrs(value, "unique"):
        key = attr(name, a)
        if key not in seen:
            seen.add(key)
            out.append(a)
    return out


# --- sources ----------------------------------------------------------------------------------


def default_interfaces() -> list[IfAddr]:
    name = default_interface()
    return [a for a in all_interfaces() if a.name == name] if name else []


def _usable(addrs: list[IfAddr]) -> list[IfAddr]:
    """Forwardable addresses of interfaces that are up, default interface first, then IPv4,
    then the larger network (go-sockaddr's sort "default,type,size")."""
    kept = [a for a in addrs if a.forwardable and a.flags & 0x1]
    return sort("default,type,size", kept)


def private_interfaces() -> list[IfAddr]:
    return [a for a in _usable(all_interfaces()) if a.in_any(RFCS[6890])]


def public_interfaces() -> list[IfAddr]:
    return [a for a in _usable(all_interfaces()) if not a.in_any(RFCS[6890])]


def interface_ips(name: str) -> list[IfAddr]:
    return _usable(include("name", name, all_interfaces()))


def functions() -> dict[str, Callable[..., Any]]:
    """The template functions, by their names in Nomad's templates."""
    return {
        "GetAllInterfaces": all_interfaces,
        "GetDefaultInterfaces": default_interfaces,
        "GetPrivateInterfaces": private_interfaces,
        "GetPublicInterfaces": public_interfaces,
        "GetPrivateIP": lambda: attr("address", private_interfaces()),
        "GetPrivateIPs": lambda: join("address", " ", private_interfaces()),
        "GetPublicIP": lambda: attr("address", public_interfaces()),
        "GetPublicIPs": lambda: join("address", " ", public_interfaces()),
        "GetInterfaceIP": lambda name: attr("address", interface_ips(str(name))),
        "GetInterfaceIPs": lambda name: join("address", " ", interface_ips(str(name))),
        "attr": attr,
        "include": include,
        "exclude": exclude,
        "sort": sort,
        "limit": limit,
        "offset": offset,
        "reverse": reverse,
        "unique": unique,
    }
