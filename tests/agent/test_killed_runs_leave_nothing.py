"""A run that takes over what killed runs left ends all of it when it is done: no plugin, log
collector or task supervisor of a killed run outlives the run that recovered its allocations.

Real runs through the CLI, SIGKILLed; real exec plugins, task supervisors and log collectors,
looked for in /proc afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.agent.driverplugins import alive, exec_client, exec_plugins, read_until_recovered, sleeping_exec_job, start
from tests.agent.runs import cli, db_rows, leaks, run_cli, wait_for
from tests.hostcheck import processes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="exec tasks run under runc: root only")


@pytest.mark.usefixtures("kill_orphans_if_failed")
def test_a_run_recovering_two_killed_runs_ends_both_of_their_plugins(tmp_path: Path) -> None:
    client, data = exec_client(tmp_path)
    jobs = [sleeping_exec_job(tmp_path, "first", 1), sleeping_exec_job(tmp_path, "second", 1)]
    killed = [start(cli("run", str(job), "--client", str(client))) for job in jobs]
    recovering: subprocess.Popen[str] | None = None
    try:
        wait_for("both tasks running", lambda: len(db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'")) == 2)
        plugins = [pid for run in killed for pid in exec_plugins(run.pid)]
        assert len(plugins) == 2, f"each run launched its own exec plugin: {plugins}"
        for run in killed:
            os.kill(run.pid, signal.SIGKILL)
            run.wait(30)
        assert all(alive(pid) for pid in plugins), "the plugins outlive their killed runs"

        recovering = start(cli("run", *map(str, jobs), "--client", str(client)))
        text = read_until_recovered(recovering, 2)
        assert text.count('==> driver "exec": reattached to its running plugin') == 1, text
        recovering.send_signal(signal.SIGINT)
        out, err = recovering.communicate(timeout=120)
    finally:
        for run in [*killed, recovering]:
            if run is not None and run.poll() is None:
                run.kill()
    assert recovering.returncode == 1, out + err  # interrupted
    assert [pid for pid in plugins if alive(pid)] == [], "the plugin it did not reattach to is ended too"
    assert db_rows(data, "SELECT * FROM run_plugins") == [], "no plugin of a killed run stays recorded"
    assert leaks(None, tmp_path) == []


@pytest.mark.usefixtures("kill_orphans_if_failed")
@pytest.mark.parametrize("planted", ["file", "symlink"])
def test_a_recovered_allocation_whose_setup_fails_ends_what_the_killed_run_left(tmp_path: Path, planted: str) -> None:
    client, data = exec_client(tmp_path)
    job = sleeping_exec_job(tmp_path, "first", 1)
    killed = start(cli("run", str(job), "--client", str(client)))
    try:
        wait_for("the task running", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'"))
        [(alloc_dir,)] = db_rows(data, "SELECT alloc_dir FROM run_allocs")
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(30)
    finally:
        if killed.poll() is None:
            killed.kill()
    # The data dir's one collector (its control socket names the data dir) serves the task on.
    assert processes(str(data / "logmon.sock")), "the killed run's log collector runs on"
    # The task (which sees the alloc dir) swapped alloc/tmp for a file, or for a symlink to a host
    # dir: the allocation's setup fails with a sentence when the next run recovers it, before its
    # task is followed again, and nothing is done through the link.
    tmp = Path(alloc_dir) / "alloc" / "tmp"
    tmp.rmdir()
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir(mode=0o700)
    if planted == "file":
        tmp.write_text("not a dir")
    else:
        tmp.symlink_to(host_dir)

    done = run_cli("run", str(job), "--client", str(client))
    assert done.returncode != 0, done.stdout + done.stderr
    assert "recovering alloc" in done.stdout, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "unexpectedly" not in out and "Traceback" not in out, out
    assert ("is not a directory" if planted == "file" else "passes through a symlink") in out, out
    assert host_dir.stat().st_mode & 0o7777 == 0o700 and list(host_dir.iterdir()) == []
    assert db_rows(data, "SELECT state FROM run_allocs") == [("failed",)], done.stdout + done.stderr
    assert db_rows(data, "SELECT state FROM run_tasks WHERE state IN ('running', 'restarting')") == [], (
        done.stdout + done.stderr
    )
    assert leaks(None, tmp_path) == [], "the task, its supervisor and its collector end with their allocation"
