"""Everything that can be known before a task starts, checked at once.

Nomad finds most of these only when the task starts on a client; we ask each driver the job
uses (as a client would: a plugin launched for it, or, for checks only, a bundled driver built in
this process, :mod:`driversdk.agent.pluginmanager.inprocess`), read its capabilities and task
schema, and check the job's volumes and mounts against them and against this host.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from driversdk.agent import nodeattrs
from driversdk.agent.allocrunner import portalloc
from driversdk.agent.mountadvice import HostMount, advise
from driversdk.agent.pluginmanager.inprocess import InProcessDriver, answers_here
from driversdk.bundled import reinstall_hint
from driversdk.errors import ConfigError, DriverSDKError
from driversdk.extras import extra_of
from driversdk.hclspec import Spec, encode
from driversdk.hclspec.codec import ConfigErrors
from driversdk.hclspec.spec import Array, Block, BlockAttrs, BlockList, BlockMap, BlockSet, Default, Object, input_name
from driversdk.jobspec import constraints, taskenv
from driversdk.jobspec.clientconfig import ClientConfig, load_client
from driversdk.jobspec.hcl import Inputs
from driversdk.jobspec.hclload import HCLFileError, is_blocks, labelled, read_text
from driversdk.jobspec.job import Group, Job, Task, parse_job, path_names, static_problems
from driversdk.jobspec.nomadopts import PLUGIN_OPTIONS, TASK_CONFIG
from driversdk.jobspec.problems import Problem, ValidationFailed, with_field
from driversdk.model import Capabilities
from driversdk.mountinfo import MountEntry, read_mountinfo
from driversdk.mounts import MountRequest, MountValidationError, Propagation, UnknownPropagationError, check_mounts
from driversdk.paths import check_name, show
from driversdk.plugin.host import StartingPlugin  # no grpc: that is loaded by connecting

if TYPE_CHECKING:
    # The client (and grpc with it) is loaded once the job's plugins are starting: see _spawn_plugins.
    from driversdk.client import DriverClient


@dataclass
class DriverFacts:
    capabilities: Capabilities
    task_schema: Spec
    # Plugin options Nomad's driver of that name has and this one does not: left out, noted.
    skipped_options: list[str] = field(default_factory=list)
    # driver.<name> and driver.<name>.* from the plugin's first fingerprint (node attributes).
    attributes: dict[str, str] = field(default_factory=dict)


def _fields(spec: Spec) -> dict[str, Spec] | None:
    """The input names an object schema reads, each with its schema; None if not an object."""
    while isinstance(spec, Default):
        spec = spec.primary
    if isinstance(spec, Block | BlockList | BlockSet):
        return _fields(spec.nested)
    if not isinstance(spec, Object):
        return None
    return {input_name(child, key) or key: child for key, child in spec.attributes.items()}


def _without_nomad_only(
    config: dict[str, Any], spec: Spec, nomad: dict[str, Any], path: str
) -> tuple[dict[str, Any], list[str]]:
    """``config`` without the options Nomad's driver knows and this driver's schema does not;
    with the dotted names of what was left out. Unknown to both stays: the driver refuses it."""
    fields = _fields(spec)
    if fields is None:
        return config, []
    kept: dict[str, Any] = {}
    skipped: list[str] = []
    for key, value in config.items():
        here = f"{path}.{key}" if path else key
        if key not in fields and key in nomad:
            skipped.append(here)
            continue
        nested = nomad.get(key)
        if key in fields and isinstance(nested, dict):
            if isinstance(value, dict):
                value, more = _without_nomad_only(value, fields[key], nested, here)
                skipped += more
            elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
                parts = [_without_nomad_only(v, fields[key], nested, here) for v in value]
                value = [p[0] for p in parts]
                skipped += [name for p in parts for name in p[1]]
        kept[key] = value
    return kept, skipped


@dataclass
class Report:
    job: str
    problems: list[Problem] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    parsed: Job | None = field(default=None, repr=False)
    # Keys Nomad knows that `driversdk run` does not act on, each once; never a problem.
    notes: list[str] = field(default_factory=list)
    # The node attributes each kept plugin fingerprinted (``keep_plugins``): the run's node has
    # them without asking the same plugin again.
    driver_attributes: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    # Host volumes (client names) a problem is about: no `ok` line is printed for them.
    troubled_host_volumes: set[str] = field(default_factory=set, repr=False)
    # (group, volume) requests a mount problem already asks to make read-only.
    read_only_asked: set[tuple[str, str]] = field(default_factory=set, repr=False)
    # The evaluated job body (its blocks carry their lines), when the checks got that far.
    evaluated: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def valid(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "valid": self.valid, "problems": [p.as_dict() for p in self.problems],
                "checked": self.checked, "notes": self.notes}  # fmt: skip


def _block_shapes(spec: Spec, body: dict[str, Any], key: str, path: str) -> list[str]:
    """Fields the schema reads as blocks but the config gives another value (``gc = false``).

    The codec reads such a value as "no block written" and applies the block's defaults, which
    turns ``gc = false`` into garbage collection on: refused here, before the plugin sees it.
    """
    if isinstance(spec, Object):
        return [p for k, child in spec.attributes.items() for p in _block_shapes(child, body, k, path)]
    if isinstance(spec, Default):
        return _block_shapes(spec.primary, body, key, path)
    if isinstance(spec, Array):
        return [p for child in spec.values for p in _block_shapes(child, body, key, path)]
    if not isinstance(spec, Block | BlockList | BlockSet | BlockMap | BlockAttrs):
        return []
    name = input_name(spec, key) or key
    raw = body.get(name)
    here = f"{path}.{name}" if path else name
    if raw is None:
        return []
    bodies = [raw] if isinstance(raw, dict) else raw if isinstance(raw, list) else None
    if bodies is None or not all(isinstance(b, dict) for b in bodies):
        text = repr(raw).lower() if isinstance(raw, bool) else repr(raw)
        return [f"{here} must be a block ({name} {{ … }}), not {show(text)[1:-1]}"]
    if isinstance(spec, Block | BlockList | BlockSet):
        return [p for b in bodies for p in _block_shapes(spec.nested, b, "", here)]
    return []


def _driver_facts(
    driver: str,
    client: ClientConfig,
    job: Job,
    cache: dict[str, DriverFacts | Problem],
    keep: dict[str, DriverClient] | None = None,
    starting: dict[str, StartingPlugin | DriverClient | DriverSDKError] | None = None,
) -> DriverFacts | Problem:
    if driver in cache:
        return cache[driver]
    command = client.driver_command(driver)
    result: DriverFacts | Problem
    if command is None:
        result = Problem(
            job.file,
            f'no plugin is configured for driver "{driver}"'
            + (
                reinstall_hint(driver)
                or f'; add plugin "{driver}" {{ command = [...] }} to the client config or use a bundled driver '
                "(docker, exec, raw_exec)"
            ),
            job=job.name,
            field="driver",
        )
    else:
        plugin: DriverClient | InProcessDriver | None = None
        try:
            pending = starting.pop(driver, None) if starting is not None else None
            if isinstance(pending, DriverSDKError):
                raise pending  # it could not be started or connected to
            if keep is None and pending is None and answers_here(client, driver):
                plugin = InProcessDriver(driver)  # checks only, of a bundled driver: asked here
            elif pending is None or isinstance(pending, StartingPlugin):
                # The gRPC client (and grpc with it) loads only for a plugin process to talk to.
                from driversdk.client import connect_driver
                from driversdk.plugin.host import spawn_plugin

                started = pending or spawn_plugin(command, name=driver, checks_only=keep is None)
                plugin = connect_driver(started, command, timeout=60, name=driver)
            else:
                plugin = pending
            config, skipped = plugin_config_for(driver, client, plugin)
            plugin.set_config(config)
            result = facts_of(driver, plugin, skipped)
        except DriverSDKError as err:
            result = Problem(
                client.file or job.file, f'driver "{driver}" could not be loaded: {err}', job=job.name,
                field=f'plugin "{driver}"',
            )  # fmt: skip
        except ImportError as err:  # a bundled driver answered here whose extra is not installed
            missing = extra_of(err)
            if missing is None:
                raise
            result = Problem(
                client.file or job.file, f'driver "{driver}" {missing.sentence()}', job=job.name,
                field=f'plugin "{driver}"',
            )  # fmt: skip
        except OSError as err:  # e.g. a plugin command that cannot be executed
            result = Problem(
                client.file or job.file, f'driver "{driver}" could not be started: {err.strerror or err}', job=job.name,
                field=f'plugin "{driver}"',
            )  # fmt: skip
        finally:
            if plugin is not None:
                if keep is not None and isinstance(result, DriverFacts) and not isinstance(plugin, InProcessDriver):
                    keep[driver] = plugin  # the caller (driversdk run) starts its tasks through it
                else:
                    plugin.kill()
    cache[driver] = result
    return result


def plugin_config_for(
    driver: str, client: ClientConfig, plugin: DriverClient | InProcessDriver
) -> tuple[dict[str, Any], list[str]]:
    """The client's ``plugin "<driver>" { config {} }`` as the plugin takes it: without the options
    only Nomad's driver of that name has (named in the second value); a block where the plugin's
    schema wants an attribute (or the reverse) raises ConfigError."""
    config = client.plugin_config(driver)
    schema = plugin.config_schema()
    skipped: list[str] = []
    if schema is not None and driver in PLUGIN_OPTIONS:
        config, skipped = _without_nomad_only(config, schema, PLUGIN_OPTIONS[driver], "")
    shapes = _block_shapes(schema, config, "", "config") if schema is not None else []
    if shapes:
        raise ConfigError(f'plugin "{driver}" {"; ".join(shapes)}')
    return config, skipped


def facts_of(driver: str, plugin: DriverClient | InProcessDriver, skipped: list[str]) -> DriverFacts:
    """What validation needs of a configured plugin: its capabilities, task schema and attributes."""
    return DriverFacts(plugin.capabilities(), plugin.task_config_schema(), skipped,
                       nodeattrs.driver_attributes(driver, plugin))  # fmt: skip


def _spawn_plugins(
    job: Job, client: ClientConfig, checks_only: bool = False, known: Collection[str] = ()
) -> dict[str, StartingPlugin | DriverClient | DriverSDKError]:
    """Start the plugin of every driver the job names, all at once and before anything else is
    waited on: each boots (an interpreter, its imports) while this process loads its gRPC client
    side and checks the other drivers. A start that failed is kept to be reported in its turn."""
    from driversdk.plugin.host import spawn_plugin

    out: dict[str, StartingPlugin | DriverClient | DriverSDKError] = {}
    for group in job.groups:
        for task in group.tasks:
            wanted = task.driver and task.driver not in out and task.driver not in known
            command = client.driver_command(task.driver) if wanted else None
            if command is None:
                continue  # no driver, already started, or none configured (_driver_facts says so)
            if checks_only and answers_here(client, task.driver):
                continue  # asked in this process: no plugin to start
            try:
                out[task.driver] = spawn_plugin(command, name=task.driver, checks_only=checks_only)
            except DriverSDKError as err:
                out[task.driver] = err
    return out


def _connect_plugins(starting: dict[str, StartingPlugin | DriverClient | DriverSDKError], client: ClientConfig) -> None:
    """Connect to each started plugin (loading the gRPC client side while they boot) and ask for
    its config schema in the background, so what a plugin loads on that first call (the docker
    SDK) overlaps the caller's ``while_starting`` work. A failure is kept for the driver's turn."""
    if not any(isinstance(pending, StartingPlugin) for pending in starting.values()):
        return  # nothing launched (a job of bundled drivers, validated here): grpc is not loaded
    from driversdk.client import connect_driver

    for driver, pending in list(starting.items()):
        command = client.driver_command(driver)
        if not isinstance(pending, StartingPlugin) or command is None:
            continue
        try:
            plugin = connect_driver(pending, command, timeout=60, name=driver)
        except DriverSDKError as err:
            starting[driver] = err
            continue
        starting[driver] = plugin
        plugin.prefetch_config_schema()


def _mount_requests(
    job: Job,
    group: Group,
    task: Task,
    client: ClientConfig,
    problems: list[Problem],
    refused: frozenset[str] = frozenset(),
    facts: list[HostMount] | None = None,
) -> tuple[list[MountRequest], list[MountRequest]]:
    """The task's mounts as requests (host, CSI); with ``facts``, each host mount's facts (where
    its read-only flags come from) are appended there, in the same order."""
    host, csi = [], []
    for i, mount in enumerate(task.volume_mounts):
        req = group.volumes.get(mount.volume)
        if req is None or f"volume_mount[{i}]" in refused:
            continue  # already reported by the static rules
        where = {"job": job.name, "group": group.name, "task": task.name, "field": f"volume_mount[{i}]"}
        if req.type == "host":
            volume = client.host_volumes.get(req.source)
            if volume is None:
                known = ", ".join(sorted(client.host_volumes)) or "none"
                problems.append(
                    Problem(
                        job.file,
                        f'host volume "{req.source}" (volume "{req.name}") is not in the client config; add a '
                        f'host_volume "{req.source}" block with its path (configured: {known})',
                        **where,
                    )
                )
                continue
            if facts is not None:
                facts.append(
                    HostMount(req.name, req.source, volume.host_path, mount.propagation_mode, volume.read_only,
                              req.read_only, mount.read_only)
                )  # fmt: skip
            host.append(
                MountRequest(
                    volume=req.name,
                    destination=mount.destination,
                    host_path=volume.host_path,
                    kind="host",
                    propagation=mount.propagation_mode,
                    read_only=volume.read_only or req.read_only or mount.read_only,
                    selinux_label=mount.selinux_label,
                )
            )
        else:
            csi.append(
                MountRequest(
                    volume=req.name,
                    destination=mount.destination,
                    host_path="",  # known once the volume is published
                    kind="csi",
                    propagation=mount.propagation_mode,
                    read_only=req.read_only or mount.read_only,
                    selinux_label=mount.selinux_label,
                )
            )
    return host, csi


def _known_mode(requests: list[MountRequest], volume: str) -> bool:
    """Whether the volume's mount asks for one of the three propagation modes."""
    try:
        for req in requests:
            if req.volume == volume:
                Propagation.parse(req.propagation)
        return True
    except UnknownPropagationError:
        return False


def mount_table() -> list[MountEntry]:
    """This host's mount table, read anew for each job checked: the agent lives on while an
    operator changes mounts (the advice itself says to make a path shared), so a table read
    once per process would keep refusing what has been fixed."""
    return read_mountinfo()


def _plugin_down(socket_path: str, plugin_id: str) -> str | None:
    """None when the plugin answers Probe as ready, else why not."""
    from driversdk.csi.client import CSIClient
    from driversdk.csi.errors import CSIError

    try:
        client = CSIClient(socket_path, plugin=plugin_id, connect_timeout=2.0)
    except CSIError as err:
        return str(err)
    try:
        return None if client.probe() else "Probe says it is not ready"
    except CSIError as err:
        return str(err)
    finally:
        client.close()


def _topology_problem(socket_path: str, volume: Any) -> str | None:
    """The volume's accessible topology against this node's plugin topology (NodeGetInfo)."""
    from driversdk.agent.csi.volumeops import topology_problem
    from driversdk.csi.client import CSIClient
    from driversdk.csi.errors import CSIError

    try:
        client = CSIClient(socket_path, plugin=volume.plugin_id, connect_timeout=2.0)
        try:
            segments = client.node_info().topology
        finally:
            client.close()
    except CSIError as err:
        return f'CSI plugin "{volume.plugin_id}" did not say its node topology ({err}); check its task\'s logs'
    return topology_problem(volume, segments)


def _csi_problems(job: Job, client: ClientConfig) -> list[Problem]:
    """CSI volumes must be registered with a capability matching the request, and their node
    plugin must run here: registered by a running plugin, or provided by this job itself."""
    requests = [(g, r) for g in job.groups for r in g.volumes.values() if r.type == "csi" and r.source]
    if not requests:
        return []
    # Only now: a job without CSI volumes does not pay for loading the stores.
    from driversdk.agent.csi.pluginsupervisor import live_instance
    from driversdk.agent.csi.registry import PluginRegistry
    from driversdk.agent.csi.state import StateStore
    from driversdk.agent.csi.volumes import VolumeStore

    db = os.path.join(client.data_dir, "state.db")
    if not os.path.isfile(db):
        # Nothing was ever registered here; opening the store would create the data dir, and
        # validate changes nothing on the host.
        return [
            Problem(
                job.file,
                f'CSI volume "{source}" is not registered in namespace "{job.namespace}" (no volume has been '
                f"registered with data dir {client.data_dir}); register it with `driversdk volume register <file>`",
                job=job.name,
                group=group.name,
                field=f'volume "{req.name}"',
            )
            for group, req in requests
            for source in [f"{req.source}[0]" if req.per_alloc else req.source]
        ]
    volumes = VolumeStore(db)
    registry = PluginRegistry(StateStore(db))
    provided = {t.csi_plugin.id for g in job.groups for t in g.tasks if t.csi_plugin is not None}
    out = []
    for group, req in requests:
        where = {"job": job.name, "group": group.name, "field": f'volume "{req.name}"'}
        source = f"{req.source}[0]" if req.per_alloc else req.source
        volume = volumes.get(source, job.namespace)
        if volume is None:
            out.append(
                Problem(
                    job.file,
                    f'CSI volume "{source}" is not registered in namespace "{job.namespace}"; register it with '
                    "`driversdk volume register <file>`",
                    **where,
                )
            )
            continue
        wanted = (req.access_mode, req.attachment_mode)
        offered = [(c.access_mode.value, c.attachment_mode.value) for c in volume.capabilities]
        if wanted not in offered:
            listing = ", ".join(f"{a}/{b}" for a, b in offered)
            out.append(
                Problem(
                    job.file,
                    f'CSI volume "{source}" has no capability {wanted[0]}/{wanted[1]} (it offers {listing}); '
                    "change access_mode/attachment_mode or the volume's capability blocks",
                    **where,
                )
            )
        if volume.plugin_id in provided:
            continue
        running = live_instance(registry, "csi-node", volume.plugin_id)  # a dead newer one is passed over
        if running is None:
            out.append(
                Problem(
                    job.file,
                    f'CSI plugin "{volume.plugin_id}" for volume "{source}" has no running node instance on this '
                    "client; run the plugin's job first (a task with csi_plugin)",
                    **where,
                )
            )
        elif (down := _plugin_down(running.socket_path, volume.plugin_id)) is not None:
            out.append(
                Problem(
                    job.file,
                    f'CSI plugin "{volume.plugin_id}" for volume "{source}" is registered but does not answer '
                    f"({down}); run the plugin's job again or check its task's logs",
                    **where,
                )
            )
        elif volume.topologies and (far := _topology_problem(running.socket_path, volume)) is not None:
            out.append(Problem(job.file, far, **where))
    volumes.close()
    return out


def dry_interpolated(job: Job) -> Job:
    """A copy of the job with each task's runtime variables interpolated as a client would, with
    a placeholder allocation: what the static and mount checks look at. The job itself keeps
    its ``${…}`` for `run`, which interpolates with the real allocation."""
    dry = copy.deepcopy(job)
    for group in dry.groups:
        for task in group.tasks:
            env = taskenv.dry(dry, group, task, fs_isolation=task.driver not in ("raw_exec",))
            task.env = {k: env.env.get(k, v) for k, v in task.env.items()}
            task.user = env.replace(task.user)
            task.config = env.interpolate(task.config)
            for mount in task.volume_mounts:
                mount.destination = env.replace(mount.destination)
    return dry


def _once(problems: list[Problem]) -> list[Problem]:
    """Each problem once, in the order found, each with its field."""
    seen: set[Problem] = set()
    out = []
    for problem in map(with_field, problems):
        if problem not in seen:
            seen.add(problem)
            out.append(problem)
    return out


def validate_job(
    path: str,
    client: ClientConfig,
    keep_plugins: dict[str, DriverClient] | None = None,
    inputs: Inputs | None = None,
    while_starting: Callable[[], None] | None = None,
    known: Mapping[str, DriverFacts] | None = None,
    scheduled: bool = False,
) -> Report:
    """Check the job; with ``keep_plugins`` the driver plugins launched for it are handed back
    there (configured, not yet initialised) instead of being shut down. ``while_starting`` is
    called once the job's plugins have been started, before the first is waited for: work of the
    caller's that then takes the time they take to boot. ``known``: facts of drivers whose
    plugins the caller already runs (the agent's): no plugin is launched for those. ``scheduled``:
    the caller launches periodic jobs on their schedule (the agent), so a periodic block is no refusal."""
    report = _validate(path, client, keep_plugins, inputs, while_starting, known or {}, scheduled)
    report.problems = _once(report.problems)
    if report.parsed is not None and any(not p.line and p.file == report.parsed.file for p in report.problems):
        index = _line_index(report.evaluated if report.evaluated is not None else _evaluated(path, inputs))
        report.problems = [_placed(p, index) if p.file == report.parsed.file else p for p in report.problems]
    return report


def _evaluated(path: str, inputs: Inputs | None) -> dict[str, Any]:
    from driversdk.jobspec.job import evaluate_job

    try:
        return evaluate_job(path, inputs)[0]
    except DriverSDKError:
        return {}


LineIndex = dict[tuple[Any, ...], int]


def _line_index(data: dict[str, Any]) -> LineIndex:
    """Where each block and argument of the job is (the evaluator records lines): keyed
    ("job", key?), ("group", g, key?), ("volume", g, v, key?), ("task", g, t, key?),
    ("config", g, t, *path), ("mount", g, t, volume, key?)."""
    index: LineIndex = {}

    def body(key: tuple[Any, ...], value: Any) -> None:
        index.setdefault(key, getattr(value, "line", 0))
        for name, line in getattr(value, "lines", {}).items():
            index.setdefault((*key, name), line)

    def config(key: tuple[Any, ...], value: Any) -> None:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                for name, line in getattr(item, "lines", {}).items():
                    index.setdefault((*key, name), line)
                for name, inner in item.items():
                    if isinstance(inner, dict | list):
                        config((*key, name), inner)

    for _, job_body in labelled(data.get("job")):
        body(("job",), job_body)
        for g, gbody in labelled(job_body.get("group")):
            body(("group", g), gbody)
            for v, vbody in labelled(gbody.get("volume")):
                body(("volume", g, v), vbody)
            for t, tbody in labelled(gbody.get("task")):
                body(("task", g, t), tbody)
                config(("config", g, t), tbody.get("config"))
                mounts = tbody.get("volume_mount")
                for mbody in mounts if isinstance(mounts, list) and is_blocks(mounts) else []:
                    body(("mount", g, t, str(mbody.get("volume"))), mbody)
    return index


_MOUNT_FIELD = re.compile(r'^volume "([^"]*)"(?: (\w+))?$')
_CONFIG_PATH = re.compile(r"^config: ([A-Za-z0-9_.\[\]-]+)")


def _placed(problem: Problem, index: LineIndex) -> Problem:
    """``problem`` with the line of the block or argument it is about, when it has none."""
    if problem.line:
        return problem
    g, t, f = problem.group, problem.task, problem.field
    line = 0
    if t:
        if f == "config":
            found = _CONFIG_PATH.match(problem.message)
            path = [re.sub(r"\[\d+\]$", "", part) for part in found.group(1).split(".")] if found else []
            for n in range(len(path), 0, -1):
                line = line or index.get(("config", g, t, *path[:n]), 0)
            line = line or index.get(("task", g, t, "config"), 0)
        elif (mount := _MOUNT_FIELD.match(f)) is not None:
            line = index.get(("mount", g, t, mount.group(1), mount.group(2)), 0) or index.get(
                ("mount", g, t, mount.group(1)), 0
            )
        line = line or index.get(("task", g, t, f.split(".")[0].split("[")[0]), 0) or index.get(("task", g, t), 0)
    elif g:
        volume = re.match(r'^volume "([^"]*)"', f)
        if volume is not None:
            line = index.get(("volume", g, volume.group(1)), 0)
        line = line or index.get(("group", g, f.split(".")[0].split(" ")[0]), 0) or index.get(("group", g), 0)
    elif problem.job:
        line = index.get(("job", f.split(".")[0]), 0) or index.get(("job",), 0)
    if not line:
        return problem
    placed = replace(problem)
    object.__setattr__(placed, "line", line)
    return placed


def _validate(
    path: str,
    client: ClientConfig,
    keep_plugins: dict[str, DriverClient] | None,
    inputs: Inputs | None,
    while_starting: Callable[[], None] | None = None,
    known: Mapping[str, DriverFacts] | None = None,
    scheduled: bool = False,
) -> Report:
    parsed, problems = parse_job(path, inputs)
    job = dry_interpolated(parsed)
    report = Report(job.name, problems + static_problems(job), parsed=parsed, notes=list(parsed.notes))
    if problems and not job.groups:
        return report
    if any(check_name(value, what) for value, what in path_names(job)):
        # Names that would escape or break a path must not reach the state store, the host or a
        # plugin: stop at the static problems, before anything is opened or launched.
        return report
    for group in job.groups:
        if group.count == 0:
            report.checked.append(f"group {show(group.name)}: count = 0, `driversdk run` starts no allocation of it")
    report.problems += _csi_problems(job, client)
    for group in job.groups:
        for task in group.tasks:
            if task.csi_plugin is None:
                continue
            # Imported for plugin tasks only: the supervisor brings the CSI client with it.
            from driversdk.agent.csi.pluginsupervisor import socket_path_problem

            problem = socket_path_problem(client.data_dir)
            if problem is not None:
                where = {"job": job.name, "group": group.name, "task": task.name, "field": "csi_plugin"}
                report.problems.append(Problem(client.file or job.file, problem, **where))
    cache: dict[str, DriverFacts | Problem] = dict(known or {})
    # Plugins no caller keeps are only asked questions: they are told so, and skip warming up for tasks.
    spawned = _spawn_plugins(job, client, checks_only=keep_plugins is None, known=cache.keys())
    starting: dict[str, StartingPlugin | DriverClient | DriverSDKError] = dict(spawned)
    try:
        _connect_plugins(starting, client)
        if starting:
            # Work done anyway (the host's attributes, for placement; the caller's), done while the
            # plugins answer their first calls.
            nodeattrs.host_attributes()
            if while_starting is not None:
                while_starting()
        _check_tasks(job, parsed, client, report, cache, keep_plugins, starting)
    finally:
        # Plugins whose driver's turn never came (an error ended the checks first): not left running.
        for pending in starting.values():
            if isinstance(pending, DriverSDKError):
                continue
            if isinstance(pending, StartingPlugin):
                pending.abandon()
            else:
                pending.kill()
    _placement(path, inputs, job, client, cache, report, scheduled)
    # Said last, when every problem is known: no `ok` for a host volume a problem is about.
    report.checked[:0] = _host_volume_lines(job, client, report.troubled_host_volumes)
    if keep_plugins is not None:
        report.driver_attributes = {
            driver: facts.attributes for driver, facts in cache.items()
            if isinstance(facts, DriverFacts) and driver in keep_plugins
        }  # fmt: skip
    return report


def _check_tasks(
    job: Job,
    parsed: Job,
    client: ClientConfig,
    report: Report,
    cache: dict[str, DriverFacts | Problem],
    keep_plugins: dict[str, DriverClient] | None,
    starting: dict[str, StartingPlugin | DriverClient | DriverSDKError],
) -> None:
    """Each task against its driver: the driver loads, its config fits the driver's schema, its
    mounts the driver's capabilities and this host."""
    table: list[MountEntry] | None = None
    for group in job.groups:
        for task in group.tasks:
            if not task.driver:
                continue
            where = {"job": job.name, "group": group.name, "task": task.name}
            facts = _driver_facts(task.driver, client, job, cache, keep_plugins, starting)
            if isinstance(facts, Problem):
                report.problems.append(facts)
                continue
            report.checked.append(f'task "{task.name}": driver "{task.driver}" loaded')
            for option in facts.skipped_options:
                note = (
                    f'plugin "{task.driver}" config.{option}: a Nomad option not acted on by driversdk\'s {task.driver}'
                )
                if note not in report.notes:
                    report.notes.append(note)
            config = _task_config_for_driver(task, facts, report, parsed)
            task.config = config
            try:
                shapes = _block_shapes(facts.task_schema, task.config, "", "config")
                if shapes:
                    raise ConfigErrors(shapes)
                encode(facts.task_schema, task.config, what="config")
            except ConfigError as err:
                # Each field its own problem, so each gets the line it is on.
                items = err.items if isinstance(err, ConfigErrors) else [str(err)]
                report.problems += [Problem(job.file, item, **where, field="config") for item in items]
            # A mount the static rules already refused is not checked again (one problem, once).
            refused = frozenset(p.field for p in report.problems if p.task == task.name and p.group == group.name)
            host_facts: list[HostMount] = []
            host, csi = _mount_requests(job, group, task, client, report.problems, refused, host_facts)
            troubled: set[str] = set()
            for requests, is_host in ((host, True), (csi, False)):
                if not requests:
                    continue
                try:
                    # The host side of host mounts is weighed below, all its reasons at once.
                    check_mounts(
                        requests,
                        task=task.name,
                        driver=task.driver,
                        mount_configs=int(facts.capabilities.mount_configs),
                        check_host=False,
                    )
                except MountValidationError as err:
                    for p in err.problems:
                        if is_host and p.field == "propagation_mode" and _known_mode(requests, p.volume):
                            continue  # bidirectional on a read-only mount: said with its cause below
                        troubled.add(p.volume)
                        # The location goes in the Problem; keep the sentence itself short.
                        message = p.message.removeprefix(f'task "{task.name}" volume "{p.volume}": ')
                        report.problems.append(
                            Problem(job.file, message, **where, field=f'volume "{p.volume}" {p.field}')
                        )
            for fact in host_facts:
                if table is None:
                    table = mount_table()  # once per job, and only for one with host volume mounts
                advice = advise(fact, table)
                if advice is None:
                    continue
                message, asks_read_only = advice
                troubled.add(fact.volume)
                report.troubled_host_volumes.add(fact.source)
                if asks_read_only:
                    report.read_only_asked.add((group.name, fact.volume))
                report.problems.append(Problem(job.file, message, **where, field=f'volume "{fact.volume}"'))
            for mount in task.volume_mounts:
                if mount.volume in troubled or not any(r.volume == mount.volume for r in host + csi):
                    continue
                report.checked.append(
                    f'task "{task.name}": volume_mount of volume "{mount.volume}" at "{mount.destination}" checked'
                )


def _placement(
    path: str, inputs: Inputs | None, job: Job, client: ClientConfig, cache: dict[str, DriverFacts | Problem],
    report: Report, scheduled: bool = False,
) -> None:  # fmt: skip
    """Constraints this node does not meet are problems (`run` does not place such a group);
    an unmet affinity is noted once."""
    from driversdk.jobspec.job import evaluate_job

    data, _, _ = evaluate_job(path, inputs)
    placement = constraints.collect(data)
    drivers = {k: v.attributes for k, v in cache.items() if isinstance(v, DriverFacts)}
    node = nodeattrs.node(client, drivers)
    for group in job.groups:
        for c, why in constraints.refusals(placement, node, group.name):
            if scheduled and c.operator == constraints.PERIODIC:
                continue  # launched on its schedule by the caller
            report.problems.append(Problem(job.file, constraints.sentence(c, why), **c.where, field="constraint"))
        for a in placement.affinities.get(group.name, []):
            missed = constraints.unmet(a, node, placement)
            note = constraints.sentence(a, missed, affinity=True) if missed is not None else ""
            if note and note not in report.notes:
                report.notes.append(note)
    report.problems.extend(_static_port_collisions(job))
    report.problems.extend(portalloc.reserved_problems(job, client))
    report.problems.extend(_host_volume_fit(job, client, report))
    report.evaluated = data


def _host_volume_fit(job: Job, client: ClientConfig, report: Report) -> list[Problem]:
    """Nomad's scheduler places a group only on a client that has each host volume the group
    asks for, mounted by a task or not, and read-write unless the request is read-only (its host
    volume checker). A missing volume that a task mounts is reported with that mount instead (it
    names the task), once that task's driver has loaded: a driver that does not load is the
    problem reported first."""
    out: list[Problem] = []
    for group in job.groups:
        mounted = {m.volume for t in group.tasks for m in t.volume_mounts}
        for req in group.volumes.values():
            if req.type != "host":
                continue
            where = {"job": job.name, "group": group.name, "field": f"volume {show(req.name)}"}
            volume = client.host_volumes.get(req.source)
            if volume is None:
                report.troubled_host_volumes.add(req.source)
            if volume is None and req.name not in mounted:
                known = ", ".join(sorted(client.host_volumes)) or "none"
                out.append(
                    Problem(
                        job.file,
                        f'host volume "{req.source}" (volume "{req.name}") is not in the client config, and Nomad '
                        f'places the group only where it is, mounted or not; add a host_volume "{req.source}" '
                        f"block with its path, or remove the volume (configured: {known})",
                        **where,
                    )
                )
            elif volume is not None and volume.read_only and not req.read_only:
                report.troubled_host_volumes.add(req.source)
                if (group.name, req.name) in report.read_only_asked:
                    continue  # the mount's problem asks for it, with the change to its propagation
                out.append(
                    Problem(
                        job.file,
                        f'host volume "{req.source}" is read-only in the client config, but volume "{req.name}" '
                        "asks for it read-write, and Nomad does not place such a group; set read_only = true on "
                        "the volume",
                        **where,
                    )
                )
    return out


def _static_port_collisions(job: Job) -> list[Problem]:
    """A static port is one host port: on this one node it fits one allocation, as Nomad's
    scheduler finds when it has a single node (a reserved port collision)."""
    out: list[Problem] = []
    owner: dict[int, str] = {}
    for group in job.groups:
        for port in group.ports:
            if not port.static:
                continue
            where = {"job": job.name, "group": group.name, "field": f"network.port {port.label}.static"}
            if group.count > 1:
                out.append(
                    Problem(
                        job.file,
                        f"static port {port.static} (port {port.label!r}) cannot be given to {group.count} "
                        "allocations on one node; use a dynamic port (port without static) or count = 1",
                        **where,
                    )
                )
            earlier = owner.get(port.static)
            if earlier is not None:
                out.append(
                    Problem(job.file, f"static port {port.static} (port {port.label!r}) is also {earlier}", **where)
                )
            owner[port.static] = f'port {port.label!r} of group "{group.name}"'
    return out


def _task_config_for_driver(task: Task, facts: DriverFacts, report: Report, parsed: Job) -> dict[str, Any]:
    """The task config without the keys Nomad's driver of that name has and this one does not
    (docker ``ports``, ``dns_servers`` …): noted once and left out, in the checked copy and in the
    job `run` starts, so the driver is never handed a key it would refuse."""
    known = TASK_CONFIG.get(task.driver)
    fields = _fields(facts.task_schema)
    if known is None or fields is None:
        return task.config
    dropped = [k for k in task.config if k not in fields and k in known]
    for key in dropped:
        note = f"config.{key} (first in task {show(task.name)}): a Nomad {task.driver} option not acted on by driversdk"
        if not any(n.startswith(f"config.{key} ") for n in report.notes):
            report.notes.append(note)
    if dropped:
        for group in parsed.groups:
            for original in group.tasks:
                if original.name == task.name and original.driver == task.driver:
                    original.config = {k: v for k, v in original.config.items() if k not in dropped}
    return {k: v for k, v in task.config.items() if k not in dropped}


def _host_volume_lines(job: Job, client: ClientConfig, troubled: set[str]) -> list[str]:
    """Where each host volume the job uses really is: resolved once, when the config was read.
    A volume a problem is about has no line (its problem says where it is)."""
    names = sorted({r.source for g in job.groups for r in g.volumes.values() if r.type == "host"})
    out = []
    for name in names:
        volume = client.host_volumes.get(name)
        if volume is None or name in troubled:
            continue  # reported with the mount that needs it
        note = " (symlink resolved)" if volume.host_path != os.path.normpath(volume.path) else ""
        out.append(f"host volume {show(name)} → {volume.host_path}{note}")
    return out


def check_files(
    job_path: str,
    client_path: str | None,
    inputs: Inputs | None = None,
) -> Report:
    """What `driversdk validate` answers: a verdict for any pair of files, never an exception
    for something wrong in them (an unreadable, non-UTF-8 or non-HCL file is a problem too)."""
    report = _check_files(job_path, client_path, inputs)
    if client_path is not None and any(p.file == client_path and not p.line for p in report.problems):
        report.problems = _client_lines(client_path, report.problems)
    return report


def _check_files(job_path: str, client_path: str | None, inputs: Inputs | None) -> Report:
    try:
        client = load_client(client_path)
    except ValidationFailed as err:
        return Report(job="", problems=_once(err.problems))
    except DriverSDKError as err:
        return Report(job="", problems=[_file_problem(err)])  # the sentence names the file
    except ImportError as err:
        return Report(job="", problems=[_missing_extra(err)])
    try:
        report = validate_job(job_path, client, inputs=inputs)
        report.notes = client.notes + report.notes
        return report
    except ValidationFailed as err:
        return Report(job="", problems=_once(err.problems))
    except DriverSDKError as err:
        return Report(job="", problems=[_file_problem(err)])
    except ImportError as err:
        return Report(job="", problems=[_missing_extra(err)])


def _file_problem(err: DriverSDKError) -> Problem:
    """A file that cannot be read as HCL at all: its sentence names the file (and, for a syntax
    error, line and column); the problem carries the file and line too, for --json."""
    if isinstance(err, HCLFileError) and err.path:
        return Problem.at(err.line, err.path, str(err), field="file")
    return Problem("", str(err), field="file")


def _missing_extra(err: ImportError) -> Problem:
    """A package of an extra that is not installed (or does not import): named with the
    extra that installs it, never blamed on the file being read. Anything else is raised."""
    extra = extra_of(err)
    if extra is None:
        raise err
    return Problem("", f"`driversdk validate` {extra.sentence()}", field="file")


def _client_lines(path: str, problems: list[Problem]) -> list[Problem]:
    """Client config problems with the line of what they name: pyhcl gives no positions, so the
    block (``host_volume "x"``, ``plugin "docker"``) and then the key are looked for in the text."""
    try:
        text = read_text(path)
    except DriverSDKError:
        return problems
    out = []
    for problem in problems:
        line = _text_line(text, problem.field) if problem.file == path and not problem.line else 0
        if line:
            problem = replace(problem)
            object.__setattr__(problem, "line", line)
        out.append(problem)
    return out


_FIELD_PART = re.compile(r'([A-Za-z_][A-Za-z0-9_-]*)(?: "((?:[^"\\]|\\.)*)")?')


def _text_line(text: str, field: str) -> int:
    """The line of the deepest part of ``field`` (``client.host_volume "x".path``) found in
    ``text``, each part looked for after the previous one; 0 when not even the first is there."""
    pos, line = 0, 0
    for word, label in _FIELD_PART.findall(field):
        key = rf"(?m)^\s*{re.escape(word)}\b"
        pattern = key + (rf'\s*"{re.escape(label)}"' if label else "")
        found = re.compile(pattern).search(text, pos)
        if found is None:
            break
        pos = found.start()
        line = text.count("\n", 0, found.end()) + 1
    return line
