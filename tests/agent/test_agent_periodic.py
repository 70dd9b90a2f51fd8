"""Periodic jobs through a real agent: children launched on schedule by the dispatcher, through
the real docker plugin, never two at once with prohibit_overlap, none after the parent is
stopped, and one at once on a forced launch."""

from __future__ import annotations

import time
from datetime import datetime

from tests.agent.agentproc import AgentProcess, api_job


def _children(agent: AgentProcess, parent: str) -> list[str]:
    return sorted(j["ID"] for j in agent.client().get("/v1/jobs") if j["ID"].startswith(f"{parent}-periodic-"))


def _interval(agent: AgentProcess, job: str) -> tuple[datetime, datetime]:
    [alloc] = agent.wait_allocs(job, "complete", "failed")
    state = agent.client().get(f"/v1/allocation/{alloc['ID']}")["TaskStates"]["t"]
    parse = lambda text: datetime.fromisoformat(text[:26].rstrip("Z"))  # noqa: E731 - nanoseconds cut to micro
    return parse(state["StartedAt"]), parse(state["FinishedAt"])


def test_children_are_launched_on_schedule_without_overlap(agent: AgentProcess) -> None:
    client = agent.client()
    job = api_job("tick", "batch", "sleep 3")
    job["Periodic"] = {"Specs": ["*/2 * * * * * *"], "ProhibitOverlap": True, "TimeZone": "UTC"}
    client.request("PUT", "/v1/jobs", body={"Job": job})
    parent = client.get("/v1/job/tick")
    assert parent["Status"] == "running" and parent["Periodic"]["Specs"] == ["*/2 * * * * * *"]
    assert client.get("/v1/job/tick/allocations") == []  # the parent runs nothing itself
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_children(agent, "tick")) < 2:
        time.sleep(0.2)
    children = _children(agent, "tick")
    assert len(children) >= 2, agent.log()
    launched = [int(c.rsplit("-", 1)[1]) for c in children]
    assert all(t % 2 == 0 for t in launched)  # at the schedule's seconds, not whenever
    client.request("DELETE", "/v1/job/tick")
    first, second = (_interval(agent, c) for c in children[:2])
    assert second[0] >= first[1], (first, second)  # prohibit_overlap: the second began after the first ended
    assert "skipped" in agent.log() and "prohibit_overlap" in agent.log()
    before = _children(agent, "tick")
    time.sleep(4.5)
    assert _children(agent, "tick") == before  # a stopped parent launches nothing more


def test_a_forced_launch_runs_at_once(agent: AgentProcess) -> None:
    client = agent.client()
    job = api_job("nightly", "batch", "echo ran")
    job["Periodic"] = {"Specs": ["0 3 * * *"]}
    client.request("PUT", "/v1/jobs", body={"Job": job})
    assert _children(agent, "nightly") == []
    answer, _ = client.request("POST", "/v1/job/nightly/periodic/force")
    assert answer["EvalID"]
    [child] = _children(agent, "nightly")
    [alloc] = agent.wait_allocs(child, "complete", "failed")
    assert alloc["ClientStatus"] == "complete"
    assert client.get(f"/v1/job/{child}")["ParentID"] == "nightly"


def test_a_bad_schedule_is_refused_with_a_sentence(agent: AgentProcess) -> None:
    from driversdk.cli.apiclient import APIRequestError

    job = api_job("bad", "batch", "true")
    job["Periodic"] = {"Specs": ["0 0 L * *"]}
    try:
        agent.client().request("PUT", "/v1/jobs", body={"Job": job})
    except APIRequestError as err:
        assert err.status == 400 and "(L, W, #) is not supported" in str(err)
    else:
        raise AssertionError("a schedule with L was registered")
    assert agent.client().get("/v1/jobs") == []
