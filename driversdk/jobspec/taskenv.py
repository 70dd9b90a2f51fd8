"""A task's environment as Nomad's client builds it, and runtime interpolation of ``${…}``.

Pure: nothing here touches the host. :func:`build` returns the variables Nomad's client gives a
task (``NOMAD_ALLOC_DIR``, ``NOMAD_TASK_DIR``, ``NOMAD_SECRETS_DIR``, ``NOMAD_ALLOC_ID``,
``NOMAD_SHORT_ALLOC_ID``, ``NOMAD_ALLOC_INDEX``, ``NOMAD_ALLOC_NAME``, ``NOMAD_JOB_ID``,
``NOMAD_JOB_NAME``, ``NOMAD_JOB_PARENT_ID``, ``NOMAD_GROUP_NAME``, ``NOMAD_TASK_NAME``,
``NOMAD_NAMESPACE``, ``NOMAD_DC``, ``NOMAD_REGION``, ``NOMAD_CPU_LIMIT``, ``NOMAD_MEMORY_LIMIT``,
``NOMAD_MEMORY_MAX_LIMIT``, ``NOMAD_META_*``, per port ``NOMAD_IP_*``, ``NOMAD_PORT_*``,
``NOMAD_ADDR_*``, ``NOMAD_HOST_IP_*``, ``NOMAD_HOST_PORT_*``, ``NOMAD_HOST_ADDR_*``,
``NOMAD_ALLOC_PORT_*``, and ``CSI_ENDPOINT`` for a ``csi_plugin`` task), then the task's own
``env`` with its values interpolated. :class:`TaskEnv` replaces ``${NAME}``, ``${attr.x}``,
``${node.x}``, ``${meta.x}`` and ``${env["X"]}`` in strings and nested values; anything it does
not know stays as written, as Nomad leaves it.

Directories are the in-task paths (``/alloc``, ``/local``, ``/secrets``) for drivers that
isolate the filesystem (docker, exec) and the host paths under the allocation dir otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driversdk.jobspec.job import Group, Job, Task

CSI_SOCKET = "csi.sock"
DRY_ALLOC_ID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Node:
    """What the client knows of its node: ``attr.*`` attributes, ``meta.*`` and ``node.*``."""

    id: str = ""
    name: str = ""
    datacenter: str = "dc1"
    region: str = "global"
    pool: str = "default"
    node_class: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)  # "kernel.name" -> "linux"
    meta: Mapping[str, str] = field(default_factory=dict)

    def lookup(self) -> dict[str, str]:
        """The ``${…}`` keys of the node, as Nomad's client names them."""
        out = {f"attr.{k}": v for k, v in self.attributes.items()}
        out.update({f"meta.{k}": v for k, v in self.meta.items()})
        out.update(
            {
                "node.unique.id": self.id,
                "node.unique.name": self.name,
                "node.datacenter": self.datacenter,
                "node.region": self.region,
                "node.pool": self.pool,
                "node.class": self.node_class,
            }
        )
        return out


@dataclass(frozen=True)
class PortValue:
    """A port given to the allocation: ``value`` on the host, ``to`` inside (0: the same)."""

    label: str
    value: int
    to: int = 0
    host_ip: str = "127.0.0.1"


@dataclass(frozen=True)
class Alloc:
    """The allocation the task runs in."""

    id: str = DRY_ALLOC_ID
    index: int = 0
    dir: str = ""  # the allocation dir on the host, for drivers without filesystem isolation
    parent_job_id: str = ""
    ports: Sequence[PortValue] = ()


_INVALID = re.compile(r"[^A-Za-z0-9_]")


def clean_key(key: str) -> str:
    """A label or meta key made safe as part of an environment variable name."""
    return _INVALID.sub("_", key)


def _dirs(alloc: Alloc, task: Task, fs_isolation: bool) -> tuple[str, str, str]:
    if fs_isolation or not alloc.dir:
        return "/alloc", "/local", "/secrets"
    base = alloc.dir.rstrip("/")
    return f"{base}/alloc", f"{base}/{task.name}/local", f"{base}/{task.name}/secrets"


def build(
    job: Job,
    group: Group,
    task: Task,
    alloc: Alloc | None = None,
    *,
    node: Node | None = None,
    fs_isolation: bool = True,
) -> TaskEnv:
    """The task's environment (the client's variables, then the task's interpolated ``env``)."""
    alloc = alloc or Alloc()
    node = node or Node()
    alloc_dir, task_dir, secrets_dir = _dirs(alloc, task, fs_isolation)
    env: dict[str, str] = {
        "NOMAD_ALLOC_DIR": alloc_dir,
        "NOMAD_TASK_DIR": task_dir,
        "NOMAD_SECRETS_DIR": secrets_dir,
        "NOMAD_TASK_NAME": task.name,
        "NOMAD_CPU_LIMIT": str(task.cpu),
        "NOMAD_MEMORY_LIMIT": str(task.memory),
    }
    if task.memory_max:
        env["NOMAD_MEMORY_MAX_LIMIT"] = str(task.memory_max)
    # Meta merges job, then group, then task; each key as written and upper-cased.
    env.update(_alloc_vars(job, group, alloc, node, {**job.meta, **group.meta, **task.meta}))
    if task.csi_plugin is not None:
        env["CSI_ENDPOINT"] = f"unix://{task.csi_plugin.mount_dir.rstrip('/')}/{CSI_SOCKET}"
    base = TaskEnv(env, node.lookup())
    # The task's own env is interpolated against what is known so far, and may not replace the
    # client's variables' meaning for later keys (Nomad applies it last, values interpolated).
    for key, value in task.env.items():
        env[key] = base.replace(value)
    return TaskEnv(env, node.lookup())


def for_alloc(job: Job, group: Group, alloc: Alloc, *, node: Node | None = None) -> TaskEnv:
    """The allocation's environment, before any task: what Nomad interpolates group-level
    values with (``network.hostname``): the allocation, job and group, their meta, the ports and
    the node, but no task's dirs, name or limits."""
    node = node or Node()
    return TaskEnv(_alloc_vars(job, group, alloc, node, {**job.meta, **group.meta}), node.lookup())


def _alloc_vars(job: Job, group: Group, alloc: Alloc, node: Node, meta: Mapping[str, str]) -> dict[str, str]:
    env: dict[str, str] = {
        "NOMAD_ALLOC_ID": alloc.id,
        "NOMAD_SHORT_ALLOC_ID": alloc.id[:8],
        "NOMAD_ALLOC_INDEX": str(alloc.index),
        "NOMAD_ALLOC_NAME": f"{job.name}.{group.name}[{alloc.index}]",
        "NOMAD_JOB_ID": job.id or job.name,
        "NOMAD_JOB_NAME": job.name,
        "NOMAD_GROUP_NAME": group.name,
        "NOMAD_NAMESPACE": job.namespace,
        "NOMAD_DC": node.datacenter,
        "NOMAD_REGION": job.region or node.region,
    }
    if alloc.parent_job_id:
        env["NOMAD_JOB_PARENT_ID"] = alloc.parent_job_id
    for key, value in meta.items():
        env[f"NOMAD_META_{clean_key(key)}"] = value
        env[f"NOMAD_META_{clean_key(key).upper()}"] = value
    for port in alloc.ports:
        label = clean_key(port.label)
        inside = port.to or port.value
        env[f"NOMAD_IP_{label}"] = port.host_ip
        env[f"NOMAD_PORT_{label}"] = str(inside)
        env[f"NOMAD_ALLOC_PORT_{label}"] = str(inside)
        env[f"NOMAD_ADDR_{label}"] = f"{port.host_ip}:{port.value}"
        env[f"NOMAD_HOST_IP_{label}"] = port.host_ip
        env[f"NOMAD_HOST_PORT_{label}"] = str(port.value)
        env[f"NOMAD_HOST_ADDR_{label}"] = f"{port.host_ip}:{port.value}"
    return env


def dry(job: Job, group: Group, task: Task, *, fs_isolation: bool = True) -> TaskEnv:
    """The environment ``validate`` interpolates with: a placeholder allocation whose ports are
    the group's static ports (dynamic ones are known only at run time and stay as written)."""
    ports = [PortValue(p.label, p.static, p.to) for p in group.ports if p.static]
    return build(job, group, task, Alloc(ports=ports), fs_isolation=fs_isolation)


_REF = re.compile(r"\$\{([^{}]+)\}")
_ENV_INDEX = re.compile(r'^env\[\s*"([^"]*)"\s*\]$')


class TaskEnv:
    """Variables and node facts, and interpolation of ``${…}`` with them."""

    def __init__(self, env: Mapping[str, str], node: Mapping[str, str] | None = None) -> None:
        self.env = dict(env)
        self.node = dict(node or {})

    def lookup(self, expr: str) -> str | None:
        key = expr.strip()
        if key in self.env:
            return self.env[key]
        if key in self.node:
            return self.node[key]
        match = _ENV_INDEX.match(key)
        if match and match.group(1) in self.env:
            return self.env[match.group(1)]
        return None

    def replace(self, text: str) -> str:
        """``text`` with every known ``${…}`` replaced; unknown ones are left as written."""
        if "${" not in text:
            return text

        def one(m: re.Match[str]) -> str:
            value = self.lookup(m.group(1))
            return m.group(0) if value is None else value

        return _REF.sub(one, text)

    def interpolate(self, value: Any) -> Any:
        """Strings inside lists and maps (a driver's config) interpolated; other values kept."""
        if isinstance(value, str):
            return self.replace(value)
        if isinstance(value, list):
            return [self.interpolate(v) for v in value]
        if isinstance(value, dict):
            out = type(value)() if type(value) is not dict else {}
            if hasattr(value, "lines"):
                out.lines = dict(value.lines)  # type: ignore[attr-defined]
            for k, v in value.items():
                out[k] = self.interpolate(v)
            return out
        return value

    def unresolved(self, text: str) -> list[str]:
        """The ``${…}`` references in ``text`` this environment does not know."""
        return [m.group(1) for m in _REF.finditer(text) if self.lookup(m.group(1)) is None]
