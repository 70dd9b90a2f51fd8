"""Nomad's job specification as data: every block and argument at job, group and task level
and below, with its type, its labels, and whether ``driversdk run`` acts on it.

:func:`check` walks an evaluated job body against it: an unknown key is a problem with "did
you mean …?", a value is converted as Nomad converts it (``count = "3"`` → 3, ``5`` → ``"5"``
for a string, a duration written as a number is nanoseconds), and a known key that ``run`` does
not act on becomes one note. The field lists follow Nomad's ``api`` package and jobspec2; the
driver's own ``config {}`` is left to the driver's schema.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from driversdk.durations import parse_duration
from driversdk.errors import ConfigError
from driversdk.hclspec.spelling import did_you_mean
from driversdk.jobspec.hcl.values import ConvertError, convert, number_text, type_name
from driversdk.paths import show


class Kind(enum.Enum):
    STRING = "string"
    INT = "number"
    FLOAT = "float"
    BOOL = "bool"
    DURATION = "duration"
    STRINGS = "list(string)"
    MAP = "map(string)"
    ANY = "any"


class Acted(enum.Enum):
    """What ``driversdk run`` does with a key."""

    YES = "acted on"
    INERT = "nothing to do on one machine"  # metadata such as datacenters, region, priority
    NO = "not acted on"  # reported once as a note


@dataclass(frozen=True)
class Attr:
    kind: Kind
    acted: Acted = Acted.YES


@dataclass(frozen=True)
class Block:
    fields: dict[str, Attr | Block] = field(default_factory=dict)
    labels: int = 0
    acted: Acted = Acted.YES
    open: bool = False  # any keys (a driver's config, a proxy's config)
    # Also accepted as an attribute holding a map (meta = { … }, env = { … }).
    as_map: Kind | None = None


S, N, B, D, L = Kind.STRING, Kind.INT, Kind.BOOL, Kind.DURATION, Kind.STRINGS


def attrs(acted: Acted = Acted.YES, **kinds: Kind) -> dict[str, Attr | Block]:
    return {name: Attr(kind, acted) for name, kind in kinds.items()}


def blk(acted: Acted = Acted.YES, labels: int = 0, **fields: Kind | Block) -> Block:
    return Block({k: Attr(v, acted) if isinstance(v, Kind) else v for k, v in fields.items()}, labels, acted)


NO, INERT = Acted.NO, Acted.INERT

META = Block(labels=0, open=True, as_map=Kind.STRING)
ENV = Block(labels=0, open=True, as_map=Kind.STRING)
OPEN = Block(open=True, as_map=Kind.ANY)

CONSTRAINT = blk(attribute=S, value=S, operator=S, distinct_hosts=B, distinct_property=S, regexp=S, version=S,
                 semver=S, set_contains=S, set_contains_all=S, set_contains_any=S, is_set=S, is_not_set=S)  # fmt: skip
AFFINITY = blk(attribute=S, value=S, operator=S, weight=N, version=S, semver=S, regexp=S, set_contains=S,
               set_contains_all=S, set_contains_any=S)  # fmt: skip
SPREAD = blk(NO, attribute=S, weight=N, target=blk(NO, 1, percent=N))
RESTART = blk(NO, interval=D, attempts=N, delay=D, mode=S, render_templates=B)
RESCHEDULE = blk(NO, attempts=N, interval=D, delay=D, delay_function=S, max_delay=D, unlimited=B)
MIGRATE = blk(NO, max_parallel=N, health_check=S, min_healthy_time=D, healthy_deadline=D)
UPDATE = blk(NO, max_parallel=N, health_check=S, min_healthy_time=D, healthy_deadline=D, progress_deadline=D,
             canary=N, auto_revert=B, auto_promote=B, stagger=D)  # fmt: skip
# size is the tasks' log budget (checked at validate); the disk itself is not limited or kept.
EPHEMERAL_DISK = Block({"size": Attr(N), **attrs(NO, sticky=B, migrate=B)})
DISCONNECT = blk(NO, lost_after=D, stop_on_client_after=D, replace=B, reconcile=S)
CONSUL = blk(NO, namespace=S, cluster=S, partition=S)
VAULT = blk(NO, policies=L, role=S, namespace=S, cluster=S, env=B, disable_file=B, change_mode=S, change_signal=S,
            allow_token_expiration=B)  # fmt: skip
IDENTITY = blk(NO, name=S, aud=L, change_mode=S, change_signal=S, env=B, file=B, filepath=S, service_name=S, ttl=D)
SCALING = Block({**attrs(NO, min=N, max=N, enabled=B, type=S), "policy": Block(open=True, as_map=Kind.ANY, acted=NO)},
                acted=NO)  # fmt: skip
TASK_SCALING = Block(SCALING.fields, labels=1, acted=NO)
LOGS = blk(max_files=N, max_file_size=N, enabled=B, disabled=B)
DEVICE = blk(NO, 1, count=N, constraint=CONSTRAINT, affinity=AFFINITY)
NUMA = blk(NO, affinity=S, devices=L)
PORT = blk(NO, 1, static=N, to=N, host_network=S, ignore_collision=B)
GROUP_PORT = Block({**attrs(static=N, to=N), **attrs(NO, host_network=S, ignore_collision=B)}, labels=1)
DNS = blk(NO, servers=L, searches=L, options=L)
NETWORK = Block({
    "mode": Attr(S), "device": Attr(S, NO), "cidr": Attr(S, NO), "ip": Attr(S, NO), "hostname": Attr(S),
    "mbits": Attr(N, NO), "dns": DNS, "port": GROUP_PORT, "reserved_ports": Block(PORT.fields, acted=NO),
    "cni": Block({"args": Block(open=True, as_map=Kind.STRING, acted=NO)}, acted=NO),
})  # fmt: skip
RESOURCES = Block({
    "cpu": Attr(N), "cores": Attr(N, NO), "memory": Attr(N), "memory_max": Attr(N), "disk": Attr(N, NO),
    "iops": Attr(N, NO), "secrets": Attr(N, NO), "network": Block(NETWORK.fields, acted=NO), "device": DEVICE,
    "numa": NUMA,
})  # fmt: skip
CHECK_RESTART = blk(NO, limit=N, grace=D, ignore_warnings=B)
CHECK = Block({
    **attrs(NO, name=S, type=S, command=S, args=L, path=S, protocol=S, port=S, expose=B, address_mode=S, interval=D,
            timeout=D, initial_status=S, notes=S, tls_server_name=S, tls_skip_verify=B, method=S, body=S,
            grpc_service=S, grpc_use_tls=B, task=S, success_before_passing=N, failures_before_critical=N,
            failures_before_warning=N, on_update=S),
    "header": Block(open=True, as_map=Kind.STRINGS, acted=NO),
    "check_restart": CHECK_RESTART,
}, acted=NO)  # fmt: skip
UPSTREAM = Block({
    **attrs(NO, destination_name=S, destination_namespace=S, destination_peer=S, destination_type=S,
            destination_partition=S, local_bind_port=N, local_bind_address=S, local_bind_socket_path=S,
            local_bind_socket_mode=S, datacenter=S),
    "mesh_gateway": blk(NO, mode=S),
    "config": Block(open=True, as_map=Kind.ANY, acted=NO),
}, acted=NO)  # fmt: skip
PROXY = Block({
    **attrs(NO, local_service_address=S, local_service_port=N),
    "config": Block(open=True, as_map=Kind.ANY, acted=NO),
    "upstreams": UPSTREAM,
    "expose": blk(NO, path=blk(NO, path=S, protocol=S, local_path_port=N, listener_port=S)),
    "transparent_proxy": blk(NO, exclude_inbound_ports=L, exclude_outbound_cidrs=L, exclude_outbound_ports=Kind.ANY,
                             exclude_uids=L, no_dns=B, outbound_port=N),
}, acted=NO)  # fmt: skip
SIDECAR_SERVICE = Block({
    **attrs(NO, port=S, tags=L, disable_default_tcp_check=B),
    "proxy": PROXY,
    "meta": Block(open=True, as_map=Kind.STRING, acted=NO),
}, acted=NO)  # fmt: skip
SIDECAR_TASK = Block({
    **attrs(NO, name=S, driver=S, user=S, kill_timeout=D, shutdown_delay=D, kill_signal=S),
    "config": Block(open=True, as_map=Kind.ANY, acted=NO),
    "env": Block(open=True, as_map=Kind.STRING, acted=NO),
    "meta": Block(open=True, as_map=Kind.STRING, acted=NO),
    "resources": Block(RESOURCES.fields, acted=NO),
    "logs": Block(LOGS.fields, acted=NO),
    "volume_mount": blk(NO, volume=S, destination=S, read_only=B, propagation_mode=S, selinux_label=S),
}, acted=NO)  # fmt: skip
GATEWAY_PROXY = Block({
    **attrs(NO, connect_timeout=D, envoy_gateway_bind_tagged_addresses=B, envoy_gateway_no_default_bind=B,
            envoy_dns_discovery_type=S),
    "envoy_gateway_bind_addresses": blk(NO, 1, address=S, port=N),
    "config": Block(open=True, as_map=Kind.ANY, acted=NO),
}, acted=NO)  # fmt: skip
GATEWAY_TLS = blk(NO, enabled=B, tls_min_version=S, tls_max_version=S, cipher_suites=L)
GATEWAY = Block({
    "proxy": GATEWAY_PROXY,
    "ingress": Block({
        "tls": GATEWAY_TLS,
        "listener": Block({**attrs(NO, port=N, protocol=S),
                           "service": Block({**attrs(NO, name=S, hosts=L), "tls": GATEWAY_TLS}, acted=NO)}, acted=NO),
    }, acted=NO),
    "terminating": blk(NO, service=blk(NO, name=S, ca_file=S, cert_file=S, key_file=S, sni=S)),
    "mesh": Block(acted=NO),
}, acted=NO)  # fmt: skip
CONNECT = Block({
    "native": Attr(B, NO),
    "gateway": GATEWAY,
    "sidecar_service": SIDECAR_SERVICE,
    "sidecar_task": SIDECAR_TASK,
}, acted=NO)  # fmt: skip
SERVICE = Block({
    **attrs(NO, name=S, tags=L, canary_tags=L, enable_tag_override=B, port=S, address_mode=S, address=S, task=S,
            provider=S, cluster=S, on_update=S, kind=S),
    "meta": Block(open=True, as_map=Kind.STRING, acted=NO),
    "canary_meta": Block(open=True, as_map=Kind.STRING, acted=NO),
    "tagged_addresses": Block(open=True, as_map=Kind.STRING, acted=NO),
    "weights": blk(NO, passing=N, warning=N),
    "check": CHECK,
    "check_restart": CHECK_RESTART,
    "connect": CONNECT,
    "identity": IDENTITY,
}, acted=NO)  # fmt: skip
# Fetched by the artifact hook (http(s) and local files); chown is not acted on.
ARTIFACT = Block({
    **attrs(source=S, mode=S, insecure=B, destination=S), "chown": Attr(B, NO),
    "options": Block(open=True, as_map=Kind.STRING),
    "headers": Block(open=True, as_map=Kind.STRING),
})  # fmt: skip
TEMPLATE = Block({
    **attrs(NO, source=S, destination=S, data=S, change_mode=S, change_signal=S, splay=D, perms=S, uid=N, gid=N,
            left_delimiter=S, right_delimiter=S, env=B, vault_grace=D, error_on_missing_key=B, once=B),
    "change_script": blk(NO, command=S, args=L, timeout=D, fail_on_error=B),
    "wait": blk(NO, min=D, max=D),
}, acted=NO)  # fmt: skip
VOLUME_MOUNT = blk(volume=S, destination=S, read_only=B, propagation_mode=S, selinux_label=S)
CSI_PLUGIN = blk(id=S, type=S, mount_dir=S, stage_publish_base_dir=S, health_timeout=D)
TASK = Block({
    "driver": Attr(S), "user": Attr(S), "kill_timeout": Attr(D), "kill_signal": Attr(S),
    "leader": Attr(B), "shutdown_delay": Attr(D, NO), "kind": Attr(S, NO),
    "config": OPEN, "env": ENV, "meta": META, "resources": RESOURCES, "logs": LOGS,
    "volume_mount": VOLUME_MOUNT, "csi_plugin": CSI_PLUGIN,
    "lifecycle": blk(NO, hook=S, sidecar=B), "restart": RESTART, "constraint": CONSTRAINT, "affinity": AFFINITY,
    "service": SERVICE, "artifact": ARTIFACT, "vault": VAULT, "consul": CONSUL, "template": TEMPLATE,
    "dispatch_payload": blk(NO, file=S), "scaling": TASK_SCALING, "identity": IDENTITY,
    "action": blk(NO, 1, command=S, args=L),
    "schedule": blk(NO, cron=blk(NO, start=S, end=S, timezone=S)),
}, labels=1)  # fmt: skip
VOLUME = Block({
    **attrs(type=S, source=S, read_only=B, access_mode=S, attachment_mode=S, per_alloc=B, sticky=B),
    "mount_options": blk(fs_type=S, mount_flags=L),
}, labels=1)  # fmt: skip
GROUP = Block({
    "count": Attr(N), "shutdown_delay": Attr(D, NO), "max_run_duration": Attr(D),
    "stop_after_client_disconnect": Attr(D, NO), "max_client_disconnect": Attr(D, NO),
    "prevent_reschedule_on_lost": Attr(B, NO),
    "constraint": CONSTRAINT, "affinity": AFFINITY, "spread": SPREAD, "task": TASK, "volume": VOLUME,
    "restart": RESTART, "disconnect": DISCONNECT, "reschedule": RESCHEDULE, "ephemeral_disk": EPHEMERAL_DISK,
    "update": UPDATE, "migrate": MIGRATE, "network": NETWORK, "meta": META, "service": SERVICE, "scaling": SCALING,
    "consul": CONSUL, "vault": VAULT,
}, labels=1)  # fmt: skip
JOB = Block({
    **attrs(INERT, region=S, datacenters=L, priority=N, all_at_once=B, node_pool=S, name=S),
    "namespace": Attr(S), "id": Attr(S), "type": Attr(S),
    "constraint": CONSTRAINT, "affinity": AFFINITY, "spread": SPREAD, "group": GROUP, "task": TASK,
    "update": UPDATE, "multiregion": Block({
        "strategy": blk(NO, max_parallel=N, on_failure=S),
        "region": Block({**attrs(NO, count=N, datacenters=L, node_pool=S),
                         "meta": Block(open=True, as_map=Kind.STRING, acted=NO)}, labels=1, acted=NO),
    }, acted=NO),
    # Acted on by refusing the job (jobspec.periodic_refusal): `run` has no agent to launch it on its schedule.
    "periodic": blk(enabled=B, cron=S, crons=L, prohibit_overlap=B, time_zone=S),
    "parameterized": blk(NO, payload=S, meta_required=L, meta_optional=L),
    "reschedule": RESCHEDULE, "migrate": MIGRATE, "meta": META, "vault": VAULT,
    "ui": blk(INERT, description=S, link=blk(INERT, label=S, url=S)),
}, labels=1)  # fmt: skip

# Unlabelled blocks that may be written more than once (a list in Nomad's api); any other
# unlabelled block written twice is refused, as Nomad refuses it.
REPEATABLE = frozenset(
    [
        "constraint",
        "affinity",
        "spread",
        "service",
        "check",
        "template",
        "artifact",
        "identity",
        "volume_mount",
        "upstreams",
        "listener",
        "link",
        "reserved_ports",
        "path",
    ]
)

# Arguments with a fixed set of values, by (block, argument); "" (unset) is always allowed.
CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "type"): ("service", "batch", "system", "sysbatch"),
    ("lifecycle", "hook"): ("prestart", "poststart", "poststop"),
    ("restart", "mode"): ("fail", "delay"),
    ("reschedule", "delay_function"): ("constant", "exponential", "fibonacci"),
    ("template", "change_mode"): ("noop", "restart", "signal", "script"),
    ("vault", "change_mode"): ("noop", "restart", "signal"),
    ("disconnect", "reconcile"): ("keep_original", "keep_replacement", "best_score", "longest_running"),
    ("update", "health_check"): ("checks", "task_states", "manual"),
    ("migrate", "health_check"): ("checks", "task_states"),
    ("check", "type"): ("http", "tcp", "grpc", "script"),
    ("service", "provider"): ("consul", "nomad"),
    ("service", "address_mode"): ("alloc", "auto", "driver", "host"),
    ("artifact", "mode"): ("any", "file", "dir"),
    ("parameterized", "payload"): ("optional", "required", "forbidden"),
}

# Durations the job parser checks itself, with its own sentence.
CHECKED_ELSEWHERE = frozenset({"group.task.kill_timeout", "group.task.csi_plugin.health_timeout",
                               "task.kill_timeout", "task.csi_plugin.health_timeout"})  # fmt: skip


@dataclass(frozen=True)
class Finding:
    """One problem or note: the dotted key path, where (job/group/task), and the sentence."""

    path: str
    message: str
    where: dict[str, str]
    line: int = 0


@dataclass
class Result:
    problems: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)
    _noted: set[str] = field(default_factory=set)

    def note(self, path: str, what: str, where: dict[str, str]) -> None:
        """Once per schema path (``group.task.service``), at the first place it is written."""
        if path in self._noted:
            return
        self._noted.add(path)
        place = next(
            (f"{kind} {show(where[kind])}" for kind in ("task", "group", "job") if where.get(kind)),
            "the job",
        )
        self.notes.append(Finding(path, f"{what} (first in {place}): not acted on by driversdk run", where))


def _go_duration(ns: int) -> str:
    return f"{ns}ns"


def convert_attr(kind: Kind, value: Any, what: str) -> Any:
    """``value`` as Nomad decodes it for ``kind``; ConvertError with a short reason otherwise."""
    if value is None:
        return None
    if kind is Kind.ANY:
        return value
    if kind is Kind.STRING:
        if isinstance(value, list | dict):
            raise ConvertError(f"a string is required, not {type_name(value)}")
        return convert(value, ("string",))
    if kind in (Kind.INT, Kind.FLOAT):
        number = convert(value, ("number",))
        if kind is Kind.INT and isinstance(number, float) and not number.is_integer():
            raise ConvertError(f"a whole number is required, not {number_text(number)}")
        return int(number) if kind is Kind.INT and isinstance(number, float) and number.is_integer() else number
    if kind is Kind.BOOL:
        return convert(value, ("bool",))
    if kind is Kind.STRINGS:
        if isinstance(value, str):
            raise ConvertError("a list of strings is required, not a string")
        return convert(value, ("list", ("string",)))
    if kind is Kind.MAP:
        return convert(value, ("map", ("string",)))
    if kind is Kind.DURATION:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConvertError(f'a duration string such as "30s" is required, not {type_name(value)}')
        if isinstance(value, int | float):
            return _go_duration(int(value))
        return value
    raise ConvertError(f"unknown kind {kind}")


def check(job_body: dict[str, Any], where: dict[str, str]) -> Result:
    """Check (and convert in place) one job's body; ``where`` names the job."""
    result = Result()
    _walk(job_body, JOB, "", "", where, result)
    return result


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return show(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return number_text(value) if math.isfinite(value) else "a number too large to use"
    return show(repr(value))[1:-1]


def _expected(kind: Kind) -> str:
    return {
        Kind.STRING: "a string",
        Kind.INT: "a number",
        Kind.FLOAT: "a number",
        Kind.BOOL: "true or false",
        Kind.DURATION: 'a duration such as "30s"',
        Kind.STRINGS: "a list of strings",
        Kind.MAP: "a map of strings",
        Kind.ANY: "a value",
    }[kind]


def _where(where: dict[str, str], key: str, label: str) -> dict[str, str]:
    if key == "group":
        return {"job": where.get("job", ""), "group": label}
    if key == "task":
        return {**where, "task": label}
    return where


def _walk(
    body: dict[str, Any],
    spec: Block,
    path: str,
    rel: str,
    where: dict[str, str],
    result: Result,
    noted: bool = False,
) -> None:
    lines: dict[str, int] = getattr(body, "lines", {})
    for key in list(body):
        value = body[key]
        here = f"{path}.{key}" if path else key
        what = f"{rel}.{key}" if rel else key
        child = spec.fields.get(key)
        line = lines.get(key, 0)
        if child is None:
            if spec.open:
                continue
            hint = did_you_mean(key, spec.fields)
            inside = f" in {rel}" if rel else ""
            advice = hint or "; remove it or check its spelling"
            result.problems.append(Finding(what, f"unsupported argument or block {key!r}{inside}{advice}", where, line))
            continue
        if isinstance(child, Attr):
            if _is_blocks(value):
                result.problems.append(Finding(what, f"{what} is an argument ({key} = …), not a block", where, line))
                del body[key]
                continue
            if here not in CHECKED_ELSEWHERE or child.kind is not Kind.DURATION or not isinstance(value, str):
                try:
                    body[key] = convert_attr(child.kind, value, here)
                except ConvertError as err:
                    whole = "whole number" in str(err)
                    expected = "a whole number" if whole else _expected(child.kind)
                    result.problems.append(
                        Finding(what, f"{what} must be {expected}, got {_shown(value)}", where, line)
                    )
                    del body[key]
                    continue
                parent = path.rsplit(".", 1)[-1] if path else ""
                choices = CHOICES.get((parent, key))
                if choices and isinstance(body[key], str) and body[key] and body[key].lower() not in choices:
                    allowed = ", ".join(f'"{c}"' for c in choices)
                    result.problems.append(
                        Finding(what, f"{what} must be one of {allowed}, got {_shown(body[key])}", where, line)
                    )
                if child.kind is Kind.DURATION and isinstance(body[key], str) and here not in CHECKED_ELSEWHERE:
                    try:
                        parse_duration(body[key], what)
                    except ConfigError as err:
                        result.problems.append(Finding(what, str(err), where, line))
            if child.acted is Acted.NO and not noted:
                result.note(here, what, where)
            continue
        # A block.
        if child.acted is Acted.NO and not noted:
            result.note(here, what, where)
        if not _is_blocks(value):
            if child.as_map is not None and isinstance(value, dict):
                _map_values(value, child.as_map, what, where, line, result)
                continue
            if child.as_map is not None and isinstance(value, list) and all(isinstance(v, dict) for v in value):
                continue
            result.problems.append(
                Finding(what, f"{what} must be a block ({key} {{ … }}), not {_shown(value)}", where, line)
            )
            del body[key]
            continue
        if not child.labels and key not in REPEATABLE and len(value) > 1 and child.as_map is None:
            result.problems.append(
                Finding(what, f"only one {key} block is allowed here, found {len(value)}", where, line)
            )
            del body[key]
            continue
        for item in value:
            bodies = _unlabel(item, child.labels)
            if bodies is None:
                n = child.labels
                sentence = (f"{what} needs {n} label(s): {key} " + " ".join(['"name"'] * n) + " { … }") if n else (
                    f"{what} takes no label: {key} {{ … }}")  # fmt: skip
                result.problems.append(Finding(what, sentence, where, line))
                continue
            for label, inner in bodies:
                if child.as_map is not None:
                    _map_values(inner, child.as_map, what, where, line, result)
                    continue
                inner_rel = "" if key in ("group", "task") else (f"{what} {show(label)}" if label else what)
                _walk(
                    inner, child, here, inner_rel, _where(where, key, label), result, noted or child.acted is Acted.NO
                )


def _map_values(body: dict[str, Any], kind: Kind, what: str, where: dict[str, str], line: int, result: Result) -> None:
    """A map's values (meta, env, a check's header) converted in place to ``kind``."""
    for k, v in list(body.items()):
        if kind is Kind.ANY:
            continue
        try:
            body[k] = convert_attr(kind, v, f"{what}.{k}")
        except ConvertError:
            result.problems.append(
                Finding(f"{what}.{k}", f"{what}.{k} must be {_expected(kind)}, got {_shown(v)}", where, line)
            )
            del body[k]


def _is_blocks(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all((isinstance(v, dict) and hasattr(v, "lines")) or
                                                           _labelled_body(v) for v in value)  # fmt: skip


def _labelled_body(value: Any) -> bool:
    """``{label: body}`` as a labelled block comes out of the evaluator."""
    return isinstance(value, dict) and len(value) == 1 and all(hasattr(v, "lines") or _labelled_body(v)
                                                               for v in value.values())  # fmt: skip


def _unlabel(item: Any, labels: int) -> list[tuple[str, dict[str, Any]]] | None:
    """A block's body with its label; None when the number of labels is wrong."""
    if labels == 0:
        return [("", item)] if hasattr(item, "lines") else None
    if hasattr(item, "lines") or not isinstance(item, dict):
        return None
    out = []
    for label, inner in item.items():
        if not hasattr(inner, "lines"):
            return None
        out.append((str(label), inner))
    return out
