"""Removing what a killed plugin left half-made: the exec driver's dangling-task reconciler.

A plugin SIGKILLed in the middle of StartTask never hands the host a handle, so nobody will
ever call RecoverTask or DestroyTask for that task: its runc container, bundle, cgroups and the
supervisor would stay forever. A plugin killed in the middle of CreateNetwork likewise leaves a
namespace and a veth nobody will destroy. Each plugin therefore runs a background pass every
``period`` (as Nomad's docker driver reconciles dangling containers) that removes a task only when
all of these hold, which keeps it safe while several plugins share a state dir and cgroup parent:

- its record (owner.py) is not in phase "started": a started task belongs to the host, which
  recovers it on a relaunched plugin (RecoverTask) or destroys it; it is never reaped here;
- it has been in its phase for longer than ``creation_grace``;
- the plugin process named as its owner (pid and start time) is gone;
- this plugin does not track it (RecoverTask also makes the recovering plugin the owner).

The task part is the kit's (:class:`driversdk.taskkit.recorded.RecordedDriver`); this module
adds what only exec holds: runc containers and the allocations' networks, which follow the same
rule with their "creating" phase (network.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

from drivers.exec import owner
from drivers.exec.network import NetworkManager
from drivers.exec.owner import TaskRecord
from drivers.exec.runc import Runc
from driversdk.errors import DriverError

log = logging.getLogger("driversdk.exec.reconcile")

DELETE_WAIT = 5.0


def remove_container(record: TaskRecord) -> list[str]:
    """Delete the task's runc container, retrying while runc still sees its init dying; returns
    ["runc container"] when there was one."""
    runc = Runc(record.runc_path, record.runc_root)
    if not runc.known(record.container_id):
        return []
    deadline = time.monotonic() + DELETE_WAIT
    while True:
        try:
            runc.delete_force(record.container_id)
            return ["runc container"]
        except DriverError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def reap_networks(networks: NetworkManager, grace: float, now: float) -> list[str]:
    """Networks whose CreateNetwork died with its plugin; returns "netns:<name>" of each."""
    removed: list[str] = []
    for net in networks.reap_abandoned(grace, now=now):
        removed.append(f"netns:{net.netns}")
        log.info(
            "reconciler: removed network namespace %s and veth %s of allocation %s whose CreateNetwork never "
            "returned (plugin pid %d gone)",
            net.netns,
            net.veth,
            net.alloc_id,
            net.owner_pid,
            extra={"alloc_id": net.alloc_id},
        )
    return removed


def remove_bundleless_containers(runtime_path: str, tasks_dir: str) -> list[str]:
    """runc containers whose bundle lies in our tasks dir but has neither record nor bundle left.

    Nothing can run or recover such a container (its config and status file are gone); it can
    only be left by a removal interrupted halfway, so it is deleted without a grace."""
    removed: list[str] = []
    prefix = tasks_dir.rstrip("/") + "/"
    try:
        bundles = Runc(runtime_path).bundles()
    except DriverError as err:
        log.warning("reconciler: cannot list runc containers: %s", err.message)
        return removed
    for cid, bundle in bundles.items():
        if not bundle.startswith(prefix) or os.path.exists(bundle) or os.path.exists(owner.record_path(bundle)):
            continue
        with contextlib.suppress(DriverError):
            Runc(runtime_path).delete_force(cid)
            removed.append(cid)
            log.info("reconciler: removed runc container %s whose bundle %s is gone", cid, bundle)
    return removed
