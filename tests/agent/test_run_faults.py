"""Faults under `driversdk run`: a driver plugin that dies while its task runs, a run killed inside
StartTask. Real CLI, real docker engine, real plugin processes; each test ends in a leak check."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from drivers.docker.container import LABEL_TASK_ID
from driversdk.client import reattach
from driversdk.errors import DriverSDKError
from driversdk.plugin.reattach import ReattachConfig
from tests.agent.runs import (
    NO_RESTARTS,
    ROOT,
    cli,
    db_rows,
    leaks,
    ours,
    plugin_pid,
    start_run,
    wait_for,
    write_job,
)


@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_a_plugin_killed_mid_run_is_relaunched_and_the_real_exit_code_recorded(
    engine: docker.DockerClient, tmp_path: Path, driver: str
) -> None:
    job, client, data = write_job(tmp_path, "echo up; sleep 4; exit 7", driver=driver, restart=NO_RESTARTS)
    proc = start_run(job, client)
    try:
        pid = int(str(wait_for(f"the {driver} plugin", lambda: plugin_pid(data, driver))))
        wait_for("the task to run", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'"))
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    assert f"driver plugin '{driver}' exited; relaunching it and recovering the task" in out, out
    assert f'==> task "work" recovered ({driver}' in out
    assert '==> task "work" finished with exit code 7' in out, out
    assert "Traceback" not in out + err
    status = subprocess.run(cli("status", "--data-dir", str(data)), capture_output=True, text=True, cwd=ROOT)
    assert "failed exit=7" in status.stdout, status.stdout
    assert leaks(engine, tmp_path) == []


def _plugin_knows(data: Path, task_id: str) -> bool:
    """Whether the run's docker plugin (reattached from state.db, never killed here) answers
    InspectTask for the task."""
    [(saved,)] = db_rows(data, "SELECT reattach FROM run_plugins WHERE driver='docker'")
    try:
        reattach(ReattachConfig.from_json(str(saved)), name="docker").inspect_task(task_id)
    except DriverSDKError:
        return False
    return True


def _freeze_once_the_plugin_knows_the_task(proc: subprocess.Popen[bytes], data: Path) -> None:
    """Stop the run (SIGSTOP) while its row says 'starting', then wait for its live plugin to finish
    the StartTask it was sent, so the kill that follows always finds the task known to the plugin.
    The row is written just before the call: frozen before sending it, the run is let go and
    caught again."""
    [(task_id,)] = db_rows(data, "SELECT task_id FROM run_tasks")
    for _ in range(200):
        os.kill(proc.pid, signal.SIGSTOP)
        assert db_rows(data, "SELECT state FROM run_tasks") == [("starting",)], "StartTask returned before the freeze"
        try:
            wait_for("the plugin to know the task", lambda: _plugin_knows(data, str(task_id)), timeout=5)
            return
        except AssertionError:
            os.kill(proc.pid, signal.SIGCONT)  # frozen before the call left: let it go out
            time.sleep(0.002)
    raise AssertionError("the run was never frozen with its StartTask call under way")


def _kill_during_start(
    job: Path,
    client: Path,
    data: Path,
    whole_group: bool,
    made: Callable[[], object] | None = None,
    known_to_plugin: bool = False,
) -> str:
    """SIGKILL the run while its StartTask call is under way (the 'starting' row is written just
    before the call); with ``whole_group`` its plugin dies with it; with ``known_to_plugin`` the
    live plugin has finished that StartTask (the run frozen meanwhile, so it could not record it).
    Returns the plugin's socket dir."""
    proc = subprocess.Popen(
        cli("run", str(job), "--client", str(client)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        wait_for(
            "StartTask to begin",
            lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='starting'"),
            every=0.002,
        )
        if made is not None:  # wait until the plugin has made something of the task
            wait_for("the driver to create the task", made, every=0.002)
        if known_to_plugin:
            _freeze_once_the_plugin_knows_the_task(proc, data)
        [(saved,)] = db_rows(data, "SELECT reattach FROM run_plugins")
        socket_dir = os.path.dirname(ReattachConfig.from_json(str(saved)).address)
        if whole_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert db_rows(data, "SELECT state FROM run_tasks") == [("starting",)], "the kill came after StartTask returned"
    return socket_dir


def _run_again_and_count(engine: docker.DockerClient, job: Path, client: Path, data: Path) -> str:
    proc = start_run(job, client)
    try:
        assert proc.stdout is not None
        seen = [""]
        while '==> task "work" started' not in seen[-1]:
            seen.append(proc.stdout.readline())
            assert seen[-1], "the run ended before starting the task: " + proc.communicate()[1]
        time.sleep(1.0)  # a second start, if there were one, would have created its container by now
        running = [c for c in engine.containers.list(filters={"label": LABEL_TASK_ID}) if c.name in ours(engine, data)]
        assert len(running) == 1, [c.name for c in running]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in out + err
    return "".join(seen) + out


@pytest.mark.usefixtures("kill_orphans_if_failed")
def test_run_killed_inside_start_task_replaces_what_the_live_plugin_started(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    job, client, data = write_job(tmp_path, "echo up; sleep 300")
    _kill_during_start(job, client, data, whole_group=False, known_to_plugin=True)
    out = _run_again_and_count(engine, job, client, data)
    assert "recovering alloc" in out
    assert '==> task "work" was being started when the previous run was killed; replacing it' in out
    assert leaks(engine, tmp_path) == []


@pytest.mark.usefixtures("kill_orphans_if_failed")
def test_run_and_plugin_killed_inside_start_task_adopt_the_container(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    job, client, data = write_job(tmp_path, "echo up; sleep 300")
    socket_dir = _kill_during_start(job, client, data, whole_group=True)
    assert os.path.isdir(socket_dir), "a plugin killed with its run cannot remove its own socket dir"
    out = _run_again_and_count(engine, job, client, data)
    assert "recovering alloc" in out
    assert "replacing it" not in out  # the new plugin did not know it: docker adopted the container by its id
    assert leaks(engine, tmp_path) == []
    assert not os.path.exists(socket_dir), "the run that found the plugin dead removes its socket dir"


def _exec_task_processes(tmp_path: Path) -> list[str]:
    """The running exec tasks (runc containers, run under the state dir's one shared supervisor) whose
    bundle is under this test's state dir."""
    # `runc list` fails when another test's container goes while it reads: the next listing works.
    for _ in range(5):
        listed = subprocess.run(["runc", "list", "-f", "json"], capture_output=True, text=True)
        if listed.returncode == 0:
            break
    under = str(tmp_path / "exec-state") + "/"
    containers = json.loads(listed.stdout or "null") or []
    return [c["id"] for c in containers if c["status"] == "running" and str(c.get("bundle", "")).startswith(under)]


@pytest.mark.usefixtures("kill_orphans_if_failed")
def test_exec_run_and_plugin_killed_inside_start_task_leave_one_task(tmp_path: Path) -> None:
    job, client, data = write_job(tmp_path, "echo up; sleep 300", driver="exec")
    socket_dir = _kill_during_start(
        job, client, data, whole_group=True, made=lambda: list((tmp_path / "exec-state" / "tasks").glob("*.json"))
    )
    proc = start_run(job, client)
    try:
        assert proc.stdout is not None
        seen = [""]
        while '==> task "work" started' not in seen[-1]:
            seen.append(proc.stdout.readline())
            assert seen[-1], "the run ended before starting the task: " + proc.communicate()[1]
        time.sleep(1.0)
        records = list((tmp_path / "exec-state" / "tasks").glob("*.json"))
        assert len(records) == 1, records
        assert len(_exec_task_processes(tmp_path)) == 1, _exec_task_processes(tmp_path)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in out + err
    assert leaks(None, tmp_path) == []
    assert not os.path.exists(socket_dir), "the run that found the plugin dead removes its socket dir"
