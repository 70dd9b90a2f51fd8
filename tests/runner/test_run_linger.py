"""`driversdk run` keeps its bundled plugins for the next run of the data dir
(driversdk.runner.linger): real runs through the CLI, real docker and exec plugin processes, the
state.db they record in, and a Docker engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from driversdk.plugin.host import ReattachConfig, pid_alive
from driversdk.runner import linger, runwire
from driversdk.runner.linger import ENV_LINGER
from driversdk.runner.parsecache import ENV_CACHE_DIR
from driversdk.runner.runstate import RunState
from tests.hostcheck import gone_within, processes
from tests.runner.test_run_faults import ROOT, cli, db_rows, leaks, wait_for, write_job

pytestmark = [pytest.mark.docker, pytest.mark.root]

# Polled as liveness checks, never measured: a plugin kept for LINGER that nobody uses is gone
# well within PATIENCE.
LINGER = "1s"
PATIENCE = 30.0


def run(job: Path, client: Path, linger: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli("run", str(job), "--client", str(client)),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, ENV_LINGER: linger},
        timeout=240,
    )


def kept(data: Path, driver: str) -> list[ReattachConfig]:
    rows = db_rows(data, f"SELECT reattach FROM idle_plugins WHERE driver='{driver}'")
    return [ReattachConfig.from_json(str(r[0])) for r in rows]


def plugin_processes(driver: str) -> set[int]:
    module = f"drivers.{driver}"
    return {int(p.split(":")[0]) for p in processes(module) if p.split(": ", 1)[1].split()[-1] == module}


def stop_kept(data: Path) -> None:
    """Teardown: what `driversdk stop-kept` stops, for the test's data dir."""
    if (data / "state.db").exists():
        state = RunState(str(data))
        try:
            linger.stop_kept(state)
        finally:
            state.close()


@pytest.fixture(autouse=True)
def own_cache_dir(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A run that keeps its plugins also starts a run server (driversdk.runner.runserver) in the
    cache dir: one of the test's own, whose servers are stopped with it."""
    cache = short_dir / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv(ENV_CACHE_DIR, str(cache))
    yield
    runwire.stop_servers(str(cache))
    for pid in [int(p.split(":")[0]) for p in processes(f"driversdk.runner.runserver {cache}/")]:
        assert gone_within(pid, PATIENCE), "a run server did not stop when told to"


@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_the_next_run_of_the_data_dir_takes_the_plugin_the_last_one_kept(
    engine: docker.DockerClient, tmp_path: Path, driver: str
) -> None:
    job, client, data = write_job(tmp_path, "echo ran-$NOMAD_ALLOC_ID", driver)
    try:
        first = run(job, client, "5m")
        assert first.returncode == 0, first.stdout + first.stderr
        [plugin] = kept(data, driver)
        assert pid_alive(plugin.pid), "the kept plugin is not running"
        assert os.path.exists(plugin.address)
        assert db_rows(data, f"SELECT * FROM run_plugins WHERE driver='{driver}'") == []

        before = plugin_processes(driver)
        second = run(job, client, "5m")
        assert second.returncode == 0, second.stdout + second.stderr
        # The same process ran the second run's task: no plugin was launched for it.
        assert [k.pid for k in kept(data, driver)] == [plugin.pid]
        assert plugin_processes(driver) == before
        logs = sorted(data.glob("allocs/*/alloc/logs/work.stdout.0"))
        assert len(logs) == 2 and all("ran-" in p.read_text() for p in logs)

        # A run that keeps nothing (linger 0) launches its own and leaves the kept one alone.
        third = run(job, client, "0")
        assert third.returncode == 0, third.stdout + third.stderr
        assert [k.pid for k in kept(data, driver)] == [plugin.pid] and pid_alive(plugin.pid)
    finally:
        stop_kept(data)
    assert leaks(engine, tmp_path) == []


def test_a_kept_plugin_is_not_used_under_another_plugin_config_and_is_stopped(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    """It would run the tasks under the config it was given; nothing will ever take it."""
    job, client, data = write_job(tmp_path, "echo hi")
    try:
        assert run(job, client, "5m").returncode == 0
        [old] = kept(data, "docker")
        socket_dir = os.path.dirname(old.address)
        client.write_text(client.read_text().replace("image = false", "image = true"))
        changed = run(job, client, "5m")
        assert changed.returncode == 0, changed.stdout + changed.stderr
        assert gone_within(old.pid, PATIENCE), "the plugin kept under the old config is still running"
        assert not os.path.exists(socket_dir)
        [new] = kept(data, "docker")
        assert new.pid != old.pid
    finally:
        stop_kept(data)
    assert leaks(engine, tmp_path) == []


def test_a_kept_plugin_is_not_used_once_the_code_changed(engine: docker.DockerClient, tmp_path: Path) -> None:
    """After an upgrade, or an edit of a checkout, the next run must run the new code: the kept
    plugin (old code in memory) is stopped, not taken."""
    job, client, data = write_job(tmp_path, "echo hi")
    source = ROOT / "drivers" / "docker" / "driver.py"
    before = source.stat()
    try:
        assert run(job, client, "5m").returncode == 0
        [old] = kept(data, "docker")
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))  # as an edit would
        changed = run(job, client, "5m")
        assert changed.returncode == 0, changed.stdout + changed.stderr
        assert gone_within(old.pid, PATIENCE), "the plugin running the old code is still running"
        [new] = kept(data, "docker")
        assert new.pid != old.pid
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
        stop_kept(data)
    assert leaks(engine, tmp_path) == []


def test_a_kept_plugin_nobody_takes_stops_by_itself_and_the_next_run_starts_afresh(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    job, client, data = write_job(tmp_path, "echo hi")
    try:
        assert run(job, client, LINGER).returncode == 0
        [old] = kept(data, "docker")
        assert gone_within(old.pid, PATIENCE), f"a plugin kept for {LINGER} was still running after {PATIENCE}s"
        assert not os.path.exists(os.path.dirname(old.address)), "it left its socket dir"
        again = run(job, client, "5m")
        assert again.returncode == 0, again.stdout + again.stderr
        [new] = kept(data, "docker")  # the stale record is gone; the fresh plugin is kept
        assert new.pid != old.pid and pid_alive(new.pid)
    finally:
        stop_kept(data)
    assert leaks(engine, tmp_path) == []


def test_a_plugin_of_the_operators_own_is_never_kept(engine: docker.DockerClient, tmp_path: Path) -> None:
    """It may not know the idle exit, and would then run forever: shut down as before."""
    job, client, data = write_job(tmp_path, "echo hi")
    own = [sys.executable, "-X", "utf8", "-m", "drivers.docker"]  # the same code, not the bundled command
    client.write_text(
        client.read_text().replace('plugin "docker" {\n', f'plugin "docker" {{\n  command = {json.dumps(own)}\n')
    )
    before = plugin_processes("docker")
    result = run(job, client, "5m")
    assert result.returncode == 0, result.stdout + result.stderr
    assert kept(data, "docker") == []
    assert not {int(p.split(":")[0]) for p in processes("-X utf8 -m drivers.docker")}
    assert plugin_processes("docker") <= before
    assert leaks(engine, tmp_path) == []


def test_a_linger_that_is_no_duration_is_refused_before_anything_starts(tmp_path: Path) -> None:
    job, client, data = write_job(tmp_path, "echo hi")
    result = run(job, client, "a while")
    assert result.returncode != 0
    assert f"{ENV_LINGER} 'a while' is not a duration" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (data / "allocs").exists()


def test_the_kept_plugin_record_says_what_it_was_kept_with(tmp_path: Path) -> None:
    """state.db holds only the command and config's digest, never the config itself (it may
    carry credentials, e.g. a docker auth block)."""
    job, client, data = write_job(tmp_path, "echo hi")
    try:
        assert run(job, client, "5m").returncode == 0
        [(fingerprint, reattach_json)] = db_rows(data, "SELECT fingerprint, reattach FROM idle_plugins")
        assert len(str(fingerprint)) == 64 and "gc" not in str(fingerprint)
        assert set(json.loads(str(reattach_json))) >= {"pid", "address"}
    finally:
        stop_kept(data)


def pipes_of(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("pipe:"):
            found.add(target)
    return found


def holders(pipe: str) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if pipe in pipes_of(int(entry)):
                    found.add(int(entry))
            except (FileNotFoundError, PermissionError, ProcessLookupError):
                continue
    return found


def test_the_run_that_takes_a_kept_plugin_reads_its_log_lines(engine: docker.DockerClient, tmp_path: Path) -> None:
    """The kept plugin's stderr was the pipe of the run that launched it: once that run is gone,
    the plugin's lines (warnings of a container it could not remove, of an engine that does not
    answer) would go nowhere. The run that takes it over reads them (driversdk.plugin.loghandover)."""
    job, client, data = write_job(tmp_path, "echo first")
    try:
        assert run(job, client, "5m").returncode == 0
        [plugin] = kept(data, "docker")
        # The launching run is gone: no other process holds a pipe of the plugin's any more.
        mine = pipes_of(plugin.pid)
        assert mine and all(holders(pipe) == {plugin.pid} for pipe in mine)

        job.write_text(job.read_text().replace("echo first", "sleep 300"))
        proc = subprocess.Popen(
            cli("run", str(job), "--client", str(client)), cwd=ROOT, env={**os.environ, ENV_LINGER: "5m"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for("the task to start", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'"))
            [run_pid] = [int(str(r[0])) for r in db_rows(data, "SELECT run_pid FROM run_allocs WHERE state='running'")]
            assert kept(data, "docker") == [], "the second run took the kept plugin"
            shared = pipes_of(plugin.pid) & pipes_of(run_pid)
            assert shared, "the run that uses the plugin holds the other end of its log pipe"
        finally:
            # Ctrl-C, pass or fail: the run stops its task and keeps the plugin, stopped below.
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    finally:
        stop_kept(data)
    assert leaks(engine, tmp_path) == []


def test_status_lists_the_kept_plugins_and_stop_kept_stops_them_and_the_run_server(
    engine: docker.DockerClient, tmp_path: Path, short_dir: Path
) -> None:
    job, client, data = write_job(tmp_path, "echo hi")
    try:
        first = run(job, client, "5m")
        assert first.returncode == 0, first.stdout + first.stderr
        [plugin] = kept(data, "docker")
        servers = [int(p.split(":")[0]) for p in processes(f"driversdk.runner.runserver {short_dir / 'cache'}/")]
        assert servers, "the run started a run server"

        status = subprocess.run(cli("status", "--client", str(client)), capture_output=True, text=True, cwd=ROOT)
        assert status.returncode == 0, status.stderr
        assert f"kept plugin  docker   pid {plugin.pid}, idle since " in status.stdout
        assert "`driversdk stop-kept` stops them" in status.stdout

        stop = subprocess.run(cli("stop-kept", "--client", str(client)), capture_output=True, text=True, cwd=ROOT)
        assert stop.returncode == 0, stop.stderr
        assert stop.stdout.strip() == "kept plugins stopped: docker; run servers asked to stop: 1"
        assert gone_within(plugin.pid, PATIENCE) and not os.path.exists(os.path.dirname(plugin.address))
        assert all(gone_within(pid, PATIENCE) for pid in servers)
        assert kept(data, "docker") == []
        again = subprocess.run(cli("status", "--client", str(client)), capture_output=True, text=True, cwd=ROOT)
        assert "kept plugin" not in again.stdout
        nothing = subprocess.run(cli("stop-kept", "--client", str(client)), capture_output=True, text=True, cwd=ROOT)
        assert nothing.stdout.strip() == "kept plugins stopped: none; run servers asked to stop: 0"
    finally:
        stop_kept(data)
    assert leaks(engine, tmp_path) == []
