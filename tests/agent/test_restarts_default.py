"""Nomad's default restart policy of the job type applies to every task, also to one whose job
writes no ``restart`` block (service/system: 2 attempts in 30m, batch/sysbatch: 3 in 24h, both
15s apart, mode "fail"). Real runs: `driversdk run` of a raw_exec job, the bundled raw_exec
plugin as a subprocess, a counter file in the alloc dir proving how often the task ran."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.agent.runs import ROOT, cgroup_parent, cli, leaks, raw_exec_job, start_run, wait_for, write_raw_exec_client

pytestmark = pytest.mark.root

# Counts its runs in alloc/data (which outlives a restart) and fails until run {ok}.
COUNTED = (
    "n=$(cat $NOMAD_ALLOC_DIR/data/n 2>/dev/null || echo 0); n=$((n+1)); "
    "echo $n > $NOMAD_ALLOC_DIR/data/n; [ $n -ge {ok} ]"
)


def write(tmp_path: Path, job_type: str, script: str, group_extra: str = "") -> tuple[Path, Path, Path]:
    script = script.replace('"', '\\"')
    job = raw_exec_job(tmp_path / "job.hcl", "dflt", script, job_type=job_type, group=group_extra)
    client = write_raw_exec_client(tmp_path, tmp_path / "exec-state", cgroup_parent(tmp_path))
    return job, client, tmp_path / "data"


def run(job: Path, client: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli("run", str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def status(client: Path) -> str:
    return subprocess.run(cli("status", "--client", str(client)), capture_output=True, text=True, cwd=ROOT).stdout


def events(client: Path) -> list[dict[str, Any]]:
    done = subprocess.run(cli("status", "--json", "--client", str(client)), capture_output=True, text=True, cwd=ROOT)
    (row,) = [r for r in json.loads(done.stdout) if r.get("task") == "work"]
    return list(row["events"])


def runs(data: Path) -> int:
    (alloc,) = (data / "allocs").iterdir()
    return int((alloc / "alloc" / "data" / "n").read_text())


# Only the delay is written, so the run is quick; attempts, interval and mode are the defaults.
QUICK = '    restart {\n      delay = "1s"\n    }'


@pytest.mark.parametrize(("job_type", "ok"), [("batch", 99), ("service", 1)])
def test_a_job_without_a_restart_block_restarts_its_task_after_nomads_default_delay(
    tmp_path: Path, job_type: str, ok: int
) -> None:
    # A failed batch task, and a service task that exits 0 (it is meant to run forever).
    job, client, data = write(tmp_path, job_type, COUNTED.format(ok=ok))
    proc = start_run(job, client)
    try:

        def restarting() -> str:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"the run ended without restarting the task: {out}{err}")
            said = status(client)
            return said if "Restarting:" in said else ""

        said = str(wait_for("the default policy's restart", restarting, timeout=60, every=0.2))
        # 15s plus Nomad's jitter of up to a quarter: the default delay, not a written one.
        assert "restarting exit=" in said and "restarts=1  Restarting: Task restarting in 1" in said, said
        delay = said.split("Task restarting in ")[1].split("s")[0]
        assert 15.0 <= float(delay) <= 18.75, said
        (restart,) = [e for e in events(client) if e["type"] == "Restarting"]
        assert restart["details"]["restart_reason"] == "Restart within policy"
        proc.send_signal(signal.SIGINT)  # stopped while it waits out the delay: at once, cleanly
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out + err
    assert "==> interrupted" in out, out
    assert runs(data) == 1
    assert leaks(None, tmp_path) == []


def test_a_batch_task_gets_three_restarts_by_default_and_ends_successful(tmp_path: Path) -> None:
    # Fails three times, succeeds on its fourth run: the service default (2 attempts) would fail it.
    job, client, data = write(tmp_path, "batch", COUNTED.format(ok=4), group_extra=QUICK)
    done = run(job, client)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert out.count('==> task "work" Terminated: Exit Code: 1') == 3, out
    assert out.count('==> task "work" Restarting: Task restarting in 1') == 3, out  # 1s plus jitter
    assert '==> task "work" Terminated: Exit Code: 0' in out, out
    assert '==> task "work" finished with exit code 0' in out, out
    assert runs(data) == 4
    said = events(client)
    assert [e["details"]["restart_reason"] for e in said if e["type"] == "Restarting"] == ["Restart within policy"] * 3
    assert "complete exit=0 restarts=3" in status(client)
    assert leaks(None, tmp_path) == []


def test_a_service_task_gets_two_restarts_by_default_then_fails(tmp_path: Path) -> None:
    job, client, data = write(tmp_path, "service", COUNTED.format(ok=99), group_extra=QUICK)
    done = run(job, client)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert out.count('==> task "work" Restarting: Task restarting in 1') == 2, out
    assert '==> task "work" Not Restarting: Exceeded allowed attempts 2 in interval 30m0s and mode is "fail"' in out
    assert '==> task "work" finished with exit code 1' in out, out
    assert runs(data) == 3
    (last,) = [e for e in events(client) if e["type"] == "Not Restarting"]
    assert last["details"]["restart_reason"] == 'Exceeded allowed attempts 2 in interval 30m0s and mode is "fail"'
    assert "failed exit=1 restarts=2" in status(client)
    assert leaks(None, tmp_path) == []
