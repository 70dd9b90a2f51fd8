"""The agent lives on while an operator changes the host's mounts: a job refused because its host
volume was not on a shared mount is accepted once the operator has done what the sentence said,
without restarting the agent (the mount table is read for each job, not once per process)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.cli.apiclient import APIRequestError
from tests.agent.agentproc import AgentProcess, api_job


@pytest.fixture
def shared_dir(agent_dir: Path) -> Iterator[Path]:
    path = agent_dir / "shared"
    path.mkdir()
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_fixed_mount_is_seen_by_the_running_agent(agent_dir: Path, shared_dir: Path) -> None:
    config = agent_dir / "agent.hcl"
    config.write_text(f'client {{\n  host_volume "shared" {{\n    path = "{shared_dir}"\n  }}\n}}\n')
    agent = AgentProcess(agent_dir / "data", config=config).start()
    try:
        job = api_job("web", "service", "exec sleep 300")
        group = job["TaskGroups"][0]  # type: ignore[index]
        group["Volumes"] = {"shared": {"Name": "shared", "Type": "host", "Source": "shared"}}
        group["Tasks"][0]["VolumeMounts"] = [
            {"Volume": "shared", "Destination": "/srv", "PropagationMode": "host-to-task"}
        ]
        client = agent.client()
        with pytest.raises(APIRequestError) as err:
            client.request("PUT", "/v1/jobs", body={"Job": job})
        assert err.value.status == 400 and "make that path a shared mount" in str(err.value)
        assert client.get("/v1/jobs") == []
        subprocess.run(["mount", "--bind", str(shared_dir), str(shared_dir)], check=True)
        subprocess.run(["mount", "--make-shared", str(shared_dir)], check=True)
        client.request("PUT", "/v1/jobs", body={"Job": job})
        agent.wait_allocs("web", "running")
    finally:
        agent.close()
