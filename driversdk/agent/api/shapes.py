"""The agent's state in Nomad's API JSON: job and allocation stubs and objects, task states with
their events, the node with its drivers. Field names and values are those of Nomad's ``api``
package, so Nomad's clients read them unchanged. Everything is read from ``state.db`` (the same
records ``driversdk status`` reads), so recovered and finished allocations look as live ones do.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from driversdk.agent.events import RunEventType
from driversdk.agent.state.jobstore import JobRecord
from driversdk.agent.state.runstate import AllocRecord, TaskRecord

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
    allocs = agent.node.state.allocs(record.id)
    if allocs and all(client_status(a, agent.node.state.tasks(a.alloc_id)) in _TERMINAL for a, _ in allocs):
        return "dead"
    return record.status.value


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
    for alloc, _ in agent.node.state.allocs(record.id):
        counts = groups.setdefault(alloc.group, _empty_summary())
        status = client_status(alloc, agent.node.state.tasks(alloc.alloc_id))
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


def task_state(record: TaskRecord, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Nomad's TaskState of a task, from its record and its kept events."""
    state, failed = _TASK_STATES.get(record.state, ("pending", False))
    # "finished" is the run's own closing line (the exit after the restart policy); Nomad's
    # Terminated and Killed events already say it.
    api_events = [_event(e) for e in events if e.get("type") != RunEventType.FINISHED]
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


def _event(stored: dict[str, Any]) -> dict[str, Any]:
    """A kept event (``RunEvent.to_json``) as Nomad's TaskEvent."""
    from driversdk.agent.events import RunEvent

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
    return event.to_api()


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


def _killed(events: list[dict[str, Any]]) -> bool:
    """Whether the task was stopped by the client (a Killing event) rather than ending by itself."""
    return any(e.get("type") == "Killing" for e in events)


def _first_event_time(events: list[dict[str, Any]], task: TaskRecord) -> float:
    times = [float(e.get("time") or 0) for e in events[:1]]
    return times[0] if times and times[0] else task.updated


def alloc_stub(agent: Agent, alloc: AllocRecord, updated: float, record: JobRecord | None = None) -> dict[str, Any]:
    """Nomad's AllocListStub; ``record``: the allocation's job, when the caller has read it."""
    assert agent.node is not None
    tasks = agent.node.state.tasks(alloc.alloc_id)
    # Each task's events read once: an answer under load is mostly these reads.
    events = {t.task: agent.node.state.task_events(t.alloc_id, t.task) for t in tasks}
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
        "TaskStates": {t.task: task_state(t, events[t.task]) for t in tasks},
        "CreateIndex": 0,
        "ModifyIndex": agent.index,
        "CreateTime": int(min([updated, *(_first_event_time(events[t.task], t) for t in tasks)]) * 1e9),
        "ModifyTime": int(updated * 1e9),
    }


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
