"""An address for a group network namespace that its driver left without one (docker's pause
container runs with network "none"; Nomad's client gives it one with the CNI bridge plugin):
a veth pair, ``eth0`` inside with the lowest free address of the subnet and a default route,
the host end on a bridge of ours (``dsdkbr0``, 172.26.64.0/20 as Nomad's ``nomad`` bridge), whose
traffic out of the host is masqueraded as Nomad's is (:mod:`driversdk.netegress`).

Which address each allocation holds is a record under ``/run/driversdk/bridge/`` (one per host,
as the bridge is: every run and data dir shares it) written before anything is built, so a
killed run's namespace is found and released by the next run; the bridge goes with the last
record.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator

from driversdk import netegress
from driversdk.errors import DriverSDKError

BRIDGE = "dsdkbr0"
SUBNET = ipaddress.IPv4Network("172.26.64.0/20")
GATEWAY = next(SUBNET.hosts())


class BridgeFailed(DriverSDKError):
    """The namespace could not be given an address."""


RECORDS = "/run/driversdk/bridge"


def _dir(_: str = "") -> str:
    return RECORDS


@contextlib.contextmanager
def _locked(data_dir: str) -> Iterator[None]:
    os.makedirs(_dir(data_dir), mode=0o700, exist_ok=True)  # root's, like the bridge
    with open(os.path.join(_dir(data_dir), ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _ip(*args: str, netns: str = "") -> subprocess.CompletedProcess[str]:
    command = ["ip", *args] if not netns else ["nsenter", f"--net={netns}", "ip", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _must(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        raise BridgeFailed(f"{what} failed: {done.stderr.strip() or done.returncode}")


def _veth(alloc_id: str) -> str:
    return "dsdk" + hashlib.sha256(alloc_id.encode()).hexdigest()[:10]


def _records(data_dir: str) -> dict[str, dict[str, str]]:
    out = {}
    if os.path.isdir(_dir(data_dir)):
        for name in os.listdir(_dir(data_dir)):
            if name.endswith(".json"):
                with open(os.path.join(_dir(data_dir), name)) as fh:
                    out[name[: -len(".json")]] = json.load(fh)
    return out


def address_of(data_dir: str, alloc_id: str) -> str | None:
    return _records(data_dir).get(alloc_id, {}).get("address")


def attach(data_dir: str, alloc_id: str, netns: str) -> str:
    """Give the namespace at ``netns`` an address on our bridge; returns the address."""
    with _locked(data_dir):
        records = _records(data_dir)
        if alloc_id in records:
            return records[alloc_id]["address"]
        used = {r["address"] for r in records.values()}
        free = next((str(a) for a in list(SUBNET.hosts())[1:] if str(a) not in used), None)
        if free is None:
            raise BridgeFailed(f"no free address left in {SUBNET} for allocation {alloc_id}")
        veth = _veth(alloc_id)
        path = os.path.join(_dir(data_dir), f"{alloc_id}.json")
        with open(path, "w") as fh:
            json.dump({"address": free, "veth": veth, "netns": netns}, fh)
        try:
            if _ip("link", "show", BRIDGE).returncode != 0:
                _must(_ip("link", "add", BRIDGE, "type", "bridge"), f"creating bridge {BRIDGE}")
                _must(_ip("addr", "add", f"{GATEWAY}/{SUBNET.prefixlen}", "dev", BRIDGE), "addressing the bridge")
            _must(_ip("link", "set", BRIDGE, "up"), "bringing the bridge up")
            netegress.allow(BRIDGE, SUBNET)  # beyond the host, as Nomad's bridge (ipMasq)
            # Both ends made inside the namespace; the host end then moved to ours (by our pid).
            _must(_ip("link", "add", "eth0", "type", "veth", "peer", "name", veth, "netns", str(os.getpid()),
                      netns=netns), "creating the veth pair")  # fmt: skip
            _must(_ip("link", "set", veth, "master", BRIDGE, "up"), "attaching the veth to the bridge")
            _must(_ip("addr", "add", f"{free}/{SUBNET.prefixlen}", "dev", "eth0", netns=netns), "addressing eth0")
            _must(_ip("link", "set", "eth0", "up", netns=netns), "bringing eth0 up")
            _must(_ip("link", "set", "lo", "up", netns=netns), "bringing lo up")
            _must(_ip("route", "add", "default", "via", str(GATEWAY), netns=netns), "adding the default route")
        except BaseException:
            _detach_locked(data_dir, alloc_id)
            raise
        return free


def detach(data_dir: str, alloc_id: str) -> None:
    with _locked(data_dir):
        failed = _detach_locked(data_dir, alloc_id)
    if failed:
        raise BridgeFailed(f"removing the egress rules of bridge {BRIDGE} failed: {'; '.join(failed)}")


def _detach_locked(data_dir: str, alloc_id: str) -> list[str]:
    """Release the allocation's address (and the bridge after its last user); returns the egress
    rules that could not be removed, for the caller to report without hiding its own error."""
    path = os.path.join(_dir(data_dir), f"{alloc_id}.json")
    if _ip("link", "show", _veth(alloc_id)).returncode == 0:
        _must(_ip("link", "del", _veth(alloc_id)), f"removing veth {_veth(alloc_id)}")
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    if not _records(data_dir):
        _ip("link", "del", BRIDGE)
        return netegress.remove(BRIDGE, SUBNET)
    return []
