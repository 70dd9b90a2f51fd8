"""The agent's listeners and ACLs, played as an attacker plays them: over TCP a missing or wrong
token gets 403 "Permission denied" and changes nothing; the bootstrap token is accepted as
``X-Nomad-Token`` and as ``Authorization: Bearer``; the unix socket needs no token (its mode is
its ACL); a TCP listener without ACLs is refused at start unless it is loopback and the operator
says so."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.agentproc import ROOT, AgentProcess, free_port, http_call, write_config

BUSYBOX = "driversdk-test/busybox:local"
JOB = {
    "Job": {
        "ID": "acl-job",
        "Name": "acl-job",
        "Type": "service",
        "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [{
            "Name": "t", "Driver": "docker",
            "Config": {"image": BUSYBOX, "command": "sh", "args": ["-c", "exec sleep 300"]},
            "Resources": {"CPU": 100, "MemoryMB": 64},
        }]}],
    }
}  # fmt: skip


@pytest.fixture
def acl_agent(agent_dir: Path) -> Iterator[tuple[AgentProcess, int]]:
    port = free_port()
    process = AgentProcess(agent_dir / "data", config=write_config(agent_dir, port, acl=True)).start()
    try:
        yield process, port
    finally:
        process.close()


def test_missing_and_wrong_tokens_get_403_and_change_nothing(acl_agent: tuple[AgentProcess, int]) -> None:
    process, port = acl_agent
    # Before the bootstrap there is no token at all: still refused.
    assert http_call(port, "GET", "/v1/jobs") == (403, "Permission denied")
    status, token = http_call(port, "POST", "/v1/acl/bootstrap")
    assert status == 200 and token["Type"] == "management"
    secret = token["SecretID"]
    assert http_call(port, "POST", "/v1/acl/bootstrap") == (400, "ACL bootstrap already done")
    wrong = {"X-Nomad-Token": "00000000-0000-0000-0000-000000000000"}
    for headers in ({}, wrong, {"X-Nomad-Token": ""}, {"Authorization": "Bearer nope"},
                    {"X-Nomad-Token": secret[:-1]}, {"Authorization": secret}):  # fmt: skip
        assert http_call(port, "PUT", "/v1/jobs", JOB, headers) == (403, "Permission denied")
        assert http_call(port, "POST", "/v1/jobs/parse", {"JobHCL": 'job "x" {}'}, headers) == (
            403,
            "Permission denied",
        )
        assert http_call(port, "GET", "/v1/agent/self", None, headers) == (403, "Permission denied")
    assert http_call(port, "GET", "/v1/jobs", None, {"X-Nomad-Token": secret}) == (200, [])
    assert process.client().get("/v1/jobs") == []  # the socket agrees: nothing was registered
    status, _ = http_call(port, "PUT", "/v1/jobs", JOB, {"X-Nomad-Token": secret})
    assert status == 200
    process.wait_allocs("acl-job", "running")
    # Neither a stop nor a purge without the token reaches the job.
    for headers in ({}, wrong):
        assert http_call(port, "DELETE", "/v1/job/acl-job?purge=true", None, headers) == (403, "Permission denied")
    status, job = http_call(port, "GET", "/v1/job/acl-job", None, {"Authorization": f"Bearer {secret}"})
    assert status == 200 and job["Stop"] is False
    assert [a["ClientStatus"] for a in process.client().get("/v1/job/acl-job/allocations")] == ["running"]


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="runs a probe as nobody")
def test_unix_socket_needs_no_token_and_is_owner_only(acl_agent: tuple[AgentProcess, int]) -> None:
    process, port = acl_agent
    info = os.lstat(process.socket)
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    assert process.client().get("/v1/jobs") == []
    assert process.client().get("/v1/agent/self")["config"]["ACL"]["Enabled"] is True
    assert http_call(port, "GET", "/v1/jobs")[0] == 403
    # Another local user cannot reach the socket at all (the socket is 0600, its data dir 0700).
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
             "except PermissionError:\n    sys.exit(3)\nsys.exit(0)\n")  # fmt: skip
    # The system Python: the test's own may live where that user cannot read (/root).
    other = subprocess.run(["/usr/bin/python3", "-I", "-c", probe, str(process.socket)], user=65534, group=65534,
                           extra_groups=[], timeout=60, cwd="/")  # fmt: skip
    assert other.returncode == 3


def _start(agent_dir: Path, config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "driversdk.cli", "agent", "-config", str(config), *extra]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_tcp_without_acl_off_loopback_is_refused(agent_dir: Path, host: str) -> None:
    port = free_port()
    done = _start(agent_dir, write_config(agent_dir, port, acl=False, host=host), "-allow-unauthenticated-loopback")
    assert done.returncode == 1, done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "without ACLs" in line and "acl { enabled = true }" in line and "Traceback" not in done.stderr
    assert not (agent_dir / "data" / "agent.sock").exists()
    assert not (agent_dir / "data" / "state.db").exists()


def test_tcp_without_acl_on_loopback_needs_the_flag(agent_dir: Path) -> None:
    port = free_port()
    config = write_config(agent_dir, port, acl=False)
    done = _start(agent_dir, config)
    assert done.returncode == 1, done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "-allow-unauthenticated-loopback" in line and "Traceback" not in done.stderr
    process = AgentProcess(agent_dir / "data", config=config, extra_args=["-allow-unauthenticated-loopback"]).start()
    try:
        assert http_call(port, "GET", "/v1/jobs") == (200, [])
        assert http_call(port, "POST", "/v1/acl/bootstrap") == (400, "ACL support disabled")
    finally:
        process.close()


def test_a_malformed_request_is_answered_not_logged_as_a_traceback(acl_agent: tuple[AgentProcess, int]) -> None:
    process, port = acl_agent
    for length in ("abc", "-5"):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(f"PUT /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{}}".encode())
            data = b""
            while chunk := conn.recv(65536):  # the agent closes the connection after answering
                data += chunk
            answer = data.decode(errors="replace")
        assert answer.startswith("HTTP/1.1 400 "), answer
        assert answer.endswith("Content-Length must be a number of bytes"), answer
    assert "Traceback" not in process.log()
    assert process.client().get("/v1/jobs") == []
