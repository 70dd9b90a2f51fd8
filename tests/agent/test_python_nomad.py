"""python-nomad (PyPI), a client not written here, drives a real agent over TCP with ACLs as its
users configure it (host, port, token): it parses a job's HCL, registers it, lists its
allocations, reads its task's logs and stops it, with the docker and the exec driver. It is the
proof that the agent's paths, shapes and codes are Nomad's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.agentproc import AgentProcess, free_port

nomad = pytest.importorskip("nomad")
exceptions = pytest.importorskip("nomad.api.exceptions")

BUSYBOX = "driversdk-test/busybox:local"


def acl_agent(agent_dir: Path) -> tuple[AgentProcess, int]:
    port = free_port()
    data = agent_dir / "data"
    config = agent_dir / "agent.hcl"
    config.write_text(f'data_dir = "{data}"\nbind_addr = "127.0.0.1"\nports {{\n  http = {port}\n}}\n'
                      "acl {\n  enabled = true\n}\n")  # fmt: skip
    return AgentProcess(data, config=config).start(), port


@pytest.fixture
def tcp_agent(agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AgentProcess, int]]:
    # python-nomad prefers these to its arguments: the tests configure it only through arguments.
    for name in ("NOMAD_ADDR", "NOMAD_TOKEN", "NOMAD_NAMESPACE", "NOMAD_REGION"):
        monkeypatch.delenv(name, raising=False)
    process, port = acl_agent(agent_dir)
    try:
        yield process, port
    finally:
        process.close()  # over the socket, which needs no token


def bootstrap(port: int) -> str:
    anonymous = nomad.Nomad(host="127.0.0.1", port=port, timeout=30)
    token = anonymous.acl.generate_bootstrap()
    assert token["Type"] == "management" and token["Name"] == "Bootstrap Token" and len(token["SecretID"]) == 36
    with pytest.raises(exceptions.BadRequestNomadException) as err:
        anonymous.acl.generate_bootstrap()
    assert err.value.nomad_resp.status_code == 400 and err.value.nomad_resp.text == "ACL bootstrap already done"
    return str(token["SecretID"])


DOCKER_JOB = f"""
job "pn-docker" {{
  type = "batch"
  group "g" {{
    task "t" {{
      driver = "docker"
      config {{
        image   = "{BUSYBOX}"
        command = "sh"
        args    = ["-c", "echo hello from docker; echo to stderr >&2"]
      }}
      resources {{
        cpu    = 100
        memory = 64
      }}
      restart {{
        attempts = 0
        mode     = "fail"
      }}
    }}
  }}
}}
"""

EXEC_JOB = """
job "pn-exec" {
  type = "service"
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo hello from exec; exec sleep 300"]
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
"""


def wait_allocs(client: Any, job_id: str, *statuses: str, timeout: float = 90.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    allocs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        allocs = client.job.get_allocations(job_id)
        if allocs and all(a["ClientStatus"] in statuses for a in allocs):
            return allocs
        time.sleep(0.2)
    raise AssertionError(f"allocations of {job_id} never reached {statuses}: {allocs}")


def test_python_nomad_runs_a_docker_job(tcp_agent: tuple[AgentProcess, int]) -> None:
    process, port = tcp_agent
    token = bootstrap(port)
    client = nomad.Nomad(host="127.0.0.1", port=port, token=token, timeout=60)
    parsed = client.jobs.parse(DOCKER_JOB)
    assert parsed["ID"] == "pn-docker" and parsed["Type"] == "batch"
    answer = client.jobs.register_job({"Job": parsed})
    assert answer["EvalID"] and answer["JobModifyIndex"] >= 1
    assert "pn-docker" in client.jobs and client.jobs["pn-docker"]["Status"] in ("pending", "running", "dead")
    [alloc] = wait_allocs(client, "pn-docker", "complete", "failed")
    assert alloc["ClientStatus"] == "complete", process.log()
    assert alloc["TaskStates"]["t"]["State"] == "dead"
    full = client.allocation.get_allocation(alloc["ID"])
    assert full["Job"]["ID"] == "pn-docker" and full["TaskStates"]["t"]["Failed"] is False
    plain = client.client.stream_logs.stream(alloc["ID"], "t", "stdout", plain=True)
    assert plain == "hello from docker\n"
    framed = client.client.stream_logs.stream(alloc["ID"], "t", "stderr")
    assert '"File": "alloc/logs/t.stderr"' in framed or '"File":"alloc/logs/t.stderr"' in framed
    assert client.client.cat.read_file(alloc["ID"], path="alloc/logs/t.stdout.0") == "hello from docker\n"
    listing = client.client.ls.list_files(alloc["ID"], path="alloc/logs")
    assert "t.stdout.0" in [f["Name"] for f in listing] and all(not f["IsDir"] for f in listing)
    stopped = client.job.deregister_job("pn-docker", purge=True)
    assert stopped["EvalID"]
    # The agent forgets a purged job once its allocations are torn down (Nomad: at once).
    deadline = time.monotonic() + 60
    while "pn-docker" in client.jobs and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "pn-docker" not in client.jobs


def test_python_nomad_runs_and_stops_an_exec_job(tcp_agent: tuple[AgentProcess, int]) -> None:
    process, port = tcp_agent
    token = bootstrap(port)
    client = nomad.Nomad(address=f"http://127.0.0.1:{port}", token=token, timeout=60)
    client.jobs.register_job({"Job": client.jobs.parse(EXEC_JOB)})
    [alloc] = wait_allocs(client, "pn-exec", "running")
    deadline = time.monotonic() + 30
    while client.client.stream_logs.stream(alloc["ID"], "t", "stdout", plain=True) != "hello from exec\n":
        assert time.monotonic() < deadline, process.log()
        time.sleep(0.1)
    client.job.deregister_job("pn-exec")
    [alloc] = wait_allocs(client, "pn-exec", "complete", "failed")
    assert alloc["ClientStatus"] == "complete"
    assert client.job.get_job("pn-exec")["Stop"] is True
    client.job.deregister_job("pn-exec", purge=True)
    with pytest.raises(exceptions.URLNotFoundNomadException):
        client.job.get_job("pn-exec")


def test_python_nomad_without_a_token_is_refused(tcp_agent: tuple[AgentProcess, int]) -> None:
    _, port = tcp_agent
    bootstrap(port)
    anonymous = nomad.Nomad(host="127.0.0.1", port=port, timeout=30)
    with pytest.raises(exceptions.URLNotAuthorizedNomadException):
        anonymous.jobs.get_jobs()
    with pytest.raises(exceptions.URLNotAuthorizedNomadException):
        anonymous.jobs.parse(EXEC_JOB)


PLANTER = f"""
job "planter" {{
  type = "batch"
  group "g" {{
    task "t" {{
      driver = "docker"
      config {{
        image   = "{BUSYBOX}"
        command = "sh"
        args    = ["-c", "ln -s /etc/shadow /alloc/shadow; ln -s / /alloc/root; echo secret > /secrets/s"]
      }}
      restart {{
        attempts = 0
        mode     = "fail"
      }}
    }}
  }}
}}
"""


def test_fs_endpoints_never_leave_the_allocation_directory(tcp_agent: tuple[AgentProcess, int]) -> None:
    """A task plants symlinks to host files in its shared alloc dir; reading them through the API
    reads nothing of the host, nor ``..``, nor the task's secrets."""
    _, port = tcp_agent
    client = nomad.Nomad(host="127.0.0.1", port=port, token=bootstrap(port), timeout=60)
    client.jobs.register_job({"Job": client.jobs.parse(PLANTER)})
    [alloc] = wait_allocs(client, "planter", "complete", "failed")
    assert alloc["ClientStatus"] == "complete"
    names = {f["Name"]: f for f in client.client.ls.list_files(alloc["ID"], path="alloc")}
    assert names["shadow"]["FileMode"].startswith("l") and names["root"]["FileMode"].startswith("l")
    for path in ("alloc/shadow", "alloc/root/etc/shadow", "../../../../etc/shadow", "alloc/../../../etc/passwd"):
        with pytest.raises(exceptions.BadRequestNomadException) as err:
            client.client.cat.read_file(alloc["ID"], path=path)
        assert "root:" not in err.value.nomad_resp.text and "\n" not in err.value.nomad_resp.text
    with pytest.raises(exceptions.BadRequestNomadException):
        client.client.ls.list_files(alloc["ID"], path="alloc/root")
    with pytest.raises(exceptions.URLNotAuthorizedNomadException) as denied:
        client.client.cat.read_file(alloc["ID"], path="t/secrets/s")
    assert denied.value.nomad_resp.text == "Reading secret file prohibited"
    client.job.deregister_job("planter", purge=True)
