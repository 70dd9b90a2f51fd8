"""Nomad's event stream from a real agent: a job's registration and its allocation's task
events arrive as newline-delimited JSON, filtered by topic, and a stream resumes after an index."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from tests.agent.agentproc import AgentProcess, api_job


def _read_until(
    agent: AgentProcess, done: Callable[[list[dict[str, Any]]], bool], **query: str
) -> list[dict[str, Any]]:
    """Frames of the stream (heartbeats left out) until ``done`` says enough, read in a thread
    that the test waits on for at most a minute."""
    frames: list[dict[str, Any]] = []
    finished = threading.Event()

    def read() -> None:
        buffer = b""
        try:
            for chunk in agent.client().stream("/v1/event/stream", **query):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    frame = json.loads(line)
                    if frame:
                        frames.append(frame)
                if done(frames):
                    return
        finally:
            finished.set()

    threading.Thread(target=read, daemon=True).start()
    finished.wait(60)  # what came by then: the test's assertions say what was missing
    return frames


def _events(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for f in frames for e in f["Events"]]


def test_job_and_allocation_events_arrive_in_order(agent: AgentProcess) -> None:
    def seen(frames: list[dict[str, Any]]) -> bool:
        events = _events(frames)
        return any(e["Type"] == "JobRegistered" for e in events) and any(
            e["Topic"] == "Allocation" and "Terminated" in json.dumps(e["Payload"]) for e in events
        )

    result: list[list[dict[str, Any]]] = []
    thread = threading.Thread(target=lambda: result.append(_read_until(agent, seen)))
    thread.start()
    agent.client().request("PUT", "/v1/jobs", body={"Job": api_job("streamed", "batch", "echo hi")})
    thread.join(90)
    events = _events(result[0])
    types = [(e["Topic"], e["Type"]) for e in events]
    assert ("Job", "JobRegistered") in types and ("Allocation", "AllocationUpdated") in types, types
    job = next(e for e in events if e["Type"] == "JobRegistered")
    assert job["Key"] == "streamed" and job["Payload"]["Job"]["ID"] == "streamed" and job["Namespace"] == "default"
    indexes = [e["Index"] for e in events]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes)
    alloc = next(e for e in events if e["Topic"] == "Allocation")
    assert alloc["Payload"]["Allocation"]["JobID"] == "streamed"
    # Resumed after the registration: only what came later, and only the topic asked for.
    later = _read_until(agent, lambda frames: bool(frames), index=str(job["Index"]), topic="Allocation")
    assert later and all(e["Topic"] == "Allocation" and e["Index"] > job["Index"] for e in _events(later))


def test_a_topic_filter_leaves_other_topics_out(agent: AgentProcess) -> None:
    result: list[list[dict[str, Any]]] = []
    thread = threading.Thread(
        target=lambda: result.append(
            _read_until(agent, lambda fr: any(e["Type"] == "JobDeregistered" for e in _events(fr)), topic="Job")
        )
    )
    thread.start()
    client = agent.client()
    client.request("PUT", "/v1/jobs", body={"Job": api_job("quiet", "batch", "true")})
    agent.wait_allocs("quiet", "complete", "failed")
    client.request("DELETE", "/v1/job/quiet")
    thread.join(90)
    events = _events(result[0])
    assert [e["Type"] for e in events] == ["JobRegistered", "JobDeregistered"]
