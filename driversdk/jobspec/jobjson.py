"""Job files in Nomad's API format (JSON, as ``nomad job run -json`` reads them).

The API's JSON (``{"Job": {…}}`` or the job object itself, field names as Nomad's ``api``
package spells them) is turned into the body the HCL evaluator produces for the same job: the
job schema then checks it and the job parser builds the model from it, so every check, did-you-
mean and problem is the one an HCL job gets. Fields are matched case-insensitively, as Go's JSON
decoder matches them; durations are nanoseconds; a field the API has but no job file can set
(``Status``, ``ModifyIndex`` … of ``nomad job inspect``'s output) is dropped; any other field is
given its job-file name and left to the schema to refuse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from driversdk.jobspec import jobschema
from driversdk.jobspec.hcl import Body, Document, Inputs
from driversdk.jobspec.hclload import HCLFileError


@dataclass
class JobInputs(Inputs):
    """Inputs with ``-json`` (the job file is read as JSON whatever its first character) or
    ``-hcl1`` (read as HCL1, as Nomad 1.0-1.5 read it with that flag: :mod:`jobhcl1`)."""

    json: bool = False
    hcl1: bool = False


def is_json(text: str, inputs: Inputs | None) -> bool:
    """A JSON job: forced by ``-json``, or a text whose first non-space character is ``{`` (no
    HCL body can start with one)."""
    return (isinstance(inputs, JobInputs) and inputs.json) or text.lstrip().startswith("{")


# What the server sets on a job (``nomad job inspect`` shows them): no job file can set them.
_SERVER_SET = frozenset(("stop", "parentid", "dispatched", "dispatchidempotencytoken", "payload", "status",
                         "statusdescription", "stable", "version", "submittime", "createindex", "modifyindex",
                         "jobmodifyindex", "versiontag", "consultoken", "vaulttoken", "nomadtokenid",
                         "consulnamespace", "vaultnamespace"))  # fmt: skip

# API names that are not the job file's name in CamelCase, by the job-file block they are in
# ("" is the job). Lower-cased: Go's decoder matches field names case-insensitively.
_RENAMES: dict[str, dict[str, str]] = {
    "": {"taskgroups": "group", "parameterizedjob": "parameterized", "constraints": "constraint",
         "affinities": "affinity", "spreads": "spread"},
    "group": {"tasks": "task", "networks": "network", "volumes": "volume", "services": "service",
              "restartpolicy": "restart", "reschedulepolicy": "reschedule", "constraints": "constraint",
              "affinities": "affinity", "spreads": "spread"},
    "task": {"resources": "resources", "logconfig": "logs", "templates": "template", "artifacts": "artifact",
             "volumemounts": "volume_mount", "restartpolicy": "restart", "services": "service",
             "constraints": "constraint", "affinities": "affinity", "csipluginconfig": "csi_plugin",
             "identities": "identity", "actions": "action", "scalingpolicies": "scaling"},
    "resources": {"cpu": "cpu", "memorymb": "memory", "memorymaxmb": "memory_max", "diskmb": "disk", "iops": "iops",
                  "secretsmb": "secrets", "networks": "network", "devices": "device", "numa": "numa"},
    "network": {"mbits": "mbits", "ip": "ip", "cidr": "cidr", "dns": "dns"},
    "port": {"value": "static"},
    "constraint": {"ltarget": "attribute", "rtarget": "value", "operand": "operator"},
    "affinity": {"ltarget": "attribute", "rtarget": "value", "operand": "operator"},
    "spread": {"spreadtarget": "target"},
    "template": {"sourcepath": "source", "destpath": "destination", "embeddedtmpl": "data",
                 "leftdelim": "left_delimiter", "rightdelim": "right_delimiter", "envvars": "env",
                 "errmissingkey": "error_on_missing_key"},
    "artifact": {"gettersource": "source", "getteroptions": "options", "getterheaders": "headers",
                 "gettermode": "mode", "relativedest": "destination", "getterinsecure": "insecure"},
    "volume": {"mountoptions": "mount_options"},
    "mount_options": {"fstype": "fs_type"},
    "volume_mount": {"selinuxlabel": "selinux_label"},
    "csi_plugin": {"id": "id"},
    "logs": {"maxfilesizemb": "max_file_size"},
    "ephemeral_disk": {"sizemb": "size"},
    "service": {"portlabel": "port", "taskname": "task", "checks": "check"},
    "check": {"portlabel": "port", "taskname": "task", "tlsskipverify": "tls_skip_verify",
              "tlsservername": "tls_server_name", "grpcservice": "grpc_service", "grpcusetls": "grpc_use_tls"},
    "periodic": {"spec": "cron", "specs": "crons", "timezone": "time_zone"},
    "ui": {"links": "link"},
    "link": {"url": "url"},
    "device": {"constraints": "constraint", "affinities": "affinity"},
    "identity": {"audience": "aud"},
    "multiregion": {"regions": "region"},
    "sidecar_task": {"logconfig": "logs", "volumemounts": "volume_mount"},
    "expose": {"paths": "path"},
    "ingress": {"listeners": "listener"},
    "listener": {"services": "service"},
    "terminating": {"services": "service"},
}  # fmt: skip
# Fields that are the block's label (or, for the job's Name, the same as its label) and not an argument.
_LABELS = {"group": "name", "task": "name", "device": "name", "action": "name", "port": "label", "target": "value",
           "scaling": "type"}  # fmt: skip
# A task's scaling policy is labelled "cpu" or "mem"; its API Type says so as "vertical_cpu" / "vertical_mem".
SCALING_TYPES = {"cpu": "vertical_cpu", "mem": "vertical_mem"}
# Labelled blocks the API keeps as a map by label (API field -> job-file block), by the block they are in.
BY_LABEL = {("group", "volumes"): "volume", ("proxy", "envoygatewaybindaddresses"): "envoy_gateway_bind_addresses"}
_DROPPED: dict[str, frozenset[str]] = {"volume": frozenset({"name"}), "periodic": frozenset({"spectype"})}


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _duration(ns: int) -> str:
    """Nanoseconds as the shortest exact duration text, so a JSON job reads as the HCL one does."""
    for unit, size in (("h", 3600 * 10**9), ("m", 60 * 10**9), ("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if ns and ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


def _value(value: Any, spec: jobschema.Attr | jobschema.Block | None, block: str) -> Any:
    """One field's value in the job file's shape: objects of blocks become block bodies."""
    if isinstance(spec, jobschema.Attr):
        if spec.kind is jobschema.Kind.DURATION and isinstance(value, int) and not isinstance(value, bool):
            return _duration(value)
        return value
    if isinstance(spec, jobschema.Block) and spec.open:
        return _free(value)  # meta, env, a driver's config: passed as written
    inner = spec if isinstance(spec, jobschema.Block) else jobschema.Block(open=True)
    if isinstance(value, dict):
        return [_labelled(value, inner, block)]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_labelled(v, inner, block) for v in value]
    return _free(value)


def _free(value: Any) -> Any:
    """A value no schema describes (a driver's config): a list of objects is blocks, as in HCL."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = []
        for item in value:
            body = Body()
            body.update({k: _free(v) for k, v in item.items()})
            out.append(body)
        return out
    if isinstance(value, dict):
        return {k: _free(v) for k, v in value.items()}
    return value


def _labelled(obj: dict[str, Any], spec: jobschema.Block, block: str) -> Any:
    body = _body(obj, spec, block)
    if not spec.labels:
        return body
    label = str(next((v for k, v in obj.items() if k.lower() == _LABELS.get(block, "name")), ""))
    if block == "scaling":
        label = next((short for short, kind in SCALING_TYPES.items() if kind == label), label)
    return {label: body}


def _body(obj: dict[str, Any], spec: jobschema.Block, block: str) -> Body:
    body = Body()
    renames = _RENAMES.get(block, {})
    skip = _DROPPED.get(block, frozenset())
    label = _LABELS.get(block, "name") if spec.labels else None
    for key, value in obj.items():
        low = key.lower()
        if value is None or value in ("", [], {}) or low == label or low in skip:
            continue  # Go's zero values of what is unset: `nomad job inspect` writes them all
        if block == "network" and low in ("reservedports", "dynamicports"):
            ports = value if isinstance(value, list) else [value]
            body.blocks("port").extend(_value(ports, jobschema.GROUP_PORT, "port"))
            continue
        labelled = BY_LABEL.get((block, low))
        child = spec.fields.get(labelled or "")
        if labelled and isinstance(child, jobschema.Block) and isinstance(value, dict):
            body[labelled] = [{str(n): _body(v, child, labelled)} for n, v in value.items() if isinstance(v, dict)]
            continue
        name = renames.get(low) or _snake(key)
        body[name] = _value(value, spec.fields.get(name), name)
    return body


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"


def _where(err: json.JSONDecodeError, path: str) -> str:
    return f"{path}:{err.lineno}:{err.colno}"


def document(path: str, text: str) -> Document:
    """A JSON job file as the evaluated document of the same job in HCL; a file that is not a
    JSON job raises one sentence naming the file (and line:column)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise HCLFileError(
            f"{_where(err, path)}: this job file is not valid JSON ({err.msg.lower()}); "
            "fix it, or write the job in HCL",
            path,
            err.lineno,
        ) from None
    except RecursionError:
        raise HCLFileError(f"{path}: the JSON nests too deeply to read; flatten it", path) from None
    if not isinstance(data, dict):
        raise HCLFileError(
            f'{path}: a JSON job file is one object, {{"Job": {{…}}}} or the job itself, not {_json_kind(data)}',
            path,
        )
    nested = next((v for k, v in data.items() if k.lower() == "job"), None)
    job = nested if isinstance(nested, dict) else data
    job = {k: v for k, v in job.items() if k.lower() not in _SERVER_SET}
    job_id = next((v for k, v in job.items() if k.lower() == "id"), None)
    name = next((v for k, v in job.items() if k.lower() == "name"), None)
    label = str(job_id if job_id is not None else name if name is not None else "")
    # The ID is the job block's label; a Name that repeats it is what Nomad fills in for HCL.
    fields = {k: v for k, v in job.items() if k.lower() != "id" and not (k.lower() == "name" and str(v) == label)}
    top = Body()
    top["job"] = [{label: _body(fields, jobschema.JOB, "")}]
    return Document(top)
