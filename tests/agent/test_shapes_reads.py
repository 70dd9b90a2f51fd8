"""Answers about many allocations read their tasks and events once, not once per allocation.

Under a job of hundreds of allocations starting, a client waiting on the job's allocations (a
blocking query) asks again after every change, and each answer read every allocation's tasks and
every task's events one query at a time: thousands of reads per answer, and every other request of
the API waited behind them. The statements a real state.db sees are counted through sqlite's trace
hook; the answers are compared with the per-allocation ones, field by field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from driversdk.agent.api import shapes
from driversdk.agent.events import RunEvent
from driversdk.agent.state.jobstore import JobStatus, JobStore
from driversdk.agent.state.runstate import RunState, TaskStart

ALLOCS = 40


@dataclass
class _Node:
    state: RunState


@dataclass
class _NodeInfo:
    id: str = "node-1"
    name: str = "vm"


class _Agent:
    """What the shapes read of an agent: its stores, its index and its node's name."""

    def __init__(self, data: Path) -> None:
        self.node = _Node(RunState(str(data), writer=True))
        self.jobs = JobStore(str(data), writer=True)
        self.index = 7

    def node_info(self) -> _NodeInfo:
        return _NodeInfo()


def _record_job(agent: _Agent, job: str, allocs: int) -> list[str]:
    state = agent.node.state
    agent.jobs.put(job, {"ID": job, "Name": job, "Type": "service", "TaskGroups": [{"Name": "g"}]})
    ids = []
    for index in range(allocs):
        alloc_id = f"{job}-{index:04d}-0000-0000-000000000000"[:36]
        state.alloc_started(alloc_id, job, "g", index, f"/allocs/{alloc_id}")
        for task in ("main", "side"):
            start = TaskStart(alloc_id, job, "g", task, "exec", f"{alloc_id}/{task}", f"/allocs/{alloc_id}")
            state.starting(start)
            state.started(start, b"handle")
            for kind, message in (("Received", "Task received by client"), ("Started", "Task started by client")):
                event = RunEvent("task", message, job=job, task=task, type=kind)
                state.task_event(alloc_id, task, event.to_json())
        ids.append(alloc_id)
    return ids


def _count_reads(agent: _Agent) -> list[str]:
    seen: list[str] = []
    agent.node.state._reader.set_trace_callback(seen.append)
    agent.jobs._reader.set_trace_callback(seen.append)
    return seen


def test_a_jobs_allocations_are_answered_in_a_few_reads(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    ids = _record_job(agent, "web", ALLOCS)
    _record_job(agent, "other", 3)
    seen = _count_reads(agent)
    stubs = json.loads(shapes.alloc_stubs(agent, job="web"))  # type: ignore[arg-type]
    assert [s["ID"] for s in stubs] == ids
    # allocations, their tasks, their events, the job: a handful, whatever the count (was 1 + 3 per allocation)
    assert len(seen) <= 6, seen
    assert all(s["ClientStatus"] == "running" for s in stubs)
    assert [e["Type"] for e in stubs[0]["TaskStates"]["main"]["Events"]] == ["Received", "Started"]


def test_the_batched_answer_is_the_per_allocation_answer(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    _record_job(agent, "web", 5)
    _record_job(agent, "other", 2)
    state = agent.node.state
    batched = json.loads(shapes.alloc_stubs(agent, job="web"))  # type: ignore[arg-type]
    one_by_one = [shapes.alloc_stub(agent, a, updated) for a, updated in state.allocs("web")]  # type: ignore[arg-type]
    assert batched == one_by_one
    everything = json.loads(shapes.alloc_stubs(agent))  # type: ignore[arg-type]
    assert {s["JobID"] for s in everything} == {"web", "other"} and len(everything) == 7
    by_prefix = json.loads(shapes.alloc_stubs(agent, prefix="other"))  # type: ignore[arg-type]
    assert [s["JobID"] for s in by_prefix] == ["other", "other"]
    assert by_prefix == [s for s in everything if s["JobID"] == "other"]


def test_a_job_summary_and_status_read_tasks_once(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    _record_job(agent, "web", ALLOCS)
    record = agent.jobs.get("web")
    assert record is not None
    seen = _count_reads(agent)
    summary: dict[str, Any] = shapes.summary(agent, record)  # type: ignore[arg-type]
    assert summary["Summary"]["g"]["Running"] == ALLOCS
    assert len(seen) <= 3, seen


def test_kept_events_are_parsed_once_and_never_shared_for_writing(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    [alloc_id] = _record_job(agent, "web", 1)
    state = agent.node.state
    first = state.task_events(alloc_id, "main")
    first[0]["message"] = "changed by a caller"
    again = state.task_events(alloc_id, "main")
    assert again[0]["message"] == "Task received by client"
    a = state.events_by_task(job="web")[(alloc_id, "main")]
    b = state.events_by_task(alloc_id=alloc_id)[(alloc_id, "main")]
    assert [k.seq for k in a] == [k.seq for k in b] and a[0] is b[0]  # one parse per row


def test_a_stub_is_encoded_again_only_when_what_it_shows_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = _Agent(tmp_path)
    ids = _record_job(agent, "web", 3)
    state = agent.node.state
    first = json.loads(shapes.alloc_stubs(agent, job="web"))  # type: ignore[arg-type]
    agent.index = 8
    state.finished(ids[1], "main", 3, 0, False)
    state.task_event(
        ids[1], "main", RunEvent("task", "Exit Code: 3", job="web", task="main", type="Terminated").to_json()
    )
    second = json.loads(shapes.alloc_stubs(agent, job="web"))  # type: ignore[arg-type]
    assert [s["ModifyIndex"] for s in first] == [7, 7, 7] and [s["ModifyIndex"] for s in second] == [8, 8, 8]
    assert second[0] == dict(first[0], ModifyIndex=8) and second[2] == dict(first[2], ModifyIndex=8)
    changed = second[1]["TaskStates"]["main"]
    assert changed["State"] == "dead" and changed["Events"][-1]["Type"] == "Terminated"
    one = shapes.alloc_stub(agent, *state.alloc_by_id(ids[1]))  # type: ignore[arg-type, misc]
    assert second[1] == one


def test_every_write_about_an_allocation_moves_its_version_and_reads_do_not(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    [alloc_id] = _record_job(agent, "web", 1)
    state = agent.node.state
    seen = [state.version(alloc_id)]

    def moved() -> bool:
        seen.append(state.version(alloc_id))
        return seen[-1] != seen[-2]

    state.task_events(alloc_id, "main")
    state.tasks_by_alloc("web")
    assert not moved()
    state.task_event(alloc_id, "main", RunEvent("task", "x", job="web", task="main", type="Killing").to_json())
    assert moved()
    state.killed(alloc_id, "main")
    assert moved()
    state.alloc_update(alloc_id, state="stopped")
    assert moved()
    state.set_logmon(alloc_id, "side", 0)
    assert moved()
    assert state.version("never-written") == 0


def test_the_allocation_rows_are_read_again_after_each_write_of_one(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    ids = _record_job(agent, "web", 3)
    state = agent.node.state
    first = state.allocs("web")
    seen = _count_reads(agent)
    assert state.allocs("web") == first and seen == [], "kept while no allocation row was written"
    state.task_event(ids[0], "main", RunEvent("task", "x", job="web", task="main", type="Killing").to_json())
    assert state.allocs("web") == first and len([q for q in seen if "run_allocs" in q]) == 0
    state.alloc_update(ids[0], state="stopped")
    now = state.allocs("web")
    assert now[0][0].state == "stopped" and now[1:] == first[1:]
    state.alloc_collected(ids[2])
    assert [a.alloc_id for a, _ in state.allocs("web")] == ids[:2]
    assert [a.alloc_id for a, _ in state.allocs()] == ids[:2]


def test_after_a_write_only_the_written_allocation_rows_are_read_again(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    ids = _record_job(agent, "web", ALLOCS)
    other = _record_job(agent, "other", 2)
    state = agent.node.state
    first = state.allocs("web")
    everything = state.allocs()
    seen = _count_reads(agent)
    state.alloc_update(ids[5], state="stopped")
    state.alloc_update(other[0], state="stopped")
    now = state.allocs("web")
    [read] = [q for q in seen if "run_allocs" in q]
    assert ids[5] in read and ids[6] not in read and other[0] not in read, "only this job's rows written since"
    assert now[5][0].state == "stopped" and now[:5] == first[:5] and now[6:] == first[6:]
    assert now[0][0] is first[0][0], "an unchanged row keeps its record"
    seen.clear()
    state.alloc_update(other[1], state="stopped")
    assert state.allocs("web") == now and seen == [], "another job's write: nothing of this job read"
    state.alloc_collected(ids[7])
    assert [a.alloc_id for a, _ in state.allocs("web")] == ids[:7] + ids[8:]
    assert [a.state for a, _ in state.allocs()] == [
        "stopped" if a.alloc_id in (ids[5], *other) else "running" for a, _ in everything if a.alloc_id != ids[7]
    ]
    [new] = _record_job(agent, "late", 1)
    seen.clear()
    listed = [a.alloc_id for a, _ in state.allocs()]
    assert listed[-1] == new and len(listed) == ALLOCS - 1 + 2 + 1, "an inserted row listed last"
    assert [q for q in seen if "run_allocs" in q and "alloc_id IN" not in q] == [], "only the new row read"
    state.alloc_started(ids[2], "web", "g", 2, f"/allocs/{ids[2]}")  # replaced: a new rowid, so listed last
    full = [a.alloc_id for a, _ in state.allocs()]
    assert full[-1] == ids[2] and full[:-1] == [a for a in listed if a != ids[2]]
    assert [a.alloc_id for a, _ in state.allocs("web")][-1] == ids[2]
    fresh = RunState(str(tmp_path))  # what a store reading every row lists
    assert [(a, t) for a, t in fresh.allocs()] == state.allocs()
    assert fresh.allocs("web") == state.allocs("web")


def test_a_jobs_statuses_read_only_the_allocations_written_since_and_never_lag(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    ids = _record_job(agent, "web", ALLOCS)
    agent.jobs.set_status("web", JobStatus.RUNNING)
    record = agent.jobs.get("web")
    assert record is not None
    state = agent.node.state
    assert shapes.job_status(agent, record) == "running"  # type: ignore[arg-type]
    seen = _count_reads(agent)
    agent.index += 5  # the index moved elsewhere: nothing of this job was written
    assert shapes.summary(agent, record)["Summary"]["g"]["Running"] == ALLOCS  # type: ignore[arg-type]
    assert [q for q in seen if "run_tasks" in q] == [], "kept while none of the job's allocations was written"
    for task in ("main", "side"):
        state.finished(ids[3], task, 0, 0, False)
    seen.clear()
    # Shown at once, with the index unchanged, and only the written allocation's tasks read.
    counts = shapes.summary(agent, record)["Summary"]["g"]  # type: ignore[arg-type]
    assert (counts["Running"], counts["Complete"]) == (ALLOCS - 1, 1)
    [read] = [q for q in seen if "run_tasks" in q]
    assert ids[3] in read and ids[4] not in read
    state.alloc_update(ids[3], state="stopped")  # a write of the allocation row itself
    for alloc_id in ids:
        for task in ("main", "side"):
            state.finished(alloc_id, task, 0, 0, False)
    assert shapes.job_status(agent, record) == "dead"  # type: ignore[arg-type]
    assert shapes.summary(agent, record)["Summary"]["g"]["Complete"] == ALLOCS  # type: ignore[arg-type]


def test_a_few_changed_stubs_read_only_their_allocations(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    allocs = 3 * (shapes.STUBS_READ_ONE_BY_ONE + 1)  # more changed than are read one by one
    ids = _record_job(agent, "web", allocs)
    first = json.loads(shapes.alloc_stubs(agent, job="web"))  # type: ignore[arg-type]
    changed = ids[1 : 1 + allocs // 3]
    for alloc_id in changed:
        agent.node.state.finished(alloc_id, "main", 0, 0, False)
    seen = _count_reads(agent)
    second = json.loads(shapes.alloc_stubs(agent, job="web"))  # type: ignore[arg-type]
    reads = [q for q in seen if "run_tasks" in q or "run_task_events" in q]
    assert len(reads) == 2 and all(ids[0] not in q and changed[-1] in q for q in reads), reads
    assert [s["TaskStates"]["main"]["State"] for s in second] == [
        "dead" if alloc_id in changed else "running" for alloc_id in ids
    ]
    unchanged = [i for i, alloc_id in enumerate(ids) if alloc_id not in changed]
    assert all(second[i] == first[i] for i in unchanged)
    assert second == [shapes.alloc_stub(agent, *agent.node.state.alloc_by_id(a)) for a in ids]  # type: ignore[arg-type, misc]


def test_one_allocation_is_answered_again_without_a_read_until_it_is_written(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)
    ids = _record_job(agent, "web", 2)
    state = agent.node.state

    def answer(alloc_id: str) -> dict[str, Any]:
        found = state.alloc_by_id(alloc_id)
        assert found is not None
        return shapes.alloc_stub(agent, *found, agent.jobs.get("web"))  # type: ignore[arg-type]

    first = answer(ids[0])
    seen = _count_reads(agent)
    assert answer(ids[0]) == first and seen == [], "nothing about it or its job was written"
    state.finished(ids[1], "main", 0, 0, False)
    assert answer(ids[0]) == first and seen == [], "another allocation's write"
    state.finished(ids[0], "main", 0, 0, False)
    now = answer(ids[0])
    assert now["TaskStates"]["main"]["State"] == "dead" and len(seen) == 3  # the allocation, its tasks, its events
    state.task_event(ids[0], "side", RunEvent("task", "x", job="web", task="side", type="Killing").to_json())
    assert answer(ids[0])["TaskStates"]["side"]["Events"][-1]["Type"] == "Killing"
    seen.clear()
    agent.jobs.mark_stopped("web")
    assert answer(ids[0])["DesiredStatus"] == "stop" and [q for q in seen if "agent_jobs" in q]
    state.alloc_collected(ids[0])
    assert state.alloc_by_id(ids[0]) is None and state.tasks(ids[0]) == []


def test_a_reader_of_a_data_dir_another_store_writes_sees_every_write(tmp_path: Path) -> None:
    agent = _Agent(tmp_path)  # the writer (the agent, or a run)
    ids = _record_job(agent, "web", 2)
    reader, jobs = RunState(str(tmp_path)), JobStore(str(tmp_path))  # as the CLI opens a data dir
    assert [t.state for t in reader.tasks(ids[0])] == ["running", "running"]
    assert reader.allocs("web")[0][0].state == "running" and jobs.get("web") is not None
    agent.node.state.finished(ids[0], "main", 0, 0, False)
    agent.node.state.alloc_update(ids[0], state="stopped")
    agent.jobs.mark_stopped("web")
    assert [t.state for t in reader.tasks(ids[0])][-1] == "complete"
    assert reader.alloc_by_id(ids[0])[0].state == "stopped"  # type: ignore[index]
    assert reader.allocs("web")[0][0].state == "stopped"
    assert jobs.get("web").stop  # type: ignore[union-attr]
