"""Bridge-mode hook: the group namespace's address and its ports.

A namespace its driver left without an address (docker's pause container runs with network
"none") is given one on our bridge, with or without ports, as Nomad's CNI bridge gives every
bridge-mode allocation one (and its way out of the host, driversdk.netegress). Each group port's
host port is then forwarded to that address and its ``to`` port, as Nomad's CNI portmap does
(iptables DNAT for traffic arriving and generated here, masquerade for the host's own 127.0.0.1);
the rules carry the allocation's id and are removed at postrun, also for an allocation a killed
run left, and the address is released with them."""

from __future__ import annotations

import os

from driversdk.agent.allocrunner import bridgenet, portalloc
from driversdk.agent.allocrunner.hooks import AllocHook
from driversdk.agent.allocrunner.hooks.contract import (
    AllocPostrunRequest,
    AllocPostrunResponse,
    AllocPrerunRequest,
    AllocPrerunResponse,
)
from driversdk.errors import ConfigError, DriverSDKError


class NoGroupAddress(ConfigError):
    """The group network has no address the host can forward to."""


class PortForwardHook(AllocHook):
    name = "port forward"

    def prerun(self, req: AllocPrerunRequest) -> AllocPrerunResponse:
        alloc, spec, event = req.alloc, req.network, req.alloc.services.event
        if (alloc.group.network_mode or "host") != "bridge" or spec is None:
            return AllocPrerunResponse()
        address = spec.labels.get("address") or (spec.hosts.address if spec.hosts is not None else "")
        if not address and spec.path and os.path.exists(spec.path):
            # docker's pause container has no network: give it one as Nomad's CNI bridge does
            # (the record a killed run left is taken over as it is).
            address = bridgenet.attach("", alloc.alloc_id, spec.path)
            event("group", f"network namespace given {address} on bridge {bridgenet.BRIDGE}")
        if not req.ports:
            return AllocPrerunResponse()
        if req.restoring is not None and portalloc.rules_of(alloc.alloc_id):
            return AllocPrerunResponse()  # the killed run's rules are still in place
        if not address:
            raise NoGroupAddress(
                f'group "{alloc.group.name}": its bridge network has no address and no namespace the host can reach '
                f'({spec.path or "no path"}), so its ports cannot be forwarded; use network mode "host" with the '
                "docker driver's ports option, or an exec task"
            )
        portalloc.forward(alloc.alloc_id, req.ports, address)
        event("group", f"ports forwarded from the host to {address}")
        return AllocPrerunResponse()

    def postrun(self, req: AllocPostrunRequest) -> AllocPostrunResponse:
        alloc, event = req.alloc, req.alloc.services.event
        if (alloc.group.network_mode or "host") != "bridge":
            return AllocPostrunResponse()
        if req.ports and portalloc.rules_of(alloc.alloc_id):
            for failure in portalloc.unforward(alloc.alloc_id):
                event("group", f"port forwarding rule could not be removed: {failure}")
        if bridgenet.address_of("", alloc.alloc_id) is not None:  # ours, also when a killed run made it
            try:
                bridgenet.detach("", alloc.alloc_id)
            except DriverSDKError as err:
                event("group", f"bridge address could not be released: {err}")
        return AllocPostrunResponse()
