"""state.db written before schema versions existed is migrated on first start, and the tasks it
records are recovered.

Two proofs. ``fixtures/state-v0.db`` is a real state.db the previous code wrote: a docker job
(`sleep 300`, alloc e337aefd, task id e337aefd-…/work/c08c7595, docker plugin pid 7145) whose
`run` was SIGKILLed; its container and plugin are long gone, so it proves the migration of real
rows, not recovery. The end-to-end test runs the previous code itself (the commit before the
driver manager, extracted with `git archive`) to start a real container and SIGKILLs that run;
today's `run` then migrates its state.db, adopts the per-allocation plugin it left and recovers
the task without starting a second container.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import docker
import pytest

from driversdk.agent.state import SCHEMA_VERSION, StateVersionError, open_state
from driversdk.agent.state.migrations import MIGRATIONS
from driversdk.agent.state.runstate import RunState
from tests.agent.runs import ROOT, db_rows, leaks, ours, wait_for, write_job

FIXTURE = Path(__file__).parent / "fixtures" / "state-v0.db"
# The last commit whose runner launched one driver plugin per allocation and had no schema version.
PREVIOUS = "ad6c7c7416e3605135c6a50931c9c77c83fc0484"


def test_a_state_db_of_the_previous_code_is_migrated_keeping_every_row(tmp_path: Path) -> None:
    db_path = tmp_path / "data" / "state.db"
    db_path.parent.mkdir()
    shutil.copy(FIXTURE, db_path)
    before = sqlite3.connect(db_path)
    assert before.execute("PRAGMA user_version").fetchone() == (0,)
    tasks_before = before.execute("SELECT * FROM run_tasks").fetchall()
    before.close()
    db = open_state(str(db_path))
    try:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        # Migration 3 adds the restart count, 0 for every task that was run before it.
        assert db.execute("SELECT * FROM run_tasks").fetchall() == [(*row, 0) for row in tasks_before]
        assert db.execute("SELECT alloc_id, driver FROM run_plugins_retired").fetchall() == [
            ("e337aefd-d94c-456c-a3aa-0a52ab276be1", "docker")
        ]
        assert db.execute("SELECT * FROM run_plugins").fetchall() == []
    finally:
        db.close()
    state = RunState(str(db_path.parent))  # a second open finds it done
    try:
        [record] = state.tasks()
        assert (record.task, record.state, record.logmon_pid) == ("work", "running", 7217)
        assert record.task_id == "e337aefd-d94c-456c-a3aa-0a52ab276be1/work/c08c7595"
        [alloc] = state.running_allocs("legacy")
        assert alloc.alloc_id.startswith("e337aefd")
    finally:
        state.close()


def test_a_state_db_from_before_log_collector_processes_gets_the_logmon_column(tmp_path: Path) -> None:
    db_path = tmp_path / "state.db"
    old = sqlite3.connect(db_path)
    old.execute(
        "CREATE TABLE run_tasks (alloc_id TEXT NOT NULL, job TEXT NOT NULL, grp TEXT NOT NULL, task TEXT NOT NULL, "
        "driver TEXT NOT NULL, task_id TEXT NOT NULL, state TEXT NOT NULL, exit_code INTEGER, signal INTEGER, "
        "oom INTEGER, handle BLOB, alloc_dir TEXT NOT NULL, updated REAL NOT NULL, PRIMARY KEY (alloc_id, task))"
    )
    old.execute("INSERT INTO run_tasks VALUES ('a', 'j', 'g', 't', 'exec', 'id', 'complete', 0, 0, 0, NULL, '/x', 1)")
    old.commit()
    old.close()
    db = open_state(str(db_path))
    try:
        assert db.execute("SELECT task, logmon_pid FROM run_tasks").fetchall() == [("t", 0)]
    finally:
        db.close()


def test_a_state_db_that_kept_plugins_loses_that_table_and_keeps_its_driver_plugins(tmp_path: Path) -> None:
    """A state.db of the version that kept plugins between runs (schema 5) opens: the kept-plugin
    table goes (nothing reattaches to such a plugin again), every other row stays."""
    db_path = tmp_path / "state.db"
    old = sqlite3.connect(db_path, isolation_level=None)
    from driversdk.agent.state.migrations import migrate

    migrate(old, target=5)
    old.execute("INSERT INTO idle_plugins VALUES ('{\"pid\": 1}', 'docker', 'f', 1.0)")
    old.execute("INSERT INTO run_plugins VALUES ('exec', 4242, '{\"pid\": 2}')")
    old.close()
    db = open_state(str(db_path))
    try:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "idle_plugins" not in tables
        assert db.execute("SELECT driver, run_pid FROM run_plugins").fetchall() == [("exec", 4242)]
    finally:
        db.close()


def test_a_state_db_of_a_newer_version_is_refused_with_a_sentence(tmp_path: Path) -> None:
    db_path = tmp_path / "state.db"
    db = open_state(str(db_path))
    db.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(StateVersionError, match="written by a newer driversdk"):
        open_state(str(db_path))


def _previous_code(tmp_path: Path) -> Path:
    """The previous commit's tree, extracted next to the test."""
    if (
        not (ROOT / ".git").exists()
        or subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", PREVIOUS], capture_output=True).returncode
    ):
        pytest.skip(f"the previous code ({PREVIOUS[:8]}) is not in this checkout's history")
    tree = tmp_path / "previous"
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS, "driversdk", "drivers"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def test_tasks_a_killed_run_of_the_previous_code_left_are_recovered_after_the_migration(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    previous = _previous_code(tmp_path)
    job, client, data = write_job(tmp_path, "echo up; sleep 300")
    env = dict(os.environ, PYTHONPATH=str(previous))
    old = subprocess.Popen(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    new: subprocess.Popen[str] | None = None
    try:
        wait_for("the old run's task", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'"))
        [(old_plugin,)] = db_rows(data, "SELECT reattach FROM run_plugins")  # keyed per alloc, as it was
        old.kill()
        old.wait(30)
        assert db_rows(data, "PRAGMA user_version") == [(0,)]
        [container] = ours(engine, data)

        new = subprocess.Popen(
            [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert new.stdout is not None
        seen = [""]
        while '==> task "work" recovered' not in seen[-1]:
            seen.append(new.stdout.readline())
            assert seen[-1], "the new run ended early: " + "".join(seen) + new.communicate()[1]
        text = "".join(seen)
        assert "recovering alloc" in text and '==> driver "docker": reattached to its running plugin' in text
        assert '==> task "work" started' not in text
        assert ours(engine, data) == [container], "the same container, no second one"
        assert db_rows(data, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
        [(adopted,)] = db_rows(data, "SELECT reattach FROM run_plugins WHERE driver='docker'")
        assert adopted == old_plugin, "the old run's plugin became the driver's one instance"
        new.send_signal(signal.SIGINT)
        out, err = new.communicate(timeout=120)
    finally:
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert '==> task "work" finished with exit code' in out, out
    assert "Traceback" not in out + err
    assert db_rows(data, "SELECT * FROM run_plugins") + db_rows(data, "SELECT * FROM run_plugins_retired") == []
    assert leaks(engine, tmp_path) == []
