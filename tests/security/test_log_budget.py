"""A job may not set itself a log budget larger than the disk it asked for: Nomad refuses
``max_files * max_file_size`` (MB) not below the group's ``ephemeral_disk { size }`` (300 MB when
unset), so ``logs { max_files = 100000 max_file_size = 100000 }`` cannot fill the data dir's disk."""

from __future__ import annotations

import os
from pathlib import Path

import docker
import pytest

from tests.agent.csienv import Env, make_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs real exec tasks: root only")


def job_file(env: Env, name: str, logs: str, disk: str = "") -> Path:
    job = env.work / f"{name}.hcl"
    job.write_text(
        f'job "{name}" {{\n  type = "batch"\n  group "g" {{\n{disk}\n    task "t" {{\n      driver = "exec"\n'
        f'      config {{\n        command = "/bin/busybox"\n        args = ["true"]\n      }}\n{logs}\n    }}\n'
        "  }\n}\n"
    )
    return job


@pytest.fixture
def env(engine: docker.DockerClient, short_dir: Path) -> Env:
    return make_env(engine, short_dir)


def test_a_log_budget_beyond_the_default_disk_is_refused_at_validate_and_leaves_nothing(env: Env) -> None:
    job = job_file(env, "fill", "      logs {\n        max_files = 100000\n        max_file_size = 100000\n      }")
    sentence = (
        'group "g", task "t": logs: log storage (10000000000 MB: max_files 100000 x max_file_size '
        "100000 MB) must be less than the group's ephemeral_disk size (300 MB); lower logs.max_files or "
        "logs.max_file_size, or raise ephemeral_disk.size"
    )
    checked = env.cli("validate", str(job), "--client", str(env.client))
    assert checked.returncode == 1 and sentence in checked.stdout, checked.stdout + checked.stderr
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 2, done.stdout + done.stderr
    assert sentence in done.stdout + done.stderr and "Traceback" not in done.stdout + done.stderr
    assert not (env.data / "allocs").exists()
    env.assert_clean()


def test_the_budget_counts_against_the_groups_own_ephemeral_disk(env: Env) -> None:
    logs = "      logs {\n        max_files = 5\n        max_file_size = 100\n      }"
    small = job_file(env, "small", logs, "    ephemeral_disk {\n      size = 500\n    }")
    checked = env.cli("validate", str(small), "--client", str(env.client))
    assert checked.returncode == 1
    assert "log storage (500 MB: max_files 5 x max_file_size 100 MB) must be less than the group's ephemeral_disk " in (
        checked.stdout
    )
    fits = job_file(env, "fits", logs, "    ephemeral_disk {\n      size = 501\n    }")
    done = env.cli("run", str(fits), "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    env.assert_clean()


def test_an_ephemeral_disk_below_nomads_minimum_is_refused(env: Env) -> None:
    job = job_file(env, "tiny", "", "    ephemeral_disk {\n      size = 5\n    }")
    checked = env.cli("validate", str(job), "--client", str(env.client))
    assert checked.returncode == 1
    assert 'group "g": ephemeral_disk: minimum size is 10 MB; got 5' in checked.stdout, checked.stdout
