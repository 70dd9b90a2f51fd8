"""The agent's HTTP API over its unix socket, driven as a client drives it: a job registered as
Nomad's API JSON runs through the real docker plugin, its allocation shows Nomad's task states and
events, its logs are read back, and a stop ends it as a stop (never as a failure)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from driversdk.cli.apiclient import APIRequestError
from tests.agent.agentproc import AgentProcess, api_job

BUSYBOX = "driversdk-test/busybox:local"


def test_socket_is_private(agent: AgentProcess) -> None:
    info = os.lstat(agent.socket)
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600


def test_batch_job_runs_and_reports_like_nomad(agent: AgentProcess) -> None:
    client = agent.client()
    answer, _ = client.request("PUT", "/v1/jobs", body={"Job": api_job("hello", "batch", "echo hi there")})
    assert answer["EvalID"] and answer["JobModifyIndex"] >= 1
    [alloc] = agent.wait_allocs("hello", "complete", "failed")
    assert alloc["ClientStatus"] == "complete" and alloc["JobID"] == "hello" and alloc["TaskGroup"] == "g"
    full = client.get(f"/v1/allocation/{alloc['ID']}")
    state = full["TaskStates"]["t"]
    assert state["State"] == "dead" and state["Failed"] is False
    types = [e["Type"] for e in state["Events"]]
    assert "Started" in types and "Terminated" in types
    terminated = next(e for e in state["Events"] if e["Type"] == "Terminated")
    assert terminated["ExitCode"] == 0 and isinstance(terminated["Time"], int)
    raw = b"".join(client.stream(f"/v1/client/fs/logs/{alloc['ID'][:8]}", task="t", type="stdout", plain="true"))
    assert raw == b"hi there\n"
    [frame] = [json.loads(line) for line in b"".join(client.stream(f"/v1/client/fs/logs/{alloc['ID']}", task="t",
                                                                   type="stdout")).splitlines()]  # fmt: skip
    assert frame["Data"] == "aGkgdGhlcmUK" and frame["File"] == "alloc/logs/t.stdout"
    [stub] = client.get("/v1/jobs")
    assert stub["ID"] == "hello" and stub["Status"] == "dead"
    assert stub["JobSummary"]["Summary"]["g"]["Complete"] == 1


def test_stop_is_a_stop_not_a_failure(agent: AgentProcess) -> None:
    client = agent.client()
    client.request("PUT", "/v1/jobs", body={"Job": api_job("svc", "service", "echo up; exec sleep 300")})
    [alloc] = agent.wait_allocs("svc", "running")
    client.request("DELETE", "/v1/job/svc")
    [alloc] = agent.wait_allocs("svc", "complete", "failed")
    assert alloc["ClientStatus"] == "complete", alloc
    state = client.get(f"/v1/allocation/{alloc['ID']}")["TaskStates"]["t"]
    assert state["State"] == "dead" and state["Failed"] is False
    assert "Killing" in [e["Type"] for e in state["Events"]] or "Killed" in [e["Type"] for e in state["Events"]]
    job = client.get("/v1/job/svc")
    assert job["Stop"] is True and job["Status"] == "dead"


def test_bad_requests_get_nomads_codes_and_leave_nothing(agent: AgentProcess) -> None:
    client = agent.client()
    bad = api_job("bad", "batch", "true")
    bad["TaskGroups"][0]["Tasks"][0]["Config"] = {"imagex": BUSYBOX}  # type: ignore[index]
    with pytest.raises(APIRequestError) as err:
        client.request("PUT", "/v1/jobs", body={"Job": bad})
    assert err.value.status == 400 and 'did you mean "image"' in str(err.value) and "\n" not in str(err.value)
    assert client.get("/v1/jobs") == []
    with pytest.raises(APIRequestError) as err:
        client.request("GET", "/v1/job/nope")
    assert err.value.status == 404 and str(err.value) == "job not found"
    with pytest.raises(APIRequestError) as err:
        client.request("PUT", "/v1/jobs", body={"Job": {"Name": "x"}})
    assert err.value.status == 400 and str(err.value) == "Job ID hasn't been provided"
    with pytest.raises(APIRequestError) as err:
        client.request("PATCH", "/v1/jobs")
    assert err.value.status == 405
    with pytest.raises(APIRequestError) as err:
        client.request("PUT", "/v1/jobs", body={"Job": dict(api_job("../../etc", "batch", "true"), ID="../../etc")})
    assert err.value.status == 400
    assert client.get("/v1/jobs") == []
    assert json.loads(json.dumps(client.get("/v1/nodes")))[0]["Drivers"]["docker"]["Healthy"] is True


def test_second_agent_on_the_data_dir_is_refused(agent: AgentProcess) -> None:
    second = subprocess.run([sys.executable, "-m", "driversdk.cli", "agent", "-data-dir", str(agent.data_dir)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert second.returncode == 1
    assert f"another driversdk agent (pid {agent.proc.pid}) already uses the data dir" in second.stderr  # type: ignore[union-attr]
    assert "Traceback" not in second.stderr
    assert agent.client().get("/v1/agent/self")["config"]["DataDir"] == str(agent.data_dir)


def test_followed_logs_start_at_the_offset_asked_for(agent: AgentProcess) -> None:
    client = agent.client()
    client.request("PUT", "/v1/jobs", body={"Job": api_job("tail", "batch", "echo one; echo two; sleep 3; echo three")})
    [alloc] = agent.wait_allocs("tail", "running", "complete")
    path = f"/v1/client/fs/logs/{alloc['ID']}"
    for _ in range(100):
        if b"two" in b"".join(client.stream(path, task="t", type="stdout", plain="true")):
            break
        time.sleep(0.05)
    from_end = b"".join(client.stream(path, task="t", type="stdout", plain="true", follow="true", origin="end",
                                      offset="4"))  # fmt: skip
    assert from_end == b"two\nthree\n"
    from_start = b"".join(client.stream(path, task="t", type="stdout", plain="true", follow="true", offset="4"))
    assert from_start == b"two\nthree\n"


def test_a_purged_job_takes_its_allocations_with_it(agent: AgentProcess) -> None:
    client = agent.client()
    client.request("PUT", "/v1/jobs", body={"Job": api_job("gone", "batch", "echo first")})
    [first] = agent.wait_allocs("gone", "complete", "failed")
    client.request("DELETE", "/v1/job/gone", {"purge": "true"})
    for _ in range(200):
        if not any(a["JobID"] == "gone" for a in client.get("/v1/allocations")):
            break
        time.sleep(0.05)
    assert not any(a["JobID"] == "gone" for a in client.get("/v1/allocations"))
    assert not (agent.data_dir / "allocs" / first["ID"]).exists()
    client.request("PUT", "/v1/jobs", body={"Job": api_job("gone", "batch", "echo second")})
    [second] = agent.wait_allocs("gone", "complete", "failed")  # only the new job's allocation is listed
    assert second["ID"] != first["ID"]
