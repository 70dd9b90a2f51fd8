"""A job file as Nomad's API JSON (what ``POST /v1/jobs/parse`` answers): the way back of :mod:`jobjson`.

The evaluated body of a job (:func:`jobspec.evaluate_text`) is walked against the job schema
(:mod:`jobschema`); every key gets the name Nomad's ``api`` package gives it: jobjson's renames,
inverted, or the key in CamelCase, spelled as the ``api`` package spells it (``MemoryMB``,
``SELinuxLabel``). Durations become integer nanoseconds; labelled blocks become Nomad's lists
(``TaskGroups``, ``Tasks``, ``Devices``) or maps (``Volumes``); ``config``, ``env`` and ``meta``
are kept as written. What jobspec2 fills in while parsing is filled in too (``ID`` and ``Name``
from the label, ports with a static number as ``ReservedPorts``, a template's defaults, the job's
and group's ``vault`` on their tasks, a periodic job's ``SpecType``), so the answer is jobspec2's.
Only what the job sets is written: a field Go would write as ``null`` or its zero is left out.
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from typing import Any

from driversdk.durations import parse_duration
from driversdk.errors import ConfigError
from driversdk.jobspec import jobjson, jobschema
from driversdk.jobspec.hcl import Inputs
from driversdk.jobspec.hcllimits import MAX_JOB_FILE_BYTES
from driversdk.jobspec.hclload import HCLFileError, labelled
from driversdk.jobspec.job import evaluate_text
from driversdk.jobspec.problems import Problem, ValidationFailed

# The name problems of a job sent as text carry (jobspec2 parses the API's text under this name).
API_FILE = "input.hcl"

# jobjson's renames (API name, lower-cased -> job-file name) turned around, by block.
_API_NAMES: dict[str, dict[str, str]] = {
    block: {hcl: api for api, hcl in names.items()} for block, names in jobjson._RENAMES.items()
}

# How Nomad's api package spells the names whose capitals CamelCase does not give (Go's decoder
# matches names case-insensitively, so jobjson keeps them lower-cased; an answer is written out).
_SPELLED = {
    name.lower(): name
    for name in (
        "ID", "CPU", "MemoryMB", "MemoryMaxMB", "DiskMB", "IOPS", "SecretsMB", "NUMA", "MBits", "IP", "CIDR", "DNS",
        "CNI", "LTarget", "RTarget", "SELinuxLabel", "TLSSkipVerify", "TLSServerName", "GRPCService", "GRPCUseTLS",
        "MaxFileSizeMB", "SizeMB", "CSIPluginConfig", "FSType", "URL", "UI", "TTL", "UID", "NoDNS",
        "ExcludeOutboundCIDRs", "ExcludeUIDs", "CAFile", "SNI", "TLS", "TLSMinVersion", "TLSMaxVersion",
        "EnvoyDNSDiscoveryType", "DisableDefaultTCPCheck", "TaskGroups", "ParameterizedJob", "RestartPolicy",
        "ReschedulePolicy", "LogConfig", "VolumeMounts", "SourcePath", "DestPath", "EmbeddedTmpl", "LeftDelim",
        "RightDelim", "Envvars", "ErrMissingKey", "GetterSource", "GetterOptions", "GetterHeaders", "GetterMode",
        "GetterInsecure", "RelativeDest", "MountOptions", "PortLabel", "TaskName", "SpreadTarget", "TimeZone",
        "ScalingPolicies",
    )
}  # fmt: skip
# The same lower-cased name spelled otherwise in one block (a template's Uid, a proxy's UID).
_SPELLED_IN = {"template": {"uid": "Uid", "gid": "Gid"}}

# Labelled blocks Nomad keeps as a map by label, not a list.
_MAPS = frozenset(jobjson.BY_LABEL.values())
# Unlabelled blocks that are a list in the API: those a job may repeat, and network (written once).
_LISTS = jobschema.REPEATABLE | {"network"}
# ... but for a service, identity is one object.
_ONE_IN = {"service": frozenset({"identity"})}

_PAIR = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


class DurationError(ConfigError):
    """A duration the schema leaves to the job parser (kill_timeout …) that is none; ``line`` when known."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(message)
        self.line = line
        self.where: dict[str, str] = {}  # the group and task it is in, filled in on the way out


def api_name(block: str, key: str) -> str:
    """The API's name of ``key`` written in ``block`` ("" is the job)."""
    renamed = _API_NAMES.get(block, {}).get(key)
    low = renamed if renamed is not None else key.replace("_", "").lower()
    spelled = _SPELLED_IN.get(block, {}).get(low) or _SPELLED.get(low)
    if spelled is not None:
        return spelled
    if renamed is not None:
        return renamed[:1].upper() + renamed[1:]
    return "".join(part[:1].upper() + part[1:] for part in key.split("_"))


def nanoseconds(value: Any, what: str) -> int:
    """A duration as written (a Go duration, or a number of nanoseconds) as integer nanoseconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    text = str(value)
    parse_duration(text, what, allow_negative=True)  # one grammar, one error sentence
    body = text.lstrip("+-")
    total = sum(Decimal(m.group(1)) * _UNIT_NS[m.group(2)] for m in _PAIR.finditer(body))
    return -int(total) if text.startswith("-") else int(total)


def _blocks(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value] if isinstance(value, dict) else []


def _free(value: Any) -> Any:
    """A value no schema describes (a driver's config): bodies as plain objects, blocks as lists of them."""
    if isinstance(value, dict):
        return {str(k): _free(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_free(v) for v in value]
    return value


def _merged(value: Any) -> dict[str, Any]:
    """``meta { … }`` (one or more bodies) or ``meta = { … }`` as one map."""
    out: dict[str, Any] = {}
    for body in _blocks(value):
        if isinstance(body, dict):
            out.update(_free(body))
    return out


def _object(body: dict[str, Any], spec: jobschema.Block, block: str, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in body.items():
        if value is None:
            continue
        child = spec.fields.get(key)
        here = f"{path}.{key}" if path else key
        if block == "network" and key in ("port", "reserved_ports"):
            _ports(out, key, value)
            continue
        if block in ("constraint", "affinity"):
            continue  # below, as jobspec2 reads the operator's shorthands
        name = api_name(block, key)
        if block == "task" and key == "scaling" and isinstance(child, jobschema.Block):
            out[name] = _task_scaling(value, child, here)
        elif isinstance(child, jobschema.Attr):
            out[name] = _duration(body, key, here) if child.kind is jobschema.Kind.DURATION else value
        elif isinstance(child, jobschema.Block) and child.open:
            out[name] = _merged(value)
        elif isinstance(child, jobschema.Block):
            out[name] = _nested(block, key, value, child, here)
        else:
            out[name] = _free(value)  # an open block's own keys
    if block in ("constraint", "affinity"):
        out.update(_placement(body, block))
    return out


def _duration(body: dict[str, Any], key: str, what: str) -> int:
    try:
        return nanoseconds(body[key], re.sub(r"^(group\.)?(task\.)?", "", what))  # the group and task are named
    except ConfigError as err:
        raise DurationError(str(err), getattr(body, "lines", {}).get(key, 0)) from None


def _nested(block: str, key: str, value: Any, spec: jobschema.Block, path: str) -> Any:
    """A block's value: one object, a list of them (repeatable or labelled), or a map by label."""
    if not spec.labels:
        objects = [_object(b, spec, key, path) for b in _blocks(value) if isinstance(b, dict)]
        if key in _LISTS and key not in _ONE_IN.get(block, ()):
            return objects
        return objects[0] if objects else {}
    label_field = api_name(key, jobjson._LABELS.get(key, "name"))
    out = []
    for label, body in labelled(value):
        try:
            out.append({label_field: label, **_object(body, spec, key, path)})
        except DurationError as err:
            if key in ("group", "task"):
                err.where.setdefault(key, label)
            raise
    return {o[label_field]: o for o in out} if key in _MAPS else out


def _task_scaling(value: Any, spec: jobschema.Block, path: str) -> list[dict[str, Any]]:
    """A task's ``scaling "cpu"`` / ``scaling "mem"``: jobspec2's list, the label as the policy's type."""
    out = []
    for label, body in labelled(value):
        policy = _object(body, spec, "scaling", path)
        policy.setdefault("Type", jobjson.SCALING_TYPES.get(label.lower(), label))
        out.append(policy)
    return out


def _ports(network: dict[str, Any], key: str, value: Any) -> None:
    """Ports as jobspec2 leaves them: one with a static number is reserved, any other is dynamic."""
    if key == "port":
        ports = [(label, b) for label, b in labelled(value)]
    else:  # HCL1's reserved_ports { … }: unlabelled
        ports = [("", b) for b in _blocks(value) if isinstance(b, dict)]
    for label, body in ports:
        port = {"Label": label, **_object(body, jobschema.GROUP_PORT, "port", "network.port")}
        kind = "ReservedPorts" if key == "reserved_ports" or int(port.get("Value") or 0) > 0 else "DynamicPorts"
        network.setdefault(kind, []).append(port)


# A constraint's or affinity's shorthands (``regexp = "…"``, ``distinct_hosts = true``): the
# operator they name, with their value as RTarget (distinct_property's as LTarget), as jobspec2 reads them.
_SHORTHANDS = ("version", "semver", "regexp", "set_contains_any", "set_contains_all", "set_contains", "is_set",
               "is_not_set")  # fmt: skip


def _placement(body: dict[str, Any], block: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "LTarget": str(body.get("attribute") or ""),
        "RTarget": str(body.get("value") or ""),
        "Operand": str(body.get("operator") or ""),
    }
    for shorthand in _SHORTHANDS:
        if body.get(shorthand):
            out["Operand"], out["RTarget"] = shorthand, str(body[shorthand])
    if block == "constraint" and body.get("distinct_hosts") is True:
        out["Operand"] = "distinct_hosts"
    if block == "constraint" and body.get("distinct_property"):
        out["Operand"], out["LTarget"] = "distinct_property", str(body["distinct_property"])
    out["Operand"] = out["Operand"] or "="
    if block == "affinity" and body.get("weight") is not None:
        out["Weight"] = body["weight"]
    return out


def api_job(body: dict[str, Any], name: str) -> dict[str, Any]:
    """The evaluated body of ``job "name" { … }`` (checked by the schema) as Nomad's ``api.Job``."""
    fields = _object(body, jobschema.JOB, "", "")
    vault = fields.pop("Vault", None)
    job = {"ID": fields.pop("ID", None) or name, "Name": fields.pop("Name", None) or name, **fields}
    periodic = job.get("Periodic")
    if isinstance(periodic, dict) and periodic.get("Spec") is not None:
        periodic["SpecType"] = "cron"
    for group in job.get("TaskGroups", []):
        group_vault = group.pop("Vault", None) or vault
        if isinstance(group.get("Scaling"), dict):
            group["Scaling"].setdefault("Type", "horizontal")
        for task in group.get("Tasks", []):
            _normalize_task(task, group_vault)
    return job


def _normalize_task(task: dict[str, Any], vault: dict[str, Any] | None) -> None:
    """What jobspec2 fills in on a task: the group's or job's vault, a vault's and template's defaults."""
    if "Vault" not in task and vault is not None:
        task["Vault"] = copy.deepcopy(vault)  # each task its own, as a client may change one
    if "Vault" in task:
        task["Vault"].setdefault("Env", True)
        task["Vault"].setdefault("ChangeMode", "restart")
    for template in task.get("Templates", []):
        template.setdefault("ChangeMode", "restart")
        template.setdefault("Perms", "0644")
        template.setdefault("Splay", 5 * 10**9)
        template.setdefault("ErrMissingKey", False)
        script = template.get("ChangeScript")
        if isinstance(script, dict):
            script.setdefault("Args", [])
            script.setdefault("Timeout", 5 * 10**9)
            script.setdefault("FailOnError", False)


def parse_to_api(text: str, inputs: Inputs | None = None, file: str = API_FILE) -> dict[str, Any]:
    """A job's HCL text (no file: its file functions read nothing unless ``inputs.files`` says)
    as the job object ``/v1/jobs/parse`` answers. A syntax error raises HCLFileError; problems
    of evaluation and of the schema raise ValidationFailed, each at its line."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_JOB_FILE_BYTES:
        raise HCLFileError(
            f"{file}: the job is over {MAX_JOB_FILE_BYTES} bytes, the most driversdk reads of a job; "
            "move large content out of it",
            file,
        )
    data, problems, _notes = evaluate_text(file, text, inputs)
    if problems:
        raise ValidationFailed(problems)
    jobs = labelled(data.get("job"))
    if len(jobs) != 1:
        raise HCLFileError(f"{file}: a job needs exactly one job block, found {len(jobs)}", file)
    name, body = jobs[0]
    try:
        return api_job(body, name)
    except DurationError as err:
        raise ValidationFailed([Problem.at(err.line, file, str(err), job=name, **err.where)]) from None
