"""Ports hook: the group's ``network { port … }`` for this allocation — static ports checked free
on the host, dynamic ones from the client's range — recorded in the run state (with the group
network, in ``run_allocs.network``) so a recovered allocation keeps its ports; released at postrun.
In bridge mode the ``port_forward`` hook then forwards them into the group's namespace."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict

from driversdk.agent import nodeattrs
from driversdk.agent.allocrunner import portalloc
from driversdk.agent.allocrunner.hooks import AllocHook
from driversdk.agent.allocrunner.hooks.contract import (
    AllocPostrunRequest,
    AllocPostrunResponse,
    AllocPrerunRequest,
    AllocPrerunResponse,
)
from driversdk.agent.events import RunEventType
from driversdk.jobspec.taskenv import PortValue


def saved_ports(saved: str | None) -> list[PortValue]:
    if not saved:
        return []
    return [PortValue(**p) for p in json.loads(saved).get("ports", [])]


def ports_json(ports: Iterable[PortValue]) -> list[dict[str, object]]:
    return [asdict(p) for p in ports]


class PortsHook(AllocHook):
    name = "ports"

    def prerun(self, req: AllocPrerunRequest) -> AllocPrerunResponse:
        alloc = req.alloc
        if req.restoring is not None:
            ports = saved_ports(req.restoring.network)
            portalloc.hold(alloc.alloc_id, ports)
            return AllocPrerunResponse(ports=tuple(ports))
        if not alloc.group.ports:
            return AllocPrerunResponse()
        client = alloc.client
        ports = portalloc.allocate(alloc.alloc_id, alloc.job.name, alloc.group, client.min_dynamic_port,
                                   client.max_dynamic_port, nodeattrs.host_ip(),
                                   client.reserved_ports)  # fmt: skip
        alloc.services.state.alloc_update(alloc.alloc_id, network=json.dumps({"ports": ports_json(ports)}))
        shown = ", ".join(f"{p.label} {p.value}" + (f"->{p.to}" if p.to else "") for p in ports)
        alloc.services.event("group", f"ports: {shown}", type=RunEventType.PORTS)
        return AllocPrerunResponse(ports=tuple(ports))

    def postrun(self, req: AllocPostrunRequest) -> AllocPostrunResponse:
        portalloc.release(req.alloc.alloc_id)
        return AllocPostrunResponse()
