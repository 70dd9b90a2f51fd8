"""The driver manager under the real CLI: one exec plugin process for every allocation and job a
`run` process runs, reattached (not relaunched) by the next run after a SIGKILL, which recovers
every task of both jobs; and shut down with the last allocation that used it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.agent.test_run_faults import ROOT, cgroup_parent, cli, db_rows, leaks, wait_for
from tests.hostcheck import processes


def _job(tmp_path: Path, name: str, count: int) -> Path:
    job = tmp_path / f"{name}.hcl"
    job.write_text(
        f'job "{name}" {{\n  group "g" {{\n    count = {count}\n    task "t" {{\n      driver = "exec"\n'
        '      kill_timeout = "1s"\n      config {\n        command = "/bin/sh"\n'
        '        args = ["-c", "echo up; sleep 300"]\n      }\n    }\n  }\n}\n'
    )
    return job


def _client(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "data"
    client = tmp_path / "client.hcl"
    client.write_text(
        f'data_dir = "{data}"\n'
        f'plugin "exec" {{\n  config {{\n    state_dir = "{tmp_path / "exec-state"}"\n'
        f'    cgroup_parent = "{cgroup_parent(tmp_path)}"\n  }}\n}}\n'
    )
    return client, data


def exec_plugins(run_pid: int) -> list[int]:
    """Exec plugin processes launched by the run (its children running `drivers.exec.main`)."""
    found = []
    for line in processes("drivers.exec.main"):
        pid = int(line.split(":", 1)[0])
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        if ppid == run_pid or run_pid == 0:
            found.append(pid)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie no one reaped, its parent being the killed run, counts as gone)."""
    try:
        return "\tZ" not in Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].splitlines()[0]
    except (OSError, IndexError):
        return False


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


@pytest.mark.usefixtures("kill_orphans_if_failed")
def test_one_plugin_serves_two_allocations_and_two_jobs_and_a_killed_run_recovers_both(tmp_path: Path) -> None:
    client, data = _client(tmp_path)
    jobs = [str(_job(tmp_path, "first", 2)), str(_job(tmp_path, "second", 1))]
    run = cli("run", *jobs, "--client", str(client))
    proc = _start(run)
    try:
        wait_for(
            "three running tasks", lambda: len(db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'")) == 3
        )
        plugins = exec_plugins(proc.pid)
        assert len(plugins) == 1, f"one exec plugin for three allocations of two jobs, found {plugins}"
        [(saved_pid,)] = db_rows(data, "SELECT run_pid FROM run_plugins WHERE driver='exec'")
        assert saved_pid == proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert alive(plugins[0]), "the plugin outlives the killed run"

        again = _start(run)
        assert again.stdout is not None
        seen: list[str] = []
        while sum('==> task "t" recovered' in line for line in seen) < 3:
            seen.append(again.stdout.readline())
            assert seen[-1], "the second run ended early: " + "".join(seen) + again.communicate()[1]
        text = "".join(seen)
        assert text.count("recovering alloc") == 3, text
        assert text.count('==> driver "exec": reattached to its running plugin') == 1, text
        assert '==> task "t" started' not in text, "nothing is started twice"
        assert exec_plugins(again.pid) == [], "the second run launched no plugin of its own (validation's is gone)"
        assert alive(plugins[0]), "it reattached to the same plugin process"
        time.sleep(0.5)
        again.send_signal(signal.SIGINT)
        out, err = again.communicate(timeout=120)
    finally:
        for p in (proc, locals().get("again")):
            if isinstance(p, subprocess.Popen) and p.poll() is None:
                p.kill()
    assert again.returncode == 1, out + err  # interrupted
    assert "Traceback" not in out + err
    assert not alive(plugins[0]), "the plugin is shut down with the last allocation"
    assert db_rows(data, "SELECT * FROM run_plugins") == [], "the plugin's reattach config is gone with it"
    assert leaks(None, tmp_path) == []


def test_run_json_prints_one_event_object_per_line(tmp_path: Path) -> None:
    import json

    client, _ = _client(tmp_path)
    job = tmp_path / "quick.hcl"
    job.write_text(
        'job "quick" {\n  type = "batch"\n  group "g" {\n    task "t" {\n      driver = "exec"\n      config {\n'
        '        command = "/bin/true"\n      }\n    }\n  }\n}\n'
    )
    done = subprocess.run(
        cli("run", str(job), "--client", str(client), "--json"), capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert {"time", "kind", "type", "job", "group", "alloc", "task", "message"} <= set(events[0])
    finished = [e for e in events if e["kind"] == "task" and e["message"] == "finished with exit code 0"]
    assert finished and finished[0]["job"] == "quick" and finished[0]["task"] == "t" and finished[0]["alloc"]
    assert leaks(None, tmp_path) == []
