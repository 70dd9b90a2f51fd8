"""`driversdk run` of a docker task while the Docker engine stops and starts again (a private
dockerd, never the shared one): the run reports the task's end with a sentence, prints no
traceback, and leaves no container behind."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.agent.runs import IMAGE, ROOT
from tests.docker.private_engine import PrivateEngine, checked_private_engine


@pytest.fixture
def private(engine: docker.DockerClient) -> Iterator[PrivateEngine]:
    yield from checked_private_engine([IMAGE])


def test_engine_restart_under_driversdk_run_is_a_sentence_and_leaves_nothing(
    private: PrivateEngine, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    job = tmp_path / "job.hcl"
    job.write_text(
        f"""job "engine" {{
  group "g" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    task "web" {{
      driver = "docker"
      kill_timeout = "1s"
      config {{
        image   = "{IMAGE}"
        command = "/bin/sh"
        args    = ["-c", "echo started; trap 'exit 3' TERM; while true; do sleep 0.2; done"]
      }}
    }}
  }}
}}
"""
    )
    client = tmp_path / "client.hcl"
    client.write_text(
        f'data_dir = "{data}"\n'
        f'plugin "docker" {{\n  config {{\n    endpoint = "{private.endpoint}"\n'
        "    gc {\n      image = false\n    }\n  }\n}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        seen = [""]
        while '==> task "web" started' not in seen[-1]:
            seen.append(proc.stdout.readline())
            assert seen[-1], "the run ended before starting the task: " + proc.communicate()[1]
        private.stop()
        # The task ends with the engine; its teardown finds the engine down and keeps trying
        # (DestroyTask's failure is recoverable) until the engine is back, then removes it.
        while "destroy failed for now, trying again" not in seen[-1]:
            seen.append(proc.stdout.readline())
            assert seen[-1], "the run ended without retrying the destroy: " + "".join(seen) + proc.communicate()[1]
        private.start()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "".join(seen) + out
    assert proc.returncode == 1, out + err
    assert "the Docker engine stopped while the task ran" in out, out
    assert "Traceback" not in out + err
    assert private.client().containers.list(all=True) == [], out + err
