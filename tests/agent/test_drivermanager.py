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

from tests.agent.driverplugins import alive, exec_client, exec_plugins, read_until_recovered, sleeping_exec_job, start
from tests.agent.runs import cli, db_rows, leaks, run_cli, wait_for


@pytest.mark.usefixtures("kill_orphans_if_failed")
def test_one_plugin_serves_two_allocations_and_two_jobs_and_a_killed_run_recovers_both(tmp_path: Path) -> None:
    client, data = exec_client(tmp_path)
    jobs = [str(sleeping_exec_job(tmp_path, "first", 2)), str(sleeping_exec_job(tmp_path, "second", 1))]
    run = cli("run", *jobs, "--client", str(client))
    proc = start(run)
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

        again = start(run)
        text = read_until_recovered(again, 3)
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

    client, _ = exec_client(tmp_path)
    job = tmp_path / "quick.hcl"
    job.write_text(
        'job "quick" {\n  type = "batch"\n  group "g" {\n    task "t" {\n      driver = "exec"\n      config {\n'
        '        command = "/bin/true"\n      }\n    }\n  }\n}\n'
    )
    done = run_cli("run", str(job), "--client", str(client), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert {"time", "kind", "type", "job", "group", "alloc", "task", "message"} <= set(events[0])
    finished = [e for e in events if e["kind"] == "task" and e["message"] == "finished with exit code 0"]
    assert finished and finished[0]["job"] == "quick" and finished[0]["task"] == "t" and finished[0]["alloc"]
    assert leaks(None, tmp_path) == []
