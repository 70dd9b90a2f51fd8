"""``constraint`` and ``affinity`` evaluated against this node, as Nomad's scheduler does
(``scheduler/feasible.go``): targets ``${attr.x}``, ``${node.x}``, ``${meta.x}`` or literals;
operators ``=`` (``==``, ``is``), ``!=`` (``not``), ``<``, ``<=``, ``>``, ``>=``, ``regexp``,
``set_contains`` (= ``set_contains_all``), ``set_contains_any``, ``version`` (go-version, which
lets a prerelease meet only a constraint that names one), ``semver`` (Semver 2.0 ordering),
``is_set``, ``is_not_set``, ``distinct_hosts`` and ``distinct_property``. The job's
``datacenters`` is checked as the scheduler checks it: the node's datacenter must match one of
them, each a pattern where ``*`` stands for any run of characters (Nomad's default is ``["*"]``).

On one machine every allocation lands on the same node: ``distinct_hosts`` is met only when at
most one allocation is placed, ``distinct_property`` only when at most its limit (default 1) are
and the property is set here. A group is placed only when the job's, the group's and every
task's constraints are met (Nomad checks task constraints for the whole group); an affinity
never refuses.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from driversdk.jobspec.hclload import labelled
from driversdk.jobspec.taskenv import Node

OPERATORS = ("=", "!=", "<", "<=", ">", ">=", "regexp", "set_contains", "set_contains_all", "set_contains_any",
             "version", "semver", "is_set", "is_not_set", "distinct_hosts", "distinct_property")  # fmt: skip
_ALIASES = {"==": "=", "is": "=", "not": "!="}
# Keys that name the operator themselves (``version = ">= 1.2"``): the value is the right target.
_SHORTHAND = ("version", "semver", "regexp", "set_contains", "set_contains_all", "set_contains_any")


@dataclass(frozen=True)
class Constraint:
    attribute: str  # Nomad's LTarget
    operator: str
    value: str  # Nomad's RTarget
    where: Mapping[str, str] = field(default_factory=dict)  # job / group / task it is written in
    weight: int = 0  # affinities only

    def text(self) -> str:
        if self.operator == "datacenters":
            return "datacenters = [" + ", ".join(f'"{d}"' for d in self.value.split("\n")) + "]"
        if self.operator == "distinct_hosts":
            return "distinct_hosts = true"
        if self.operator == "distinct_property":
            return f"distinct_property = {self.attribute}" + (f" (limit {self.value})" if self.value else "")
        if self.operator in ("is_set", "is_not_set"):
            return f"{self.attribute} {self.operator}"
        return f'{self.attribute} {self.operator} "{self.value}"'


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _one(body: Mapping[str, Any], where: Mapping[str, str], weight: bool) -> Constraint:
    attribute, value = _text(body.get("attribute")), _text(body.get("value"))
    operator = _text(body.get("operator")) or "="
    for key in _SHORTHAND:
        if body.get(key) is not None:
            operator, value = key, _text(body[key])
    if body.get("distinct_hosts") is True:
        operator = "distinct_hosts"
    if body.get("distinct_property") is not None:
        operator, attribute = "distinct_property", _text(body["distinct_property"])
    for key in ("is_set", "is_not_set"):
        if body.get(key) is not None and not attribute:
            operator, attribute = key, _text(body[key])
    operator = _ALIASES.get(operator, operator)
    w = body.get("weight")
    return Constraint(attribute, operator, value, dict(where), int(w) if weight and isinstance(w, int) else 0)


def _blocks(body: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = body.get(key)
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return [b for b in value if isinstance(b, dict)]
    return []


@dataclass
class Placement:
    """What a job's groups ask of the node: per group, its constraints and affinities (the
    job's, the group's, its tasks'), and how many allocations of it and of the job are placed."""

    constraints: dict[str, list[Constraint]] = field(default_factory=dict)
    affinities: dict[str, list[Constraint]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    # The job's datacenters as written (Nomad's default when absent: every datacenter).
    datacenters: tuple[str, ...] = ("*",)
    job: str = ""
    # The schedule of a periodic job ("" when it is not one): `run` has no agent to launch it on it.
    periodic: str = ""

    @property
    def job_count(self) -> int:
        return sum(self.counts.values())


def collect(data: Mapping[str, Any]) -> Placement:
    """The constraints and affinities of the (evaluated) job file's job, group by group."""
    out = Placement()
    for job_name, job in labelled(data.get("job")):
        jwhere = {"job": job_name}
        out.job = job_name
        dcs = job.get("datacenters")
        if isinstance(dcs, list) and dcs and all(isinstance(d, str) for d in dcs):
            out.datacenters = tuple(dcs)
        periodic = job.get("periodic")
        if periodic is not None:
            body = periodic[0] if isinstance(periodic, list) and periodic else periodic
            crons = body.get("crons") if isinstance(body, dict) else None
            crons = crons if isinstance(crons, list) else [body.get("cron") if isinstance(body, dict) else None]
            out.periodic = ", ".join(f'"{c}"' for c in crons if isinstance(c, str)) or "its schedule"
        job_c = [_one(b, jwhere, False) for b in _blocks(job, "constraint")]
        job_a = [_one(b, jwhere, True) for b in _blocks(job, "affinity")]
        groups = labelled(job.get("group"))
        for name, body in labelled(job.get("task")):  # a task under job is a group of its own
            groups.append((name, {"task": [{name: body}]}))
        for group_name, group in groups:
            gwhere = {"job": job_name, "group": group_name}
            cons = [_one(b, gwhere, False) for b in _blocks(group, "constraint")]
            affs = [_one(b, gwhere, True) for b in _blocks(group, "affinity")]
            for task_name, task in labelled(group.get("task")):
                twhere = {**gwhere, "task": task_name}
                cons += [_one(b, twhere, False) for b in _blocks(task, "constraint")]
                affs += [_one(b, twhere, True) for b in _blocks(task, "affinity")]
            out.constraints[group_name] = job_c + cons
            out.affinities[group_name] = job_a + affs
            count = group.get("count", 1)
            out.counts[group_name] = count if isinstance(count, int) and not isinstance(count, bool) else 1
    return out


_TARGET = re.compile(r"^\$\{(.+)\}$")


def resolve(target: str, node: Node) -> tuple[str | None, bool]:
    """(value, found) of a target: ``${attr.x}``, ``${node.x}``, ``${meta.x}``, or a literal."""
    match = _TARGET.match(target.strip())
    if match is None:
        return target, True
    key = match.group(1).strip()
    known = node.lookup()
    if key.startswith(("attr.", "meta.", "node.")) and key in known:
        return known[key], True
    return None, False


def _number(text: str) -> float | None:
    try:
        return float(int(text))
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _order(op: str, left: str, right: str) -> bool:
    """Numbers compare as numbers, anything else lexically (Nomad's checkOrder)."""
    ln, rn = _number(left), _number(right)
    a: Any
    b: Any
    a, b = (ln, rn) if ln is not None and rn is not None else (left, right)
    return bool({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op])


def _set(text: str) -> set[str]:
    return {part.strip() for part in text.split(",")}


# --- versions ------------------------------------------------------------------------------------

_VERSION = re.compile(
    r"^v?(?P<segs>[0-9]+(?:\.[0-9]+)*)"
    r"(?:-(?P<pre1>[0-9A-Za-z\-~]+(?:\.[0-9A-Za-z\-~]+)*)|(?P<pre2>[A-Za-z\-~][0-9A-Za-z\-~]*(?:\.[0-9A-Za-z\-~]+)*))?"
    r"(?:\+(?P<meta>[0-9A-Za-z\-~]+(?:\.[0-9A-Za-z\-~]+)*))?$"
)


@dataclass(frozen=True)
class Version:
    segments: tuple[int, ...]
    prerelease: str
    given: int  # how many segments were written (the pessimistic operator needs it)

    @classmethod
    def parse(cls, text: str) -> Version | None:
        match = _VERSION.match(text.strip())
        if match is None:
            return None
        segs = tuple(int(s) for s in match.group("segs").split("."))
        padded = segs + (0,) * max(0, 3 - len(segs))
        return cls(padded, match.group("pre1") or match.group("pre2") or "", len(segs))


def _pre_key(pre: str) -> tuple[tuple[int, int, str], ...]:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))


def compare(a: Version, b: Version) -> int:
    """-1, 0, 1: segments, then a release above its prereleases, prereleases part by part."""
    n = max(len(a.segments), len(b.segments))
    sa, sb = a.segments + (0,) * (n - len(a.segments)), b.segments + (0,) * (n - len(b.segments))
    if sa != sb:
        return -1 if sa < sb else 1
    if a.prerelease == b.prerelease:
        return 0
    if not a.prerelease or not b.prerelease:
        return 1 if not a.prerelease else -1
    ka, kb = _pre_key(a.prerelease), _pre_key(b.prerelease)
    return 0 if ka == kb else (-1 if ka < kb else 1)


_CONSTRAINT = re.compile(r"^\s*(~>|>=|<=|!=|=|>|<)?\s*(\S+)\s*$")


def _version_match(have: str, wanted: str, semver: bool) -> bool | None:
    """Whether version ``have`` meets every comma-separated constraint; None when either does
    not parse (Nomad: not met)."""
    version = Version.parse(have)
    if version is None:
        return None
    for part in wanted.split(","):
        match = _CONSTRAINT.match(part)
        want = Version.parse(match.group(2)) if match else None
        if match is None or want is None:
            return None
        op = match.group(1) or "="
        # go-version: a prerelease meets only a constraint naming a prerelease of the same release.
        if not semver and version.prerelease and (not want.prerelease or want.segments != version.segments):
            return False
        c = compare(version, want)
        if op == "~>":
            if semver:
                return None  # Nomad's semver constraints have no pessimistic operator
            keep = max(want.given - 1, 1)
            ok = c >= 0 and version.segments[:keep] == want.segments[:keep]
        else:
            ok = {"=": c == 0, "!=": c != 0, ">": c > 0, "<": c < 0, ">=": c >= 0, "<=": c <= 0}[op]
        if not ok:
            return False
    return True


@functools.lru_cache(maxsize=256)
def _regexp(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


# --- checking ------------------------------------------------------------------------------------


def unmet(c: Constraint, node: Node, placement: Placement | None = None) -> str | None:
    """None when the node meets ``c``; otherwise why not, in a short clause ("attr.x is "5"")."""
    if c.operator == "distinct_hosts":
        placed = _placed(c, placement)
        if placed <= 1:
            return None
        return f"{placed} allocations would share this one node"
    left, lfound = resolve(c.attribute, node)
    shown = _TARGET.sub(lambda m: m.group(1), c.attribute.strip())
    if c.operator == "distinct_property":
        if not lfound:
            return f"{shown} is not set on this node"
        limit = int(c.value) if c.value.isdigit() else 1
        placed = _placed(c, placement)
        if placed <= limit:
            return None
        return f'{placed} allocations would share {shown} = "{left}" (at most {limit})'
    right, rfound = resolve(c.value, node)
    op = c.operator
    if op == "is_set":
        return None if lfound else f"{shown} is not set on this node"
    if op == "is_not_set":
        return None if not lfound else f'{shown} is set on this node ("{left}")'
    if op == "!=":
        return None if (left, lfound) != (right, rfound) else f'{shown} is "{left}"'
    if op not in OPERATORS:
        return f"operator {op!r} is not one Nomad knows"
    if not lfound:
        return f"{shown} is not set on this node"
    if not rfound:
        return f"{c.value} is not set on this node"
    assert left is not None and right is not None
    ok: bool | None
    if op == "=":
        ok = left == right
    elif op in ("<", "<=", ">", ">="):
        ok = _order(op, left, right)
    elif op == "regexp":
        pattern = _regexp(right)
        ok = pattern.search(left) is not None if pattern is not None else None
    elif op in ("set_contains", "set_contains_all"):
        ok = _set(right) <= _set(left)
    elif op == "set_contains_any":
        ok = bool(_set(right) & _set(left))
    else:  # version, semver
        ok = _version_match(left, right, op == "semver")
        parsed = Version.parse(left)
        if ok is False and op == "version" and parsed is not None and parsed.prerelease:
            return f'{shown} is "{left}", a prerelease, which `version` never matches to a release; use semver'
        if ok is None:
            return f'{shown} is "{left}", which cannot be compared as a version with "{right}"'
    if ok is None:
        return f'"{right}" is not a valid regular expression'
    return None if ok else f'{shown} is "{left}"'


def _placed(c: Constraint, placement: Placement | None) -> int:
    if placement is None:
        return 1
    group = c.where.get("group")
    if group is None:  # written at job level: every allocation of the job
        return placement.job_count
    return placement.counts.get(group, 1)


def _place(where: Mapping[str, str]) -> str:
    return " ".join(f'{k} "{where[k]}"' for k in ("job", "group", "task") if where.get(k))


def datacenter_matches(pattern: str, datacenter: str) -> bool:
    """Whether ``datacenter`` matches a ``datacenters`` entry: ``*`` is any run of characters,
    every other character stands for itself (go-glob, which the scheduler uses, has no ``?`` or ``[]``)."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return pattern == datacenter
    regex = ".*".join(re.escape(p) for p in parts)
    return re.fullmatch(regex, datacenter, re.DOTALL) is not None


PERIODIC = "periodic"  # the pseudo-constraint of a periodic job, which `run` does not launch
DATACENTERS = "datacenters"  # the operator of the pseudo-constraint refusals() reports an unmet datacenters with


def refusals(placement: Placement, node: Node, group: str) -> list[tuple[Constraint, str]]:
    """The group's constraints this node does not meet, each with why; the job's datacenters first."""
    if placement.counts.get(group, 1) == 0:
        return []
    out = []
    if placement.periodic:
        out.append((Constraint("", PERIODIC, placement.periodic, {"job": placement.job}), ""))
    if not any(datacenter_matches(p, node.datacenter) for p in placement.datacenters):
        c = Constraint("${node.datacenter}", DATACENTERS, "\n".join(placement.datacenters), {"job": placement.job})
        out.append((c, f'this node is in datacenter "{node.datacenter}"'))
    for c in placement.constraints.get(group, []):
        why = unmet(c, node, placement)
        if why is not None:
            out.append((c, why))
    return out


def sentence(c: Constraint, why: str, affinity: bool = False) -> str:
    if c.operator == PERIODIC:
        # The file is a valid Nomad job: what refuses it is `run`, which has no scheduling agent.
        return (
            f"driversdk run does not run periodic jobs on its own: this one is launched at {c.value} by a "
            "scheduling agent; start one (`driversdk agent`) and run the job again to have it launched on schedule, "
            "or, to run one instance now, remove the periodic block and run the file again"
        )
    if c.operator == DATACENTERS:
        asked = ", ".join(f'"{d}"' for d in c.value.split("\n"))
        return (
            f"the job asks for datacenters {asked} and {why} (the client config's datacenter); driversdk run does "
            "not place the job here (add the node's datacenter to datacenters, or set datacenter in the client config)"
        )
    if affinity:
        return (
            f"affinity {c.text()} ({_place(c.where)}) is not met on this node: {why}; "
            "driversdk run places the group here anyway"
        )
    return (
        f"constraint {c.text()} is not met on this node: {why}; driversdk run does not place the group here "
        "(change the constraint, or the client config's meta/name/datacenter/node_class)"
    )
