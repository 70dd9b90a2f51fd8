"""The agent's state in Nomad's API JSON: job and allocation stubs and objects, task states with
their events, the node with its drivers. Field names and values are those of Nomad's ``api``
package, so Nomad's clients read them unchanged. Everything is read from ``state.db`` (the same
records ``driversdk status`` reads), so recovered and finished allocations look as live ones do.

An answer about many allocations (a job's allocations, its summary, the job list) reads their tasks
and events in one query each (:class:`Reads`), not once per allocation: under a job of 1000
allocations starting, a client waiting on the list (a blocking query) asks again after each change.
"""

from __future__ import annotations

import json
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from driversdk.agent.events import RunEventType
from driversdk.agent.state.jobstore import JobRecord
from driversdk.agent.state.runstate import AllocRecord, KeptEvent, RunState, TaskRecord

if TYPE_CHECKING:
    from driversdk.agent.agent import Agent

NAMESPACE = "default"
REGION = "global"


def rfc3339(seconds: float | None) -> str | None:
    if not seconds:
        return None
    fraction = f"{seconds % 1:.9f}"[1:]
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + fraction + "Z"


# --- jobs ---------------------------------------------------------------------------------------


def job_status(agent: Agent, record: JobRecord) -> str:
    """Nomad's job status: ``dead`` once every allocation is over, even while the agent is still
    releasing what they held."""
    if record.status.value != "running" or agent.node is None:
        return record.status.value  # pending: being started (or replaced by an update) right now
    statuses = _client_statuses(agent, record.id)
    if statuses and all(status in _TERMINAL for _, status in statuses):
        return "dead"
    return record.status.value


def _client_statuses(agent: Agent, job: str) -> list[tuple[AllocRecord, str]]:
    """Each allocation of ``job`` with its client status. The job list and a job's summary ask for
    it on every answer, and an API client polling the job list while 1000 allocations start or stop
    must not have every task of the job read and converted each time: each allocation's status is
    kept with the allocation's version (:meth:`RunState.version`) it was worked out at, and only the
    allocations written since are read again. The version is read before the rows, so a write
    racing the read leaves an older version beside newer rows: one more read, never a stale status."""
    assert agent.node is not None
    state = agent.node.state
    kept = _STATUSES.setdefault(state, {}).setdefault(job, {})
    allocs = state.allocs(job)
    if len(kept) > len(allocs) + 64:
        kept.clear()  # allocations collected since: forgotten with the rest, read again once
    versions = [state.version(alloc.alloc_id) for alloc, _ in allocs]
    stale = {
        alloc.alloc_id
        for (alloc, _), version in zip(allocs, versions, strict=True)
        if (found := kept.get(alloc.alloc_id)) is None or found[0] != version
    }
    if stale:
        many = len(stale) > len(allocs) // 2
        tasks = state.tasks_by_alloc(job) if many else state.tasks_by_alloc(alloc_ids=sorted(stale))
        for (alloc, _), version in zip(allocs, versions, strict=True):
            if alloc.alloc_id in stale:
                kept[alloc.alloc_id] = (version, client_status(alloc, tasks.get(alloc.alloc_id, [])))
    return [(alloc, kept[alloc.alloc_id][1]) for alloc, _ in allocs]


# A job's allocations' client statuses, per state store, by job, by allocation: the allocation's
# version when its status was worked out, and the status.
_Status = tuple[int, str]
_STATUSES: weakref.WeakKeyDictionary[RunState, dict[str, dict[str, _Status]]] = weakref.WeakKeyDictionary()


_TERMINAL = ("complete", "failed", "lost")


def job(agent: Agent, record: JobRecord) -> dict[str, Any]:
    out = dict(record.spec)
    out.update(
        ID=record.id,
        Namespace=NAMESPACE,
        Region=out.get("Region") or REGION,
        Type=record.type,
        Priority=out.get("Priority") or 50,
        Stop=record.stop,
        Status=job_status(agent, record),
        StatusDescription="",
        Version=record.version,
        SubmitTime=record.submit_time,
        CreateIndex=record.create_index,
        ModifyIndex=record.modify_index,
        JobModifyIndex=record.modify_index,
    )
    return out


def job_stub(agent: Agent, record: JobRecord) -> dict[str, Any]:
    spec = record.spec
    return {
        "ID": record.id,
        "ParentID": "",
        "Name": record.name,
        "Namespace": NAMESPACE,
        "Datacenters": spec.get("Datacenters") or ["*"],
        "Multiregion": None,
        "Type": record.type,
        "Priority": spec.get("Priority") or 50,
        "Periodic": bool(spec.get("Periodic")),
        "ParameterizedJob": bool(spec.get("ParameterizedJob")),
        "Stop": record.stop,
        "Status": job_status(agent, record),
        "StatusDescription": "",
        "JobSummary": summary(agent, record),
        "CreateIndex": record.create_index,
        "ModifyIndex": record.modify_index,
        "JobModifyIndex": record.modify_index,
        "SubmitTime": record.submit_time,
        "Meta": spec.get("Meta"),
    }


def summary(agent: Agent, record: JobRecord) -> dict[str, Any]:
    groups: dict[str, dict[str, int]] = {}
    for group in record.spec.get("TaskGroups") or []:
        if isinstance(group, dict) and isinstance(group.get("Name"), str):
            groups[group["Name"]] = _empty_summary()
    assert agent.node is not None
    for alloc, status in _client_statuses(agent, record.id):
        counts = groups.setdefault(alloc.group, _empty_summary())
        key = {"pending": "Starting", "running": "Running", "complete": "Complete", "failed": "Failed",
               "lost": "Lost"}.get(status, "Unknown")  # fmt: skip
        counts[key] += 1
    return {
        "JobID": record.id,
        "Namespace": NAMESPACE,
        "Summary": groups,
        "Children": {"Pending": 0, "Running": 0, "Dead": 0},
        "CreateIndex": record.create_index,
        "ModifyIndex": record.modify_index,
    }


def _empty_summary() -> dict[str, int]:
    return {"Queued": 0, "Complete": 0, "Failed": 0, "Running": 0, "Starting": 0, "Lost": 0, "Unknown": 0}


# --- allocations --------------------------------------------------------------------------------

# run_tasks states → (Nomad's task State, Failed)
_TASK_STATES = {
    "starting": ("pending", False),
    "restarting": ("pending", False),
    "running": ("running", False),
    "complete": ("dead", False),
    "stopped": ("dead", False),
    "failed": ("dead", True),
    "lost": ("dead", True),
}


def task_state(record: TaskRecord, events: list[KeptEvent], converted: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Nomad's TaskState of a task, from its record and its kept events (``converted``: the API
    form of each event by seq, filled here as needed)."""
    state, failed = _TASK_STATES.get(record.state, ("pending", False))
    # "finished" is the run's own closing line (the exit after the restart policy); Nomad's
    # Terminated and Killed events already say it.
    api_events = [_event(e, converted) for e in events if e.event.get("type") != RunEventType.FINISHED]
    if failed and api_events and api_events[-1]["Type"] == "Restarting":
        state, failed = "pending", False  # waiting out its restart delay, as Nomad shows it
    started = [e["Time"] for e in api_events if e["Type"] == "Started"]
    restarted = [e["Time"] for e in api_events if e["Type"] == "Restarting"]
    return {
        "State": state,
        "Failed": failed,
        "Restarts": record.restarts,
        "LastRestart": rfc3339(restarted[-1] / 1e9) if restarted else None,
        "StartedAt": rfc3339(started[0] / 1e9) if started else None,
        "FinishedAt": rfc3339(record.updated) if state == "dead" else None,
        "Events": api_events,
        "TaskHandle": None,
    }


def _event(kept: KeptEvent, converted: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A kept event (``RunEvent.to_json``) as Nomad's TaskEvent, converted once per row: the dict
    is shared by every answer that shows the event, which only serialise it."""
    found = converted.get(kept.seq)
    if found is not None:
        return found
    from driversdk.agent.events import RunEvent

    stored = kept.event
    details = stored.get("details")
    event = RunEvent(
        str(stored.get("kind") or "task"),
        str(stored.get("message") or ""),
        time=float(stored.get("time") or 0),
        type=str(stored.get("type") or ""),
        exit_code=stored.get("exit_code"),
        signal=stored.get("signal"),
        fails_task=bool(stored.get("fails_task")),
        details={str(k): str(v) for k, v in details.items()} if isinstance(details, dict) else {},
    )
    if len(converted) >= CONVERTED_EVENTS_CACHED:
        converted.clear()
    api = converted[kept.seq] = event.to_api()
    return api


# The API form of kept events, per state store (one per data dir), by seq.
_CONVERTED: weakref.WeakKeyDictionary[RunState, dict[int, dict[str, Any]]] = weakref.WeakKeyDictionary()
CONVERTED_EVENTS_CACHED = 20_000


def _converted(state: RunState) -> dict[int, dict[str, Any]]:
    found = _CONVERTED.get(state)
    if found is None:
        found = _CONVERTED[state] = {}
    return found


@dataclass(frozen=True)
class Reads:
    """What answers about allocations read of their tasks, each in one query."""

    tasks: dict[str, list[TaskRecord]]
    events: dict[tuple[str, str], list[KeptEvent]]

    @classmethod
    def of_job(cls, state: RunState, job: str | None) -> Reads:
        """Every allocation of ``job`` (of every job when None)."""
        return cls(state.tasks_by_alloc(job), state.events_by_task(job=job))

    @classmethod
    def of_allocs(cls, state: RunState, alloc_ids: list[str]) -> Reads:
        """The allocations ``alloc_ids`` (a few reads for many)."""
        return cls(state.tasks_by_alloc(alloc_ids=alloc_ids), state.events_by_task(alloc_ids=alloc_ids))

    @classmethod
    def of_alloc(cls, state: RunState, alloc_id: str) -> Reads:
        return cls({alloc_id: state.tasks(alloc_id)}, state.events_by_task(alloc_id=alloc_id))


def client_status(alloc: AllocRecord, tasks: list[TaskRecord]) -> str:
    states = [_TASK_STATES.get(t.state, ("pending", False)) for t in tasks]
    if any(s == "running" for s, _ in states):
        return "running"
    if tasks and all(s == "dead" for s, _ in states):
        if any(t.state == "lost" for t in tasks):
            return "lost"
        return "failed" if any(f for _, f in states) or alloc.state == "failed" else "complete"
    if alloc.state == "failed":
        return "failed"
    if alloc.state == "stopped":
        return "complete"
    return "pending"


def _alloc_name(alloc: AllocRecord) -> str:
    return f"{alloc.job}.{alloc.group}[{alloc.index}]"


def _killed(events: list[KeptEvent]) -> bool:
    """Whether the task was stopped by the client (a Killing event) rather than ending by itself."""
    return any(e.event.get("type") == "Killing" for e in events)


def _first_event_time(events: list[KeptEvent], task: TaskRecord) -> float:
    times = [float(e.event.get("time") or 0) for e in events[:1]]
    return times[0] if times and times[0] else task.updated


def alloc_stub(
    agent: Agent, alloc: AllocRecord, updated: float, record: JobRecord | None = None, reads: Reads | None = None
) -> dict[str, Any]:
    """Nomad's AllocListStub; ``record``: the allocation's job, when the caller has read it;
    ``reads``: its tasks and events, when the caller has read them with others'."""
    assert agent.node is not None
    if reads is None:
        reads = Reads.of_alloc(agent.node.state, alloc.alloc_id)
    tasks = reads.tasks.get(alloc.alloc_id, [])
    events = {t.task: reads.events.get((alloc.alloc_id, t.task), []) for t in tasks}
    converted = _converted(agent.node.state)
    if record is None and agent.jobs is not None:
        record = agent.jobs.get(alloc.job)
    node = agent.node_info()
    # Stopped on request (the job stopped, or replaced by an update) is desired "stop"; an
    # allocation whose tasks ended by themselves stays desired "run", as in Nomad.
    replaced = alloc.state != "running" and any(_killed(events[t.task]) for t in tasks)
    desired = "stop" if (record is None or record.stop or replaced) else "run"
    return {
        "ID": alloc.alloc_id,
        "EvalID": "",
        "Name": _alloc_name(alloc),
        "Namespace": NAMESPACE,
        "NodeID": node.id,
        "NodeName": node.name,
        "JobID": alloc.job,
        "JobType": record.type if record is not None else "",
        "JobVersion": record.version if record is not None else 0,
        "TaskGroup": alloc.group,
        "DesiredStatus": desired,
        "DesiredDescription": "alloc is being stopped" if desired == "stop" and alloc.state == "running" else "",
        "ClientStatus": client_status(alloc, tasks),
        "ClientDescription": "",
        "TaskStates": {t.task: task_state(t, events[t.task], converted) for t in tasks},
        "CreateIndex": 0,
        "ModifyIndex": agent.index,
        "CreateTime": int(min([updated, *(_first_event_time(events[t.task], t) for t in tasks)]) * 1e9),
        "ModifyTime": int(updated * 1e9),
    }


def alloc_stubs(agent: Agent, job: str | None = None, prefix: str = "") -> bytes:
    """Nomad's AllocListStub of every allocation (of ``job``; whose id starts with ``prefix``),
    oldest first, as the JSON answer. Each allocation's JSON is kept, encoded, until the store
    records something about it (its version) or its job or node changes; only the changed ones
    are read (their tasks and events: per allocation when few, in one query each when many)."""
    assert agent.node is not None
    state = agent.node.state
    allocs = state.allocs_by_prefix(prefix) if prefix else state.allocs(job)
    if not allocs:
        return b"[]"
    encoded = _encoded(state)
    if len(encoded) > ENCODED_STUBS_CACHED:
        encoded.clear()
    node = agent.node_info()
    records: dict[str, JobRecord | None] = {}
    keys = []
    for alloc, updated in allocs:
        if alloc.job not in records:
            records[alloc.job] = agent.jobs.get(alloc.job) if agent.jobs is not None else None
        record = records[alloc.job]
        # Everything the stub shows but the agent's index, which is added below.
        keys.append(
            (
                alloc,
                updated,
                state.version(alloc.alloc_id),
                (record.modify_index, record.stop, record.status) if record is not None else None,
                (node.id, node.name),
            )
        )
    stale = [i for i, key in enumerate(keys) if (found := encoded.get(key[0].alloc_id)) is None or found[0] != key]
    # Many changed: their rows in a few reads (the whole job's when most changed, which also
    # spares binding a thousand ids), not two reads each.
    if len(stale) > len(allocs) // 2:
        reads: Reads | None = Reads.of_job(state, None if prefix else job)
    elif len(stale) > STUBS_READ_ONE_BY_ONE:
        reads = Reads.of_allocs(state, [allocs[i][0].alloc_id for i in stale])
    else:
        reads = None
    for i in stale:
        alloc, updated = allocs[i]
        stub = alloc_stub(agent, alloc, updated, records[alloc.job], reads)
        del stub["ModifyIndex"]
        encoded[alloc.alloc_id] = (keys[i], json.dumps(stub)[:-1].encode())
    index = b',"ModifyIndex": %d}' % agent.index
    return b"[" + b", ".join(encoded[alloc.alloc_id][1] + index for alloc, _ in allocs) + b"]"


# Changed allocations up to this many have their tasks and events read one allocation at a time.
STUBS_READ_ONE_BY_ONE = 16

# Each allocation's AllocListStub JSON without its ModifyIndex, per state store, by allocation id.
_ENCODED: weakref.WeakKeyDictionary[RunState, dict[str, tuple[object, bytes]]] = weakref.WeakKeyDictionary()
ENCODED_STUBS_CACHED = 10_000


def _encoded(state: RunState) -> dict[str, tuple[object, bytes]]:
    found = _ENCODED.get(state)
    if found is None:
        found = _ENCODED[state] = {}
    return found


def allocation(agent: Agent, alloc: AllocRecord, updated: float) -> dict[str, Any]:
    record = agent.jobs.get(alloc.job) if agent.jobs is not None else None
    out = alloc_stub(agent, alloc, updated, record)
    out["Job"] = job(agent, record) if record is not None else None
    out["AllocModifyIndex"] = out["ModifyIndex"]
    out["AllocatedResources"] = {"Shared": {"Ports": agent.ports_of(alloc.alloc_id), "Networks": None}, "Tasks": {}}
    out["AllocDir"] = alloc.alloc_dir
    return out


# --- node ---------------------------------------------------------------------------------------


def node(agent: Agent, full: bool = True) -> dict[str, Any]:
    info = agent.node_info()
    drivers = {
        name: {
            "Attributes": health.attributes,
            "Detected": True,
            "Healthy": health.healthy,
            "HealthDescription": health.description,
            "UpdateTime": rfc3339(health.updated / 1e9),
        }
        for name, health in sorted(agent.health.items())
    }
    out: dict[str, Any] = {
        "ID": info.id,
        "Name": info.name,
        "Datacenter": info.datacenter,
        "NodeClass": info.node_class,
        "NodePool": info.pool,
        "Status": "ready",
        "StatusDescription": "",
        "SchedulingEligibility": "eligible",
        "Drain": False,
        "Drivers": drivers,
        "Address": "127.0.0.1",
        "Version": agent.version(),
        "CreateIndex": 1,
        "ModifyIndex": agent.index,
    }
    if full:
        out.update(
            Attributes=info.attributes,
            Meta=info.meta,
            HTTPAddr=agent.settings.tcp.url().removeprefix("http://") if agent.settings.tcp else "",
            StatusUpdatedAt=int(agent.started_at),
            HostVolumes={
                name: {"Name": name, "Path": v.host_path, "ReadOnly": v.read_only}
                for name, v in sorted(agent.client.host_volumes.items())
            },
        )
    return out
