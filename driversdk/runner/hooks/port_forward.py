"""Port forwarding hook (bridge mode): each group port's host port forwarded to the group
namespace's address and ``to`` port, as Nomad's CNI portmap does (iptables DNAT for traffic
arriving and generated here, masquerade for the host's own 127.0.0.1); the rules carry the
allocation's id and are removed at postrun, also for an allocation a killed run left."""

from __future__ import annotations

from typing import TYPE_CHECKING

from driversdk.errors import ConfigError
from driversdk.runner import portalloc
from driversdk.runner.hooks import AllocHook

if TYPE_CHECKING:
    from driversdk.runner.allocrunner import AllocRunner


class NoGroupAddress(ConfigError):
    """The group network has no address the host can forward to."""


class PortForwardHook(AllocHook):
    name = "port forward"

    def prerun(self, alloc: AllocRunner) -> None:
        spec = alloc.network
        if (alloc.group.network_mode or "host") != "bridge" or not alloc.ports or spec is None:
            return
        if alloc.restoring is not None and portalloc.rules_of(alloc.alloc_id):
            return  # the killed run's rules are still in place
        address = spec.labels.get("address") or (spec.hosts.address if spec.hosts is not None else "")
        if not address:
            raise NoGroupAddress(
                f'group "{alloc.group.name}": its bridge network has no address the host can forward ports to (the '
                f"driver that made it, {alloc.group.tasks[0].driver}, gives none); put a task "
                'whose driver gives the group an address (exec) first in the group, or use mode = "host" with the '
                "docker driver's ports option"
            )
        portalloc.forward(alloc.alloc_id, alloc.ports, address)
        alloc.event("group", f"ports forwarded from the host to {address}")

    def postrun(self, alloc: AllocRunner) -> None:
        if (
            (alloc.group.network_mode or "host") != "bridge"
            or not alloc.ports
            or not portalloc.rules_of(alloc.alloc_id)
        ):
            return
        for failure in portalloc.unforward(alloc.alloc_id):
            alloc.event("group", f"port forwarding rule could not be removed: {failure}")
