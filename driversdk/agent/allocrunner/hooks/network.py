"""Group network hook: ``network { mode = "bridge" }`` asks the first task driver that creates
group networks for one (docker: a pause container; exec: a network namespace) and every task of
the group joins it; the network is recorded so a restarted run finds it, and removed at postrun.
Its hostname is ``network.hostname`` interpolated with the allocation's environment, as Nomad's;
without one, the driver's own (docker: the pause container's id; exec: the task's name)."""

from __future__ import annotations

import json
from typing import Any

from driversdk.agent.allocrunner.hooks import AllocHook
from driversdk.agent.allocrunner.hooks.contract import (
    AllocInfo,
    AllocPostrunRequest,
    AllocPostrunResponse,
    AllocPrerunRequest,
    AllocPrerunResponse,
)
from driversdk.agent.allocrunner.hooks.ports import ports_json
from driversdk.errors import ConfigError, DriverSDKError
from driversdk.jobspec import taskenv
from driversdk.jobspec.job import Group, hostname_problem
from driversdk.jobspec.taskenv import PortValue
from driversdk.model import HostsConfig, NetworkIsolationMode, NetworkIsolationSpec
from driversdk.paths import show


class NetworkRefused(ConfigError):
    """The group asks for a network mode that ``driversdk run`` does not provide."""


class NetworkHook(AllocHook):
    name = "group network"

    def __init__(self) -> None:
        self.spec: NetworkIsolationSpec | None = None
        self.owner = ""

    @staticmethod
    def refusal(group: Group) -> str | None:
        """Why the group's network cannot be run here; asked before any allocation starts."""
        mode = group.network_mode or "host"
        if mode in ("host", "bridge"):
            return None
        return f'group "{group.name}": network mode {mode!r} is not run by driversdk run; use mode = "host" or "bridge"'

    def prerun(self, req: AllocPrerunRequest) -> AllocPrerunResponse:
        alloc = req.alloc
        refusal = self.refusal(alloc.group)
        if refusal is not None:
            raise NetworkRefused(refusal)
        mode = alloc.group.network_mode or "host"
        if req.restoring is not None:
            self._restore(req.restoring.network)
        elif mode == "bridge":
            self._create(alloc, req.ports)
        return AllocPrerunResponse(network=self.spec)

    def _create(self, alloc: AllocInfo, ports: tuple[PortValue, ...]) -> None:
        services = alloc.services
        for task in alloc.group.tasks:
            plugin = services.drivers.dispense(task.driver)
            caps = plugin.capabilities()
            if caps.must_create_network and NetworkIsolationMode.GROUP in caps.network_isolation_modes:
                self.spec, _ = plugin.create_network(alloc.alloc_id, self.hostname(alloc, ports))
                self.owner = task.driver
                services.state.alloc_update(alloc.alloc_id, network=json.dumps(self._json(ports)))
                services.event("group", f"network created by the {task.driver} driver")
                return
        drivers = ", ".join(sorted({t.driver for t in alloc.group.tasks}))
        raise NetworkRefused(
            f'group "{alloc.group.name}": network mode "bridge" needs a task driver that creates group networks, and '
            f'none of {drivers} does; use docker or exec, or mode = "host"'
        )

    @staticmethod
    def hostname(alloc: AllocInfo, ports: tuple[PortValue, ...]) -> str:
        """``network.hostname`` with the allocation's ``${…}`` filled in; refused (with the value it
        came to) when that is no DNS name, since it reaches the driver's hosts file and UTS name."""
        written = alloc.group.network_hostname
        if not written:
            return ""
        env = taskenv.for_alloc(
            alloc.job,
            alloc.group,
            taskenv.Alloc(id=alloc.alloc_id, index=alloc.index, dir=alloc.alloc_dir, ports=ports),
            node=alloc.services.node(),
        )
        where = f'group "{alloc.group.name}" network.hostname {show(written)}'
        unknown = env.unresolved(written)
        if unknown:
            raise NetworkRefused(f"{where} names what an allocation does not know: {', '.join(unknown)}")
        hostname = env.replace(written)
        why = hostname_problem(hostname)
        if why is not None:
            raise NetworkRefused(f"{where} came to {show(hostname)}, which is {why}")
        return hostname

    def _json(self, ports: tuple[PortValue, ...]) -> dict[str, Any]:
        assert self.spec is not None
        hosts = self.spec.hosts
        return {"owner": self.owner, "mode": self.spec.mode.value, "path": self.spec.path, "labels": self.spec.labels,
                "hosts": [hosts.hostname, hosts.address] if hosts is not None else None,
                "ports": ports_json(ports)}  # fmt: skip

    def _restore(self, saved: str | None) -> None:
        if not saved:
            return
        data = json.loads(saved)
        if "owner" not in data:
            return  # only the ports hook's record: a host-mode group
        self.owner = data["owner"]
        hosts = HostsConfig(*data["hosts"]) if data.get("hosts") else None
        self.spec = NetworkIsolationSpec(NetworkIsolationMode(data["mode"]), data["path"], dict(data["labels"]), hosts)

    def postrun(self, req: AllocPostrunRequest) -> AllocPostrunResponse:
        if self.spec is None:
            return AllocPostrunResponse()
        alloc = req.alloc
        try:
            alloc.services.drivers.dispense(self.owner).destroy_network(alloc.alloc_id, self.spec)
            self.spec = None
        except DriverSDKError as err:
            alloc.services.event("group", f"network removal failed: {err}")
        return AllocPostrunResponse()
