"""Job files: job / group / task, driver config, resources, volumes, volume mounts, csi_plugin.

A job file is evaluated as Nomad's jobspec2 evaluates HCL2 (:mod:`driversdk.jobspec.hcl`), checked
against the whole job specification (:mod:`driversdk.jobspec.jobschema`), then turned into
dataclasses with every structural problem collected; :func:`static_problems` then applies the
submit-time rules Nomad applies (drivers-and-mounts reference §3.6).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driversdk.durations import parse_duration
from driversdk.errors import ConfigError
from driversdk.jobspec import artifacts, jobhcl1, jobjson, jobschema, restarts, templates
from driversdk.jobspec.hcl import Body, HCLSyntaxError, Inputs
from driversdk.jobspec.hclload import is_blocks, labelled, read_text, single, syntax_error
from driversdk.jobspec.problems import Problem, ValidationFailed
from driversdk.mounts import Propagation, UnknownPropagationError
from driversdk.paths import PATH_MAX, check_name, show
from driversdk.signals import UnknownSignalError, signal_name

# Nomad puts no upper bound on count; one machine running a thousand copies of a group is already
# far past what the runner is for, and each allocation is a directory, processes and plugins.
MAX_COUNT = 1000
# Nomad's MinResources: cpu >= 1 MHz (we have no `cores`), memory >= 10 MB.
MIN_CPU = 1
MIN_EPHEMERAL_DISK_MB = 10  # Nomad's EphemeralDisk.Validate
PORT_MAX = 65535
MIN_MEMORY_MB = 10
# cpu becomes the cgroup's cpu shares, which Linux (and runc) cap at 262144.
MAX_CPU = 262144
# memory becomes a byte limit in an int64 on the wire; 1 PiB is more than any host has.
MAX_MEMORY_MB = 1 << 30
MEMORY_NO_LIMIT = -1  # memory_max = -1: no hard memory limit (Nomad's memoryNoLimit)

HOST_ACCESS_MODES = ("", "single-node-reader-only", "single-node-writer", "single-node-single-writer",
                     "single-node-multi-writer")  # fmt: skip
CSI_ACCESS_MODES = ("single-node-reader-only", "single-node-writer", "multi-node-reader-only",
                    "multi-node-single-writer", "multi-node-multi-writer")  # fmt: skip


@dataclass
class VolumeRequest:
    name: str
    type: str
    source: str
    read_only: bool = False
    per_alloc: bool = False
    sticky: bool = False
    access_mode: str = ""
    attachment_mode: str = ""
    fs_type: str = ""
    mount_flags: tuple[str, ...] = ()
    has_mount_options: bool = False


@dataclass
class VolumeMount:
    volume: str
    destination: str
    read_only: bool = False
    propagation_mode: str = "private"
    selinux_label: str = ""


@dataclass
class CSIPluginConfig:
    id: str
    type: str
    mount_dir: str = "/csi"
    stage_publish_base_dir: str = "/local/csi"
    health_timeout: str = "30s"


@dataclass
class Port:
    """A group network port: ``static`` 0 means dynamic; ``to`` is the port inside the task."""

    label: str
    static: int = 0
    to: int = 0
    host_network: str = "default"


@dataclass
class Template:
    """A task's ``template`` block (what ``driversdk run`` renders: :mod:`driversdk.jobspec.templates`)."""

    destination: str
    data: str = ""
    source: str = ""
    perms: str = "0644"
    uid: int | None = None
    gid: int | None = None
    left_delimiter: str = "{{"
    right_delimiter: str = "}}"
    env: bool = False
    # Consul/Vault/Nomad functions the template calls: not rendered by `run` (noted by validate).
    cluster_functions: tuple[str, ...] = ()


@dataclass
class Artifact:
    """A task's ``artifact`` block (fetched before the task starts: :mod:`driversdk.jobspec.artifacts`)."""

    source: str
    destination: str = "local/"  # Nomad's default
    mode: str = "any"
    options: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    insecure: bool = False


@dataclass
class Task:
    name: str
    driver: str
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    lifecycle_hook: str = ""
    lifecycle_sidecar: bool = False
    # Nomad's ``leader``: when it ends, the allocation's other tasks are stopped (``Leader Task Dead``).
    leader: bool = False
    cpu: int = 100
    memory: int = 300
    memory_max: int = 0
    volume_mounts: list[VolumeMount] = field(default_factory=list)
    csi_plugin: CSIPluginConfig | None = None
    kill_timeout: str = "5s"
    kill_signal: str = ""
    user: str = ""
    logs_disabled: bool = False
    logs_max_files: int = 10
    logs_max_file_size: int = 10
    # The task's own ``restart`` block as written (merged with the group's by driversdk.jobspec.restarts).
    restart: dict[str, Any] | None = None
    templates: list[Template] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)


@dataclass
class Group:
    name: str
    count: int = 1
    volumes: dict[str, VolumeRequest] = field(default_factory=dict)
    tasks: list[Task] = field(default_factory=list)
    network_mode: str = "host"
    network_hostname: str = ""  # as written: interpolated with the allocation's environment
    ports: list[Port] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)
    # A Connect gateway group: Nomad injects its Envoy task; `run` starts none.
    gateway: bool = False
    restart: dict[str, Any] | None = None  # the group's ``restart`` block as written
    ephemeral_disk_mb: int = 300  # Nomad's default ``ephemeral_disk { size }``: the tasks' log budget
    # Nomad's group ``max_run_duration`` in seconds (0: none): the allocation is stopped when it expires.
    max_run_duration: float = 0.0


@dataclass
class Job:
    file: str
    name: str
    type: str = "service"
    namespace: str = "default"
    groups: list[Group] = field(default_factory=list)
    id: str = ""
    region: str = "global"
    datacenters: tuple[str, ...] = ()
    meta: dict[str, str] = field(default_factory=dict)
    # The ``periodic`` block as written (None: not a periodic job): refused by `run` (no agent launches it).
    periodic: dict[str, Any] | None = None
    # Keys Nomad knows that `driversdk run` does not act on, each once ("group.service: …").
    notes: list[str] = field(default_factory=list)


class _Parser:
    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []

    def text(self, value: Any, what: str, **where: str) -> str:
        if value is None:
            return ""
        if isinstance(value, bool | int | float):
            return str(value).lower() if isinstance(value, bool) else str(value)
        if not isinstance(value, str):
            self.problems.append(Problem(self.file, f"{what} must be a string", **where))
            return ""
        return value

    def flag(self, value: Any, what: str, **where: str) -> bool:
        if value is None:
            return False
        if isinstance(value, bool):
            return value
        self.problems.append(Problem(self.file, f"{what} must be true or false, got {value!r}", **where))
        return False

    def number(self, value: Any, default: int, what: str, **where: str) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problems.append(Problem(self.file, f"{what} must be a number, got {_shown(value)}", **where))
            return default
        if isinstance(value, float) and not value.is_integer():  # also inf and nan
            self.problems.append(Problem(self.file, f"{what} must be a whole number, got {value!r}", **where))
            return default
        return int(value)

    def name(self, value: str, what: str, **where: str) -> None:
        """Names become directory and file names: refuse any that is not one safe component."""
        problem = check_name(value, what)
        if problem is not None:
            self.problems.append(Problem(self.file, problem, **where))

    def blocks(self, body: dict[str, Any], key: str, **where: str) -> bool:
        """Whether ``key`` is absent or written as blocks; ``key = 5`` is reported, not ignored."""
        value = body.get(key)
        if value is None or is_blocks(value) or isinstance(value, dict):
            return True
        self.problems.append(Problem(self.file, f"{key} must be a block ({key} {{ … }}), not {_shown(value)}", **where))
        return False

    def strings(self, value: Any, what: str, **where: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problems.append(Problem(self.file, f"{what} must be a list of strings", **where))
            return ()
        return tuple(value)

    def job(self, data: dict[str, Any]) -> Job:
        jobs = labelled(data.get("job"))
        if len(jobs) != 1:
            self.problems.append(Problem(self.file, f"a job file needs exactly one job block, found {len(jobs)}"))
            return Job(self.file, "")
        name, body = jobs[0]
        job = Job(self.file, name)
        shown = name
        self.name(name, "the job name", job=shown)
        job.region = self.text(body.get("region"), "region", job=shown) or "global"
        job.datacenters = self.strings(body.get("datacenters"), "datacenters", job=shown)
        job.meta = {str(k): self.text(v, f"meta.{k}", job=shown) for k, v in single(body.get("meta")).items()}
        job.type = self.text(body.get("type"), "type", job=shown) or "service"
        if "periodic" in body:
            job.periodic = dict(single(body.get("periodic")))
        job.namespace = self.text(body.get("namespace"), "namespace", job=shown) or "default"
        # The namespace is part of CSI staging paths.
        self.name(job.namespace, "namespace", job=shown)
        if body.get("id") is not None:
            job.id = self.text(body.get("id"), "id", job=shown)
            self.name(job.id, "the job id", job=shown)
        seen: dict[str, int] = {}
        for index, (gname, gbody) in enumerate(labelled(body.get("group"))):
            if gname in seen:
                # Nomad: "Job task group %d redefines '%s' from group %d".
                self.problems.append(
                    Problem(
                        self.file,
                        f"group {index + 1} redefines {show(gname)} from group {seen[gname] + 1}; "
                        "give each group its own name",
                        job=shown,
                    )
                )
            seen.setdefault(gname, index)
            job.groups.append(self.group(job, gname, gbody))
        if not job.groups:
            self.problems.append(
                Problem(self.file, "the job has no group; add a group with a task", job=name, field="group")
            )
        return job

    def group(self, job: Job, name: str, body: dict[str, Any]) -> Group:
        where = {"job": job.name, "group": name}
        self.name(name, "the group name", **where)
        group = Group(name, count=self.number(body.get("count"), 1, "count", **where))
        group.meta = {str(k): self.text(v, f"meta.{k}", **where) for k, v in single(body.get("meta")).items()}
        if group.count < 0:
            self.problems.append(Problem(self.file, f"count can't be negative, got {group.count}", **where))
        elif group.count > MAX_COUNT:
            self.problems.append(
                Problem(
                    self.file,
                    f"count {group.count} is more than this runner starts on one machine (at most {MAX_COUNT})",
                    **where,
                )
            )
        network = single(body.get("network"))
        group.network_mode = self.text(network.get("mode"), "network.mode", **where) or "host"
        group.network_hostname = self.text(network.get("hostname"), "network.hostname", **where)
        if group.network_hostname and "${" not in group.network_hostname:
            # Nomad checks a literal hostname at submit time; an interpolated one when it is used.
            why = hostname_problem(group.network_hostname)
            if why is not None:
                message = f"{show(group.network_hostname)} is {why}"
                self.problems.append(Problem(self.file, message, **{**where, "field": "network.hostname"}))
        for label, pbody in labelled(network.get("port")):
            group.ports.append(
                Port(
                    label,
                    static=self.number(pbody.get("static"), 0, f"network.port {show(label)}.static", **where),
                    to=self.number(pbody.get("to"), 0, f"network.port {show(label)}.to", **where),
                    host_network=self.text(pbody.get("host_network"), "host_network", **where) or "default",
                )
            )
            self.problems += [Problem(self.file, m, **where) for m in _port_problems(group.ports[-1])]
        if body.get("max_run_duration") is not None:
            group.max_run_duration = self.max_run_duration(body.get("max_run_duration"), **where)
        disk = single(body.get("ephemeral_disk"))
        group.ephemeral_disk_mb = self.number(disk.get("size"), 300, "ephemeral_disk.size", **where)
        if "restart" in body:
            group.restart = dict(single(body.get("restart")))
            self.restart_problems(job.type, group.restart, None, **where)
        for service in body.get("service") or []:
            connect = single(service.get("connect")) if isinstance(service, dict) else {}
            if connect.get("gateway"):
                group.gateway = True
        for vname, vbody in labelled(body.get("volume")):
            vwhere = {**where, "field": f"volume {show(vname)}"}
            self.name(vname, "the volume name", **vwhere)
            if vname in group.volumes:
                self.problems.append(
                    Problem(self.file, "volume is declared twice in this group; give each its own name", **vwhere)
                )
            opts = single(vbody.get("mount_options"))
            group.volumes[vname] = VolumeRequest(
                name=vname,
                type=self.text(vbody.get("type"), "type", **vwhere),
                source=self.text(vbody.get("source"), "source", **vwhere),
                read_only=self.flag(vbody.get("read_only"), "read_only", **vwhere),
                per_alloc=self.flag(vbody.get("per_alloc"), "per_alloc", **vwhere),
                sticky=self.flag(vbody.get("sticky"), "sticky", **vwhere),
                access_mode=self.text(vbody.get("access_mode"), "access_mode", **vwhere),
                attachment_mode=self.text(vbody.get("attachment_mode"), "attachment_mode", **vwhere),
                fs_type=self.text(opts.get("fs_type"), "fs_type", **vwhere),
                mount_flags=self.strings(opts.get("mount_flags"), "mount_options.mount_flags", **vwhere),
                has_mount_options="mount_options" in vbody,
            )
            source = group.volumes[vname].source
            if source:
                self.name(source, "source", **vwhere)
        seen: dict[str, int] = {}
        for index, (tname, tbody) in enumerate(labelled(body.get("task"))):
            if tname in seen:
                # Nomad: "Task %d redefines '%s' from task %d".
                self.problems.append(
                    Problem(
                        self.file,
                        f"task {index + 1} redefines {show(tname)} from task {seen[tname] + 1}; "
                        "give each task in a group its own name",
                        **where,
                    )
                )
            seen.setdefault(tname, index)
            group.tasks.append(self.task(job, group, tname, tbody))
        if not group.tasks and not group.gateway:
            self.problems.append(Problem(self.file, "the group has no task", **where, field="task"))
        return group

    def task(self, job: Job, group: Group, name: str, body: dict[str, Any]) -> Task:
        where = {"job": job.name, "group": group.name, "task": name}
        self.name(name, "the task name", **where)
        if "\\" in name:
            # Nomad refuses both slashes in task names, as the name becomes a directory.
            self.problems.append(Problem(self.file, "the task name cannot include slashes (\\)", **where))
        driver = self.text(body.get("driver"), "driver", **where)
        if not driver:
            self.problems.append(
                Problem(self.file, 'missing driver; set driver = "docker" or another', **where, field="driver")
            )
        else:
            # The driver name is looked up as a file in the client's plugin_dir.
            self.name(driver, "driver", **where)
        resources = single(body.get("resources"))
        logs = single(body.get("logs"))
        task = Task(
            name=name,
            driver=driver,
            config=single(body.get("config")),
            env={str(k): self.text(v, f"env.{k}", **where) for k, v in single(body.get("env")).items()},
            meta={str(k): self.text(v, f"meta.{k}", **where) for k, v in single(body.get("meta")).items()},
            lifecycle_hook=self.text(single(body.get("lifecycle")).get("hook"), "lifecycle.hook", **where),
            lifecycle_sidecar=self.flag(single(body.get("lifecycle")).get("sidecar"), "lifecycle.sidecar", **where),
            leader=self.flag(body.get("leader"), "leader", **where),
            cpu=self.number(resources.get("cpu"), 100, "resources.cpu", **where),
            memory=self.number(resources.get("memory"), 300, "resources.memory", **where),
            memory_max=self.number(resources.get("memory_max"), 0, "resources.memory_max", **where),
            kill_timeout=self.text(body.get("kill_timeout"), "kill_timeout", **where) or "5s",
            kill_signal=self.text(body.get("kill_signal"), "kill_signal", **where),
            user=self.text(body.get("user"), "user", **where),
            logs_disabled=self.flag(logs.get("disabled"), "logs.disabled", **where),
            logs_max_files=self.number(logs.get("max_files"), 10, "logs.max_files", **where),
            logs_max_file_size=self.number(logs.get("max_file_size"), 10, "logs.max_file_size", **where),
        )
        if "lifecycle" in body and task.lifecycle_hook not in ("prestart", "poststart", "poststop"):
            # Nomad's TaskLifecycleConfig.Validate.
            said = f"invalid hook: {task.lifecycle_hook}" if task.lifecycle_hook else "no lifecycle hook provided"
            self.problems.append(Problem(self.file, f'lifecycle: {said}; use "prestart", "poststart" or "poststop"',
                                         **where, field="lifecycle.hook"))  # fmt: skip
        if "restart" in body:
            task.restart = dict(single(body.get("restart")))
            self.restart_problems(job.type, group.restart, task.restart, **where)
        task.templates = self.templates(body, **where)
        task.artifacts = self.artifacts(body, **where)
        mounts: list[dict[str, Any]] = body["volume_mount"] if is_blocks(body.get("volume_mount")) else []
        for i, mbody in enumerate(mounts):
            mwhere = {**where, "field": f"volume_mount[{i}]"}
            task.volume_mounts.append(
                VolumeMount(
                    volume=self.text(mbody.get("volume"), "volume", **mwhere),
                    destination=self.text(mbody.get("destination"), "destination", **mwhere),
                    read_only=self.flag(mbody.get("read_only"), "read_only", **mwhere),
                    propagation_mode=self.text(mbody.get("propagation_mode"), "propagation_mode", **mwhere)
                    or "private",
                    selinux_label=self.text(mbody.get("selinux_label"), "selinux_label", **mwhere),
                )
            )
        if "csi_plugin" in body:
            cbody = single(body.get("csi_plugin"))
            cwhere = {**where, "field": "csi_plugin"}
            task.csi_plugin = CSIPluginConfig(
                id=self.text(cbody.get("id"), "id", **cwhere),
                type=self.text(cbody.get("type"), "type", **cwhere),
                mount_dir=self.text(cbody.get("mount_dir"), "mount_dir", **cwhere) or "/csi",
                stage_publish_base_dir=self.text(
                    cbody.get("stage_publish_base_dir"), "stage_publish_base_dir", **cwhere
                )
                or "/local/csi",
                health_timeout=self.text(cbody.get("health_timeout"), "health_timeout", **cwhere) or "30s",
            )
            if task.csi_plugin.id:  # empty: reported by the static rules, in Nomad's words
                # The plugin's directories and socket are named after its id.
                self.name(task.csi_plugin.id, "csi_plugin.id", **cwhere)
        return task

    def restart_problems(
        self, job_type: str, in_group: dict[str, Any] | None, in_task: dict[str, Any] | None, **where: str
    ) -> None:
        """Nomad's RestartPolicy.Validate on the policy this block gives (merged with the defaults)."""
        try:
            policy = restarts.policy_for(job_type, in_group, in_task)
        except (ConfigError, TypeError, ValueError) as err:
            self.problems.append(Problem(self.file, str(err), **where, field="restart"))
            return
        for sentence in restarts.policy_problems(policy):
            self.problems.append(Problem(self.file, sentence, **where, field="restart"))

    def max_run_duration(self, value: Any, **where: str) -> float:
        text = self.text(value, "max_run_duration", **where)
        try:
            return parse_duration(text, "max_run_duration")  # 0: no limit
        except ConfigError:
            return 0.0  # the schema reported it, in the words it uses for every duration

    def artifacts(self, body: dict[str, Any], **where: str) -> list[Artifact]:
        out = []
        blocks: list[dict[str, Any]] = body["artifact"] if is_blocks(body.get("artifact")) else []
        for i, abody in enumerate(blocks):
            awhere = {**where, "field": f"artifact[{i}]"}
            options = {str(k): self.text(v, f"options.{k}", **awhere) for k, v in single(abody.get("options")).items()}
            headers = {str(k): self.text(v, f"headers.{k}", **awhere) for k, v in single(abody.get("headers")).items()}
            a = Artifact(
                source=self.text(abody.get("source"), "source", **awhere),
                destination=self.text(abody.get("destination"), "destination", **awhere) or "local/",
                mode=(self.text(abody.get("mode"), "mode", **awhere) or "any").lower(),
                options=options,
                headers=headers,
                insecure=self.flag(abody.get("insecure"), "insecure", **awhere),
            )
            problems = []
            if "${" not in a.source and (why := artifacts.source_problem(a.source)) is not None:
                problems.append(why)
            if "${" not in a.destination and artifacts.destination_parts(a.destination) is None:
                problems.append(f"destination {show(a.destination)} escapes the task dir; use a path inside it "
                                'such as "local/"')  # fmt: skip
            for key, value in options.items():
                if key not in artifacts.OPTIONS:
                    problems.append(f"options.{key} is not supported by driversdk run (only checksum and archive)")
                elif key == "checksum" and "${" not in value and (why := artifacts.checksum_problem(value)):
                    problems.append(why)
                elif key == "archive" and value.lower() not in ("true", "false"):
                    problems.append(f"options.archive must be true or false, got {_shown(value)}")
            self.problems += [Problem(self.file, p, **awhere) for p in problems]
            out.append(a)
        return out

    def templates(self, body: dict[str, Any], **where: str) -> list[Template]:
        out = []
        blocks: list[dict[str, Any]] = body["template"] if is_blocks(body.get("template")) else []
        for i, tbody in enumerate(blocks):
            twhere = {**where, "field": f"template[{i}]"}
            uid, gid = tbody.get("uid"), tbody.get("gid")
            t = Template(
                destination=self.text(tbody.get("destination"), "destination", **twhere),
                data=self.text(tbody.get("data"), "data", **twhere),
                source=self.text(tbody.get("source"), "source", **twhere),
                perms=self.text(tbody.get("perms"), "perms", **twhere) or "0644",
                uid=None if uid is None else self.number(uid, -1, "uid", **twhere),
                gid=None if gid is None else self.number(gid, -1, "gid", **twhere),
                left_delimiter=self.text(tbody.get("left_delimiter"), "left_delimiter", **twhere) or "{{",
                right_delimiter=self.text(tbody.get("right_delimiter"), "right_delimiter", **twhere) or "}}",
                env=self.flag(tbody.get("env"), "env", **twhere),
            )
            # Nomad's Template.Validate, in its words.
            if not t.source and not t.data:
                self.problems.append(Problem(self.file, "Must specify a source path or have an embedded template",
                                             **twhere))  # fmt: skip
            if not t.destination:
                self.problems.append(Problem(self.file, "Must specify a destination for the template", **twhere))
            if not _is_octal(t.perms):
                self.problems.append(Problem(self.file, f"Failed to parse {t.perms!r} as octal", **twhere))
            elif (why := templates.perms_problem(t.perms, t.destination)) is not None:
                self.problems.append(Problem(self.file, why, **twhere))
            if t.data:
                t.cluster_functions = tuple(templates.cluster_functions(t.data, t.left_delimiter, t.right_delimiter))
                if not t.cluster_functions:
                    try:
                        templates.parse(t.data, t.left_delimiter, t.right_delimiter)
                    except templates.TemplateError as err:
                        self.problems.append(Problem(self.file, f"template data: {err}", **twhere))
            out.append(t)
        return out


def _is_octal(text: str) -> bool:
    try:
        return 0 <= int(text, 8) <= 0o7777
    except ValueError:
        return False


# Blocks the job schema calls not acted on that `driversdk run` acts on itself: no note for them.
ACTED_BY_RUN = ("restart", "lifecycle", "template")


def _acted_by_run(path: str) -> bool:
    parts = path.split(".")
    return parts[-1] in ACTED_BY_RUN and parts[:-1] in (["group"], ["group", "task"], ["task"])


def _template_notes(job: Job) -> list[str]:
    """One note for the templates `run` does not render (they need a Consul, Vault or Nomad server)."""
    for group in job.groups:
        for task in group.tasks:
            for t in task.templates:
                if t.cluster_functions:
                    uses = ", ".join(t.cluster_functions)
                    return [f"template (first in task {show(task.name)}, uses {uses}): not acted on by driversdk run"]
    return []


def _shown(value: Any) -> str:
    return show(value) if isinstance(value, str) else show(repr(value))[1:-1]


def _printable(text: str) -> str:
    """Text from the file (an expression, a value) with control characters escaped and shortened,
    so it can neither forge lines of the output nor flood it."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= 300 else out[:300] + "…"


def _wrap_job_tasks(job_body: dict[str, Any]) -> None:
    """A task written directly under job becomes a group of that name holding it, as Nomad does."""
    tasks = job_body.pop("task", None)
    if not is_blocks(tasks):
        if tasks is not None:
            job_body["task"] = tasks  # reported by the schema
        return
    groups = job_body.setdefault("group", [])
    for item in tasks:
        for name, body in item.items():
            group = Body(getattr(body, "line", 0))
            group["task"] = [{name: body}]
            groups.append({name: group})


def evaluate_job(path: str | Path, inputs: Inputs | None = None) -> tuple[dict[str, Any], list[Problem], list[str]]:
    """A job file evaluated and checked against Nomad's schema: (body, problems, notes).

    Unreadable files and HCL syntax errors raise; evaluation errors come back as problems (and
    then the body is empty: nothing after them can be trusted)."""
    return evaluate_text(str(path), read_text(path), inputs)


def evaluate_text(
    file: str, text: str, inputs: Inputs | None = None
) -> tuple[dict[str, Any], list[Problem], list[str]]:
    """:func:`evaluate_job` of a job's text that is not a file (sent over the API); ``file`` is the
    name its problems carry. File functions read what ``inputs.files`` allows: nothing by default."""
    try:
        # A job in Nomad's API format (JSON) or in HCL1 (-hcl1) becomes the body its HCL twin evaluates to.
        document = (
            jobjson.document(file, text) if jobjson.is_json(text, inputs) else jobhcl1.document(file, text, inputs)
        )
    except HCLSyntaxError as err:
        raise syntax_error(file, err) from None
    problems = [
        Problem.at(err.line, file, _printable(err.reason), field=_printable(err.expr)) for err in document.errors
    ]
    notes = list(document.warnings)
    if problems or document.body is None:
        return {}, problems, notes
    data: dict[str, Any] = document.body
    for name, body in labelled(data.get("job")):
        result = jobschema.check(body, {"job": name})
        _wrap_job_tasks(body)
        for finding in result.problems:
            problems.append(Problem.at(finding.line, file, finding.message, **finding.where, field=finding.path))
        notes += [finding.message for finding in result.notes if not _acted_by_run(finding.path)]
    return data, problems, notes


def parse_job(path: str | Path, inputs: Inputs | None = None) -> tuple[Job, list[Problem]]:
    """Parse a job file; unreadable files and HCL syntax errors raise, the rest is returned."""
    data, problems, notes = evaluate_job(path, inputs)
    if problems and not data:
        return Job(str(path), ""), problems
    parser = _Parser(str(path))
    job = parser.job(data)
    job.notes = notes + _template_notes(job)
    return job, problems + parser.problems


def path_names(job: Job) -> list[tuple[str, str]]:
    """Every name of the job that becomes part of a path, with the field it comes from."""
    out = [(job.name, "the job name"), (job.namespace, "namespace")]
    for group in job.groups:
        out.append((group.name, "the group name"))
        for req in group.volumes.values():
            out.append((req.name, "the volume name"))
            if req.source:
                out.append((req.source, "source"))
        for task in group.tasks:
            out.append((task.name, "the task name"))
            if task.driver:
                out.append((task.driver, "driver"))
            if task.csi_plugin is not None and task.csi_plugin.id:
                out.append((task.csi_plugin.id, "csi_plugin.id"))
    return out


def hostname_problem(hostname: str) -> str | None:
    """Why ``hostname`` is no DNS name, as a phrase (Nomad checks ``network.hostname`` so: labels
    of 1 to 63 bytes joined by dots, 255 bytes in all; no space, slash or control character here
    either, as the name reaches a hosts file), or None."""
    name = hostname[:-1] if hostname.endswith(".") else hostname
    labels = name.split(".") if name else []
    if len(hostname.encode()) > 255 or not labels or any(not 0 < len(label.encode()) <= 63 for label in labels):
        return "not a valid DNS name: use labels of 1 to 63 characters joined by dots, 255 in all"
    if any(c.isspace() or not c.isprintable() or c in "\\/" for c in hostname):
        return "not a valid DNS name: it may not hold spaces, slashes or control characters"
    return None


def static_problems(job: Job) -> list[Problem]:
    """Nomad's submit-time rules for volume requests, volume mounts and csi_plugin, all at once."""
    out: list[Problem] = []
    f = job.file
    for group in job.groups:
        leaders = [t.name for t in group.tasks if t.leader]
        if len(leaders) > 1:
            # Nomad's TaskGroup.Validate: "Only one task may be marked as leader".
            message = f"Only one task may be marked as leader; {', '.join(show(n) for n in leaders)} are"
            out.append(Problem(f, message, job=job.name, group=group.name, field="leader"))
        for req in group.volumes.values():
            where = {"job": job.name, "group": group.name, "field": f"volume {show(req.name)}"}
            out.extend(Problem(f, m, **where) for m in _volume_problems(job, group, req))
        if group.ephemeral_disk_mb < MIN_EPHEMERAL_DISK_MB:
            # Nomad's EphemeralDisk.Validate.
            message = f"ephemeral_disk: minimum size is {MIN_EPHEMERAL_DISK_MB} MB; got {group.ephemeral_disk_mb}"
            out.append(Problem(f, message, job=job.name, group=group.name, field="ephemeral_disk"))
        for task in group.tasks:
            where = {"job": job.name, "group": group.name, "task": task.name}
            out.extend(Problem(f, m, **where) for m in _task_problems(task))
            budget = _log_budget_problem(task, group.ephemeral_disk_mb)
            if budget is not None:
                out.append(Problem(f, budget, **where, field="logs"))
            for i, mount in enumerate(task.volume_mounts):
                where = {"job": job.name, "group": group.name, "task": task.name, "field": f"volume_mount[{i}]"}
                if not mount.volume:
                    out.append(Problem(f, 'volume mount references an empty volume; set volume = "<name>"', **where))
                elif mount.volume not in group.volumes:
                    known = ", ".join(show(v) for v in sorted(group.volumes)) or "none"
                    out.append(
                        Problem(
                            f,
                            f"references undefined volume {mount.volume!r}; declare a group volume of that name "
                            f"(group volumes: {known})",
                            **where,
                        )
                    )
                try:
                    Propagation.parse(mount.propagation_mode)
                except UnknownPropagationError:
                    out.append(
                        Problem(
                            f,
                            f'volume mount has an invalid propagation mode: "{mount.propagation_mode}"; use '
                            '"private", "host-to-task" or "bidirectional"',
                            **where,
                        )
                    )
                if mount.selinux_label not in ("", "z", "Z"):
                    out.append(
                        Problem(f, f'volume mount has an invalid SELinux label: "{mount.selinux_label}"', **where)
                    )
                if "\x00" in mount.destination or ".." in mount.destination.split("/"):
                    out.append(
                        Problem(
                            f,
                            f"destination {show(mount.destination, PATH_MAX)} must be a plain path inside the task, "
                            'without ".." or NUL characters',
                            **where,
                        )
                    )
                elif not mount.destination.startswith("/"):
                    out.append(
                        Problem(
                            f,
                            f'destination "{mount.destination}" must be an absolute path inside the task, such as '
                            '"/data"',
                            **where,
                        )
                    )
            if task.csi_plugin is not None:
                out.extend(_csi_plugin_problems(job, group, task, task.csi_plugin))
    return out


def _task_problems(task: Task) -> list[str]:
    """Resources, durations, signals and logs: what the runner and its drivers would otherwise
    only find (or crash on) once the task is started."""
    out = []
    # Nomad's MeetsMinResources and Resources.Validate, in its words.
    if task.cpu < MIN_CPU:
        out.append(f"resources: minimum CPU value is {MIN_CPU}; got {task.cpu}")
    elif task.cpu > MAX_CPU:
        out.append(f"resources: cpu {task.cpu} is more than Linux allows as cpu shares (at most {MAX_CPU})")
    if task.memory < MIN_MEMORY_MB:
        out.append(f"resources: minimum MemoryMB value is {MIN_MEMORY_MB}; got {task.memory}")
    for what, value in (("memory", task.memory), ("memory_max", task.memory_max)):
        if value > MAX_MEMORY_MB:
            out.append(f"resources: {what} {value} MB is more than any host has (at most {MAX_MEMORY_MB} MB)")
    # Nomad's Resources.Validate: 0 (no maximum: memory is the hard limit) and -1 (no hard limit at
    # all, memory a soft one) are the two values below memory it accepts.
    if task.memory_max not in (0, MEMORY_NO_LIMIT) and task.memory_max < task.memory:
        out.append(
            f"resources: MemoryMaxMB value ({task.memory_max}) should be larger than MemoryMB value ({task.memory})"
        )
    durations = [("kill_timeout", task.kill_timeout)]
    if task.csi_plugin is not None:
        durations.append(("csi_plugin.health_timeout", task.csi_plugin.health_timeout))
    for what, text in durations:
        try:
            parse_duration(text, what)
        except ConfigError as err:
            out.append(str(err))
    if task.kill_signal:
        try:
            signal_name(task.kill_signal)
        except UnknownSignalError as err:
            out.append(f"kill_signal: {err}")
    # Nomad's LogConfig.Validate.
    if task.logs_max_files < 1:
        out.append(f"logs: minimum number of files is 1; got {task.logs_max_files}")
    if task.logs_max_file_size < 1:
        out.append(f"logs: minimum file size is 1MB; got {task.logs_max_file_size}")
    return out


def _port_problems(port: Port) -> list[str]:
    """A port number the host cannot have (Nomad: "cannot be greater than 65535"), refused before
    anything reaches a socket or iptables; a static port below 1024 is allowed, as Nomad allows it."""
    out = []
    if not 0 <= port.static <= PORT_MAX:
        out.append(
            f"network.port {show(port.label)}.static: {port.static} is not a port number (1-{PORT_MAX}); use a port "
            "in that range, or leave static out for a dynamic port"
        )
    if not -1 <= port.to <= PORT_MAX:
        out.append(
            f"network.port {show(port.label)}.to: {port.to} is not a port number (1-{PORT_MAX}, or -1 for the host "
            "port's own number); use a port in that range"
        )
    return out


def _log_budget_problem(task: Task, disk_mb: int) -> str | None:
    """Nomad's Task.Validate: a task's log files must fit below the group's ephemeral disk, so a
    job cannot give itself a log budget that fills the data dir's disk."""
    if task.logs_max_files < 1 or task.logs_max_file_size < 1:
        return None  # reported by the minimums
    usage = task.logs_max_files * task.logs_max_file_size
    if usage < disk_mb:
        return None
    return (
        f"logs: log storage ({usage} MB: max_files {task.logs_max_files} x max_file_size {task.logs_max_file_size} MB)"
        f" must be less than the group's ephemeral_disk size ({disk_mb} MB); lower logs.max_files or "
        "logs.max_file_size, or raise ephemeral_disk.size"
    )


def _volume_problems(job: Job, group: Group, req: VolumeRequest) -> list[str]:
    if req.type not in ("host", "csi"):
        return [f'volume has unrecognized type {req.type!r}; use "host" or "csi"']
    out = []
    if not req.source:
        out.append("volume has an empty source; set source to the host volume or CSI volume id")
    elif req.per_alloc and req.type == "csi" and group.count > 0 and check_name(req.source, "") is None:
        # per_alloc claims "<source>[<index>]": the longest of those must still be a name.
        problem = check_name(f"{req.source}[{group.count - 1}]", "source with its per_alloc index")
        if problem is not None:
            out.append(problem)
    if req.per_alloc and job.type in ("system", "sysbatch"):
        out.append("volume cannot be per_alloc for system or sysbatch jobs")
    if req.per_alloc and req.sticky:
        out.append("volume cannot be per_alloc and sticky at the same time")
    if req.type == "host":
        if req.has_mount_options:
            out.append("host volumes cannot have mount options")
        if req.access_mode == "single-node-reader-only" and not req.read_only:
            out.append("single-node-reader-only volumes must be read-only; set read_only = true")
        if req.access_mode not in HOST_ACCESS_MODES:
            out.append(f"host volumes cannot be mounted with {req.access_mode} access mode")
        return out
    if not req.attachment_mode:
        out.append('CSI volumes must have an attachment mode; set attachment_mode = "file-system"')
    elif req.attachment_mode not in ("file-system", "block-device"):
        out.append(f"unknown volume attachment mode: {req.attachment_mode!r}; use file-system or block-device")
    if req.attachment_mode == "block-device" and req.has_mount_options:
        out.append("block devices cannot have mount options")
    if not req.access_mode:
        out.append('CSI volumes must have an access mode; set access_mode, e.g. "single-node-writer"')
    elif req.access_mode not in CSI_ACCESS_MODES:
        out.append(f"unknown volume access mode: {req.access_mode!r}; use one of {', '.join(CSI_ACCESS_MODES)}")
    many = group.count > 1 and not req.per_alloc
    if req.access_mode == "single-node-reader-only":
        if not req.read_only:
            out.append("single-node-reader-only volumes must be read-only; set read_only = true")
        if many:
            out.append("volume with single-node-reader-only access mode allows only one reader; use per_alloc")
    if req.access_mode == "single-node-writer" and many:
        out.append("volume with single-node-writer access mode allows only one reader or writer; use per_alloc")
    if req.access_mode == "multi-node-reader-only" and not req.read_only:
        out.append("multi-node-reader-only volumes must be read-only; set read_only = true")
    if req.access_mode == "multi-node-single-writer" and not req.read_only and many:
        out.append("volume with multi-node-single-writer access mode allows only one writer; use per_alloc")
    return out


def _csi_plugin_problems(job: Job, group: Group, task: Task, cfg: CSIPluginConfig) -> list[Problem]:
    where = {"job": job.name, "group": group.name, "task": task.name, "field": "csi_plugin"}
    out = []
    if not cfg.id:
        out.append(Problem(job.file, "CSIPluginConfig must have a non-empty PluginID; set id", **where))
    if cfg.type not in ("node", "controller", "monolith"):
        out.append(
            Problem(
                job.file,
                f"CSIPluginConfig PluginType must be one of 'node', 'controller', or 'monolith', got: \"{cfg.type}\"",
                **where,
            )
        )
    for what, path in (("mount_dir", cfg.mount_dir), ("stage_publish_base_dir", cfg.stage_publish_base_dir)):
        if "\x00" in path or ".." in path.split("/"):
            out.append(
                Problem(
                    job.file,
                    f'{what} {show(path)} must be a plain path inside the task, without ".." or NUL characters',
                    **where,
                )
            )
    mount_dir = os.path.normpath(cfg.mount_dir)
    base = os.path.normpath(cfg.stage_publish_base_dir)
    if base == mount_dir or base.startswith(mount_dir.rstrip("/") + "/"):
        out.append(
            Problem(
                job.file,
                "CSIPluginConfig StagePublishBaseDir must not be a subdirectory of MountDir, got: "
                f'StagePublishBaseDir="{cfg.stage_publish_base_dir}" MountDir="{cfg.mount_dir}"',
                **where,
            )
        )
    return out


def load_job(path: str | Path, inputs: Inputs | None = None) -> Job:
    """Parse and statically validate; raises ValidationFailed listing every problem."""
    job, problems = parse_job(path, inputs)
    problems += static_problems(job)
    if problems:
        raise ValidationFailed(problems)
    return job
