"""A real ``driversdk agent`` process for tests: started as an operator starts it, talked to over
its socket with the CLI's own client, and stopped so that nothing of it is left (its jobs stopped
and purged first: a stopped agent leaves tasks running on purpose)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driversdk.cli.apiclient import AgentClient
from tests.agent.runs import IMAGE, ROOT


@dataclass
class AgentProcess:
    data_dir: Path
    config: Path | None = None
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def socket(self) -> Path:
        return self.data_dir / "agent.sock"

    @property
    def address(self) -> str:
        return f"unix://{self.socket}"

    def client(self, token: str = "") -> AgentClient:
        return AgentClient(self.address, token)

    def start(self, timeout: float = 60.0) -> AgentProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-agent.log"
        args = [sys.executable, "-m", "driversdk.cli", "agent", "-data-dir", str(self.data_dir), *self.extra_args]
        if self.config is not None:
            args += ["-config", str(self.config)]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the process writes to it for its life
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env})  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {self.proc.returncode}: {self.log()}")
            if self.socket.exists():
                try:
                    self.client().get("/v1/agent/self")
                    return self
                except Exception:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"the agent did not answer within {timeout}s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def submit(self, hcl: str) -> None:
        """Register a job given as HCL: parsed by the agent's /v1/jobs/parse, then PUT to /v1/jobs."""
        client = self.client()
        job = client.request("POST", "/v1/jobs/parse", body={"JobHCL": hcl})[0]
        client.request("PUT", "/v1/jobs", body={"Job": job})

    def wait_allocs(self, job: str, *statuses: str, timeout: float = 90.0) -> list[dict[str, Any]]:
        """The job's allocations once each has one of ``statuses`` (ClientStatus)."""
        deadline = time.monotonic() + timeout
        index = 0
        allocs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            allocs, index = self.client().request("GET", f"/v1/job/{job}/allocations",
                                                  {"index": index, "wait": "2s"})  # fmt: skip
            if allocs and all(a["ClientStatus"] in statuses for a in allocs):
                return allocs
        raise AssertionError(f"allocations of {job} never reached {statuses}: {allocs}\n{self.log()}")

    def stop_jobs(self) -> None:
        """Stop and purge every job, and wait until their allocations are over."""
        client = self.client()
        jobs = client.get("/v1/jobs") or []
        for job in jobs:
            client.request("DELETE", f"/v1/job/{job['ID']}", {"purge": "true"})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and client.get("/v1/jobs"):
            time.sleep(0.1)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        """SIGTERM, as an operator stops it: the tasks stay (see stop_jobs), the plugins go."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def close(self) -> None:
        """Stop every job, then the agent: nothing of the test is left."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop_jobs()
            finally:
                self.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now, for an agent's HTTP listener."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_call(
    port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One request to an agent's HTTP listener on 127.0.0.1:``port``: its status and JSON body (or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode()


def write_config(agent_dir: Path, port: int, *, acl: bool, host: str = "127.0.0.1") -> Path:
    """The agent's config file in ``agent_dir``: its data dir there, an HTTP listener on ``host:port``,
    the ACL system enabled when ``acl``."""
    config = agent_dir / "agent.hcl"
    text = f'data_dir = "{agent_dir / "data"}"\nbind_addr = "{host}"\nports {{\n  http = {port}\n}}\n'
    if acl:
        text += "acl {\n  enabled = true\n}\n"
    config.write_text(text)
    return config


def api_job(job_id: str, job_type: str, script: str) -> dict[str, object]:
    """A job as Nomad's API JSON: one group "g" of one docker task "t" running ``script`` in sh."""
    return {
        "ID": job_id,
        "Name": job_id,
        "Type": job_type,
        "TaskGroups": [
            {
                "Name": "g",
                "Count": 1,
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "docker",
                        "Config": {"image": IMAGE, "command": "sh", "args": ["-c", script]},
                        "Resources": {"CPU": 100, "MemoryMB": 64},
                    }
                ],
            }
        ],
    }
