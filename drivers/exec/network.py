"""Per-allocation network namespaces via pyroute2: loopback, a veth into a host bridge, an address.

Layout for allocation A on bridge B with subnet N:
- a named netns ``dsx-<alloc id prefix>`` (/var/run/netns/...), loopback up;
- a veth pair: ``dsv<hash>`` on the host, enslaved to B; its peer is ``eth0`` inside the netns;
- eth0 gets the lowest free address of N, the default route goes via B's address (N's first host);
- traffic from N out of the host is masqueraded and forwarded, as Nomad's bridge does
  (driversdk.netegress), while B exists.
Which address each allocation holds is recorded in ``<state_dir>/networks/<alloc id>.json`` so a
relaunched plugin neither hands it out twice nor forgets to free it. The record is written, in
phase "creating" and naming the plugin process that builds the namespace, before anything is
built, and moves to "created" when CreateNetwork returns: a namespace a plugin killed in the middle
of CreateNetwork left is then found and removed by a later plugin's reconciler (reconcile.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drivers.exec.owner import ProcessIdentity
from driversdk import netegress
from driversdk.errors import DriverError
from driversdk.model import HostsConfig, NetworkIsolationMode, NetworkIsolationSpec

if TYPE_CHECKING:
    # pyroute2 loads with the first network a task asks for, not with the plugin.
    from pyroute2 import IPRoute

log = logging.getLogger("driversdk.exec.network")

NETNS_DIR = "/var/run/netns"
LABEL_ALLOC = "driversdk.exec.alloc_id"
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


# --- namespaces without fork ------------------------------------------------------------------
# pyroute2's netns.create and NetNS fork helper processes, which is unsafe (and crashes) in a
# multi-threaded gRPC server. A namespace only binds the calling *thread*, so each operation
# runs in a short-lived thread of its own: unshare or setns there, then talk netlink.


def _in_thread(fn: Callable[[], Any]) -> Any:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=run, name="netns")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _os_error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def netns_path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def create_netns(name: str) -> None:
    """A named network namespace, bind-mounted at /var/run/netns/<name> as `ip netns add` does."""
    path = netns_path(name)
    os.makedirs(NETNS_DIR, exist_ok=True)

    def make() -> None:
        if _libc.unshare(CLONE_NEWNET) != 0:
            raise _os_error("unshare(CLONE_NEWNET)")
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
        if _libc.mount(b"/proc/thread-self/ns/net", path.encode(), b"none", MS_BIND, None) != 0:
            raise _os_error(f"bind-mounting the namespace at {path}")

    _in_thread(make)


def remove_netns(name: str) -> None:
    path = netns_path(name)
    if not os.path.exists(path):
        return
    if _libc.umount2(path.encode(), MNT_DETACH) != 0 and ctypes.get_errno() not in (22,):  # EINVAL: not mounted
        raise _os_error(f"unmounting {path}")
    os.unlink(path)


def in_netns(name: str, fn: Callable[[IPRoute], Any]) -> Any:
    """Run ``fn`` with an IPRoute bound to the named namespace."""
    from pyroute2 import IPRoute

    def enter() -> Any:
        fd = os.open(netns_path(name), os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise _os_error(f"entering namespace {name}")
        finally:
            os.close(fd)
        with IPRoute() as ipr:
            return fn(ipr)

    return _in_thread(enter)


def netns_name(alloc_id: str) -> str:
    return "dsx-" + alloc_id.replace("-", "")[:16]


def veth_name(alloc_id: str) -> str:
    return "dsv" + hashlib.sha256(alloc_id.encode()).hexdigest()[:11]


@dataclass(frozen=True)
class AllocNetwork:
    alloc_id: str
    netns: str
    veth: str
    address: str
    prefixlen: int
    gateway: str
    hostname: str = ""
    # Records written before these fields existed describe finished networks: "created".
    phase: str = "created"
    """"creating" until CreateNetwork returns, then "created" (the host's to destroy)."""
    owner_pid: int = 0
    owner_start_time: int = 0
    since: float = 0.0

    @property
    def owner(self) -> ProcessIdentity:
        return ProcessIdentity(self.owner_pid, self.owner_start_time)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AllocNetwork:
        return cls(**json.loads(text))

    @property
    def spec(self) -> NetworkIsolationSpec:
        return NetworkIsolationSpec(
            mode=NetworkIsolationMode.GROUP,
            path=netns_path(self.netns),
            labels={LABEL_ALLOC: self.alloc_id, "address": self.address},
            hosts=HostsConfig(hostname=self.hostname, address=self.address),
        )


class NetworkManager:
    def __init__(self, state_dir: str, bridge: str, subnet: str, *, earlier_state_dirs: tuple[str, ...] = ()) -> None:
        self.dir = os.path.join(state_dir, "networks")
        # Records of networks made while the state dir was elsewhere (the plugin's own default,
        # before the runner named one under the data dir): their addresses stay taken and the
        # bridge stays up while they exist, and destroying one removes its record there.
        self.earlier = tuple(
            d for d in dict.fromkeys(os.path.join(e, "networks") for e in earlier_state_dirs) if d != self.dir
        )
        self.bridge = bridge
        self.subnet = ipaddress.IPv4Network(subnet)
        hosts = list(self.subnet.hosts())
        self.gateway = hosts[0]
        self.pool = hosts[1:]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _record_path(self, alloc_id: str) -> str:
        """Where the allocation's record is: the current dir's, or an earlier dir's that holds it."""
        for directory in (self.dir, *self.earlier):
            path = os.path.join(directory, f"{alloc_id}.json")
            if os.path.exists(path):
                return path
        return os.path.join(self.dir, f"{alloc_id}.json")

    def records(self) -> list[AllocNetwork]:
        out = []
        for directory in (self.dir, *self.earlier):
            if os.path.isdir(directory):
                for name in sorted(os.listdir(directory)):
                    if name.endswith(".json"):
                        with open(os.path.join(directory, name)) as fh:
                            out.append(AllocNetwork.from_json(fh.read()))
        return out

    def find(self, alloc_id: str) -> AllocNetwork | None:
        path = self._record_path(alloc_id)
        if not os.path.exists(path):
            return None
        with open(path) as fh:
            return AllocNetwork.from_json(fh.read())

    def create(self, alloc_id: str, hostname: str) -> tuple[NetworkIsolationSpec, bool]:
        with self._locked():
            existing = self.find(alloc_id)
            if existing is not None and existing.phase == "creating":
                # Under the lock, "creating" can only be a CreateNetwork whose plugin died: rebuild.
                self._teardown(existing)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self._record_path(alloc_id))  # an earlier dir's, too: rebuilt, it is recorded here
            elif existing is not None and os.path.exists(netns_path(existing.netns)):
                return existing.spec, False
            used = {r.address for r in self.records() if r.alloc_id != alloc_id}
            free = next((a for a in self.pool if str(a) not in used), None)
            if free is None:
                raise DriverError(
                    f"allocation {alloc_id!r}: no free address left in bridge subnet {self.subnet}; "
                    "widen the plugin's bridge_subnet or stop other allocations",
                    recoverable=True,
                )
            me = ProcessIdentity.current()
            net = AllocNetwork(
                alloc_id=alloc_id,
                netns=netns_name(alloc_id),
                veth=veth_name(alloc_id),
                address=str(free),
                prefixlen=self.subnet.prefixlen,
                gateway=str(self.gateway),
                hostname=hostname,
                phase="creating",
                owner_pid=me.pid,
                owner_start_time=me.start_time,
                since=time.time(),
            )
            # Recorded before anything is built: a kill from here on leaves a record to reconcile by.
            self._write(net)
            try:
                self._ensure_bridge()
                self._build(net)
            except Exception as err:
                self._teardown(net)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self._record_path(alloc_id))
                self._remove_bridge_if_unused(exclude=alloc_id)
                reason = err.message if isinstance(err, DriverError) else str(err)
                raise DriverError(
                    f"allocation {alloc_id!r}: failed to create its network namespace: {reason}",
                    recoverable=True,
                ) from None
            net = dataclasses.replace(net, phase="created", since=time.time())
            self._write(net)
            return net.spec, True

    def _write(self, net: AllocNetwork) -> None:
        path = os.path.join(self.dir, f"{net.alloc_id}.json")  # new records only in the current dir
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(net.to_json())
        os.replace(tmp, path)

    def reap_abandoned(self, grace: float, *, now: float | None = None) -> list[AllocNetwork]:
        """Remove networks whose CreateNetwork never returned: still "creating", their plugin
        dead, and older than ``grace``. A "created" network is the host's (DestroyNetwork)."""
        now = time.time() if now is None else now
        reaped = []
        with self._locked():
            for net in self.records():
                if net.phase != "creating" or now - net.since < grace or net.owner.alive():
                    continue
                self._teardown(net)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self._record_path(net.alloc_id))
                self._remove_bridge_if_unused(exclude=net.alloc_id)
                reaped.append(net)
        return reaped

    def destroy(self, alloc_id: str) -> None:
        with self._locked():
            net = self.find(alloc_id)
            if net is None:
                net = AllocNetwork(alloc_id, netns_name(alloc_id), veth_name(alloc_id), "", 0, "")
            self._teardown(net)
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._record_path(alloc_id))
            self._remove_bridge_if_unused(exclude=alloc_id)

    # --- kernel objects -----------------------------------------------------------------------

    def _ensure_bridge(self) -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            found = ipr.link_lookup(ifname=self.bridge)
            if not found:
                ipr.link("add", ifname=self.bridge, kind="bridge")
                found = ipr.link_lookup(ifname=self.bridge)
            idx = found[0]
            have = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=idx, family=2)}
            if str(self.gateway) not in have:
                ipr.addr("add", index=idx, address=str(self.gateway), prefixlen=self.subnet.prefixlen)
            ipr.link("set", index=idx, state="up")
        self._allow_forwarding()
        netegress.allow(self.bridge, self.subnet)  # beyond the host, as Nomad's bridge (ipMasq)

    def _iptables_rule(self) -> list[str]:
        return ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]

    def _allow_forwarding(self) -> None:
        # With br_netfilter loaded (Docker loads it) bridged frames traverse iptables' FORWARD
        # chain, whose policy Docker sets to DROP: allow traffic between our own namespaces.
        if not os.path.exists("/proc/sys/net/bridge/bridge-nf-call-iptables"):
            return
        rule = self._iptables_rule()
        with contextlib.suppress(FileNotFoundError):
            if subprocess.run(["iptables", "-C", *rule], capture_output=True).returncode != 0:
                subprocess.run(["iptables", "-I", *rule], capture_output=True, check=True)

    def _build(self, net: AllocNetwork) -> None:
        from pyroute2 import IPRoute

        create_netns(net.netns)
        peer_tmp = "dsp" + net.veth[3:]
        ns_fd = os.open(netns_path(net.netns), os.O_RDONLY)
        try:
            with IPRoute() as ipr:
                ipr.link("add", ifname=net.veth, kind="veth", peer=peer_tmp)
                host_idx = ipr.link_lookup(ifname=net.veth)[0]
                peer_idx = ipr.link_lookup(ifname=peer_tmp)[0]
                bridge_idx = ipr.link_lookup(ifname=self.bridge)[0]
                ipr.link("set", index=peer_idx, net_ns_fd=ns_fd)
                ipr.link("set", index=host_idx, master=bridge_idx, state="up")
        finally:
            os.close(ns_fd)

        def configure(ns: IPRoute) -> None:
            lo = ns.link_lookup(ifname="lo")[0]
            ns.link("set", index=lo, state="up")
            idx = ns.link_lookup(ifname=peer_tmp)[0]
            ns.link("set", index=idx, ifname="eth0")
            ns.addr("add", index=idx, address=net.address, prefixlen=net.prefixlen)
            ns.link("set", index=idx, state="up")
            ns.route("add", dst="0.0.0.0/0", gateway=net.gateway)

        in_netns(net.netns, configure)

    def _teardown(self, net: AllocNetwork) -> None:
        from pyroute2 import IPRoute, NetlinkError

        with IPRoute() as ipr:
            for idx in ipr.link_lookup(ifname=net.veth):
                with contextlib.suppress(NetlinkError):
                    ipr.link("del", index=idx)
            for idx in ipr.link_lookup(ifname="dsp" + net.veth[3:]):
                with contextlib.suppress(NetlinkError):
                    ipr.link("del", index=idx)
        remove_netns(net.netns)

    def _remove_bridge_if_unused(self, *, exclude: str) -> None:
        from pyroute2 import IPRoute, NetlinkError

        if any(r.alloc_id != exclude for r in self.records()):
            return
        with IPRoute() as ipr:
            for idx in ipr.link_lookup(ifname=self.bridge):
                with contextlib.suppress(NetlinkError):
                    ipr.link("del", index=idx)
        with contextlib.suppress(FileNotFoundError):
            rule = self._iptables_rule()
            while subprocess.run(["iptables", "-C", *rule], capture_output=True).returncode == 0:
                subprocess.run(["iptables", "-D", *rule], capture_output=True)
        for failure in netegress.remove(self.bridge, self.subnet):
            log.warning("bridge egress rule not removed", extra={"bridge": self.bridge, "error": failure})
