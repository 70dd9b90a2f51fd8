"""`driversdk run` through the run server (driversdk.runner.runclient / runserver): real command
lines, the real server process forking real runs, a Docker engine. Each test has a cache dir of
its own (the server's socket lives there) and stops what it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from driversdk.runner import runwire
from driversdk.runner.linger import ENV_LINGER
from driversdk.runner.parsecache import ENV_CACHE_DIR
from driversdk.runner.runserver import ENV_LOG
from tests.hostcheck import gone_within, listener_of_another_user, processes
from tests.runner.test_run_faults import ROOT, cli, db_rows, leaks, wait_for, write_job
from tests.runner.test_run_linger import stop_kept

pytestmark = [pytest.mark.docker, pytest.mark.root]

PATIENCE = 60.0  # polled as a liveness check, never measured


@pytest.fixture
def cache(short_dir: Path) -> Iterator[Path]:
    """A private cache dir of the test's own (short: the socket path must fit 107 bytes)."""
    path = short_dir / "cache"
    path.mkdir(mode=0o700)
    yield path
    stop_servers(path)


def stop_servers(cache: Path) -> None:
    """Ask the test's run servers to stop, and see them go."""
    runwire.stop_servers(str(cache))
    for pid in servers(cache):
        assert gone_within(pid, PATIENCE), "a run server did not stop when told to"


def servers(cache: Path) -> list[int]:
    return [int(p.split(":")[0]) for p in processes(f"driversdk.runner.runserver {cache}/")]


def environment(cache: Path, linger: str = "30s", **extra: str) -> dict[str, str]:
    log = str(cache.parent / "server.log")  # why a run was not served, for a failing test to show
    return {**os.environ, ENV_LINGER: linger, ENV_CACHE_DIR: str(cache), ENV_LOG: log, **extra}


def run(job: Path, client: Path, env: dict[str, str], cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess[str], int]:
    """The command line as a user types it; (its result, its pid)."""
    proc = subprocess.Popen(
        cli("run", str(job), "--client", str(client)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=cwd, env=env,
    )  # fmt: skip
    out, err = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def server_ready(cache: Path) -> Path:
    try:
        return Path(str(wait_for("the run server's socket", lambda: next(cache.glob("run-*.sock"), None), PATIENCE)))
    except AssertionError:
        log = cache.parent / "server.log"
        said = log.read_text() if log.exists() else "(none)"
        raise AssertionError(f"no run server listens in {sorted(os.listdir(cache))}; its log: {said}") from None


def warm_up(tmp_path: Path, env: dict[str, str], command: list[str] | None = None, cwd: Path = ROOT) -> Path:
    """A first run (of a trivial job of its own) from the same context, which starts the server;
    returns its data dir (for stop_kept)."""
    where = tmp_path / "warm"
    where.mkdir()
    job, client, data = write_job(where, "true")
    line = command or cli("run", "{job}", "--client", "{client}")
    done = subprocess.run([a.format(job=job, client=client) for a in line], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return data


def run_pids(data: Path) -> list[int]:
    return [int(str(r[0])) for r in db_rows(data, "SELECT run_pid FROM run_allocs ORDER BY updated")]


def without_ids(text: str) -> list[str]:
    """Output lines with the allocation and container ids taken out (they differ per run), in
    order (a task's event lines and its runner's lines come from two threads)."""
    import re

    return sorted(re.sub(r"\b[0-9a-f]{8,64}\b", "<id>", line) for line in text.splitlines())


def test_the_next_run_is_served_by_the_server_the_first_one_started(
    engine: docker.DockerClient, tmp_path: Path, cache: Path
) -> None:
    job, client, data = write_job(tmp_path, "echo served")
    env = environment(cache)
    try:
        first, first_pid = run(job, client, env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert run_pids(data) == [first_pid], "the first run happens in its own process"
        socket_path = server_ready(cache)
        assert oct(socket_path.stat().st_mode & 0o777) == oct(0o600)
        second, second_pid = run(job, client, env)
        assert second.returncode == 0, second.stdout + second.stderr
        [_, served_by] = run_pids(data)
        assert served_by != second_pid, "the second run was not handed to the server"
        assert without_ids(second.stdout) == without_ids(first.stdout)
        assert second.stderr == first.stderr == ""
        logs = sorted(data.glob("allocs/*/alloc/logs/work.stdout.0"))
        assert [p.read_text() for p in logs] == ["served\n", "served\n"]
    finally:
        stop_kept(data)
    assert leaks(engine, tmp_path) == []


def test_a_failed_task_and_a_refused_job_end_as_a_local_run_ends(
    engine: docker.DockerClient, tmp_path: Path, cache: Path
) -> None:
    job, client, data = write_job(tmp_path, "exit 3")
    bad = tmp_path / "bad.hcl"
    bad.write_text('job "bad" {\n  group "g" {\n    task "t" {\n      driver = "nosuch"\n    }\n  }\n}\n')
    try:
        local_failed, _ = run(job, client, environment(cache, "0"))
        local_refused, _ = run(bad, client, environment(cache, "0"))
        run(job, client, environment(cache))  # starts the server
        server_ready(cache)
        served_failed, failed_pid = run(job, client, environment(cache))
        served_refused, refused_pid = run(bad, client, environment(cache))
        assert run_pids(data)[-1] != failed_pid, "not served"
        assert served_failed.returncode == local_failed.returncode == 1
        assert without_ids(served_failed.stdout) == without_ids(local_failed.stdout)
        assert served_refused.returncode == local_refused.returncode == 2
        assert served_refused.stdout == local_refused.stdout and 'driver "nosuch"' in served_refused.stdout
        assert served_refused.stderr == local_refused.stderr
        assert refused_pid > 0
    finally:
        stop_kept(data)
    assert leaks(engine, tmp_path) == []


def test_the_run_takes_the_clients_cwd_env_umask_streams_and_ctrl_c(
    engine: docker.DockerClient, tmp_path: Path, cache: Path
) -> None:
    job, client, data = write_job(tmp_path, "sleep 300")
    # From the job's own dir, with relative paths and a umask of its own, as a user would type it.
    line = ["sh", "-c", 'umask 027; exec "$0" -m driversdk.cli run "$1" --client "$2"', sys.executable]
    env = environment(cache, PYTHONPATH=str(ROOT))
    warm = warm_up(tmp_path, env, [*line, "{job}", "{client}"], cwd=tmp_path)
    try:
        server_ready(cache)
        proc = subprocess.Popen(
            [*line, job.name, client.name], cwd=tmp_path, env={**env, "DSX_MARK": "from-the-client"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for("the task to start", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'"))
            [run_pid] = run_pids(data)
            assert run_pid != proc.pid, "not served"
            # What the run starts gets the client's environment (/proc/<run>/environ shows the one
            # the server was started with: the copy sets its own later): its log collector.
            [collector] = [int(p.split(":")[0]) for p in processes(str(data)) if "logcollector" in p]
            environ = Path(f"/proc/{collector}/environ").read_bytes().split(b"\0")
            assert b"DSX_MARK=from-the-client" in environ
            assert os.readlink(f"/proc/{run_pid}/cwd") == str(tmp_path)
            status = Path(f"/proc/{run_pid}/status").read_text()
            assert "Umask:\t0027" in status
            for fd in (1, 2):
                assert os.readlink(f"/proc/{run_pid}/fd/{fd}") == os.readlink(f"/proc/{proc.pid}/fd/{fd}")
            for ns in ("mnt", "net", "pid", "cgroup"):
                assert os.readlink(f"/proc/{run_pid}/ns/{ns}") == os.readlink(f"/proc/{proc.pid}/ns/{ns}")
            proc.send_signal(signal.SIGINT)  # Ctrl-C, as the terminal sends it to the client
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert "interrupted: stopping tasks" in out
        assert proc.returncode != 0
        assert gone_within(run_pid, PATIENCE)
    finally:
        stop_kept(data)
        stop_kept(warm)
        stop_servers(cache)  # its command line names tmp_path (the module search path the client had)
    assert leaks(engine, tmp_path) == []


def test_a_killed_client_takes_its_run_with_it_and_the_next_run_recovers_the_task(
    engine: docker.DockerClient, tmp_path: Path, cache: Path
) -> None:
    """As with a `driversdk run` process killed outright: the run dies, the task and the plugin stay
    for the next run to take over."""
    job, client, data = write_job(tmp_path, "sleep 4; echo finished")
    warm = warm_up(tmp_path, environment(cache))
    try:
        server_ready(cache)
        proc = subprocess.Popen(
            cli("run", str(job), "--client", str(client)), cwd=ROOT, env=environment(cache),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for("the task to start", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'"))
        [run_pid] = run_pids(data)
        assert run_pid != proc.pid
        proc.kill()
        proc.wait()
        assert gone_within(run_pid, PATIENCE), "the run outlived its killed client"
        again, _ = run(job, client, environment(cache))
        assert again.returncode == 0, again.stdout + again.stderr
        assert "finished" in next(data.glob("allocs/*/alloc/logs/work.stdout.0")).read_text()
    finally:
        stop_kept(data)
        stop_kept(warm)
    assert leaks(engine, tmp_path) == []


def test_the_server_stops_by_itself_after_the_linger(engine: docker.DockerClient, tmp_path: Path, cache: Path) -> None:
    """Kept for 1s, it may come up and go again while the run that started it still runs: what it
    did is read from its log, and then nothing of it may be left."""
    job, client, data = write_job(tmp_path, "true")
    log = cache.parent / "server.log"
    try:
        assert run(job, client, environment(cache, "1s"))[0].returncode == 0
        wait_for("the run server to stop", lambda: log.exists() and "stopping: no run for 1s" in log.read_text())
        assert "serving " in log.read_text()
        assert not list(cache.glob("run-*.sock")), "the server left its socket"
        for pid in servers(cache):
            assert gone_within(pid, PATIENCE)
    finally:
        stop_kept(data)


def test_a_connection_of_another_user_is_never_served(tmp_path: Path, cache: Path) -> None:
    """Defence in depth: the cache dir is the user's alone, so another user cannot even reach the
    socket; opened up here, the server still refuses a peer whose uid is not its own."""
    job, client, data = write_job(tmp_path, "true")
    assert run(job, client, environment(cache, "30s"))[0].returncode == 0  # starts the server
    socket_path = server_ready(cache)
    os.chmod(cache.parent, 0o711)
    os.chmod(cache, 0o711)
    os.chmod(socket_path, 0o666)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the attacker: nobody, asking the server to run a command line
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(20)
            sock.connect(str(socket_path))
            request = {"protocol": runwire.PROTOCOL, "key": socket_path.name, "argv0": "x", "argv": ["--version"],
                       "env": {}, "umask": 0}  # fmt: skip
            try:
                runwire.send(sock, request, [0, 1, 2, os.open("/", os.O_PATH)])
                reply, _ = runwire.receive(sock)
            except (BrokenPipeError, ConnectionResetError):
                reply = None  # closed before the request was even read
            # Closed unanswered: refused for who it is (a request from the right user with a wrong
            # key would have been answered {"local": ...}).
            os.write(write, b"closed" if reply is None else f"answered {reply}".encode())
        except BaseException as err:  # reported to the parent
            os.write(write, f"error {err}".encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    said = os.read(read, 200)
    os.close(read)
    os.chmod(cache, 0o700)
    os.chmod(cache.parent, 0o700)
    stop_kept(data)
    assert said == b"closed"
    assert servers(cache), "the server died of the attempt"


def test_a_run_in_another_network_namespace_is_not_served_by_this_server(
    engine: docker.DockerClient, tmp_path: Path, cache: Path
) -> None:
    """The copy would run in the server's namespaces, not the command's: another context, another
    socket, so the run happens in the command's own process."""
    job, client, data = write_job(tmp_path, "true")
    try:
        assert run(job, client, environment(cache))[0].returncode == 0
        server_ready(cache)
        elsewhere = subprocess.Popen(
            ["unshare", "--net", *cli("run", str(job), "--client", str(client))], cwd=ROOT, env=environment(cache),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        out, err = elsewhere.communicate(timeout=240)
        assert elsewhere.returncode == 0, out + err
        # unshare execs the command: the run recorded in state.db is that process.
        assert run_pids(data)[-1] == elsewhere.pid
    finally:
        stop_kept(data)
    assert leaks(engine, tmp_path) == []


def test_a_server_that_never_answers_is_given_up_on_and_the_run_happens_here(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stuck server must not hang every run: after the hand-over timeout the command runs in its
    own process, and it has closed the connection, so the server can never run it as well."""
    from driversdk import privatedir
    from driversdk.codeid import context_key
    from driversdk.runner import runclient

    monkeypatch.setenv(ENV_CACHE_DIR, str(cache))
    monkeypatch.setenv(ENV_LINGER, "30s")
    monkeypatch.setattr(runclient, "HAND_OVER_TIMEOUT", 1.0)
    directory = privatedir.private_dir(create=False)
    assert directory == str(cache)
    path = runwire.socket_path(directory, context_key())
    assert path is not None
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(path)
    stuck.listen(1)
    try:
        assert runclient.run_by_server("driversdk", ["run", "nothing.hcl"]) is None
        conn, _ = stuck.accept()
        conn.settimeout(10)
        request, fds = runwire.receive(conn, want_fds=runwire.FDS)
        runwire._close(fds)
        assert request is not None and request["argv"] == ["run", "nothing.hcl"]
        assert conn.recv(1) == b"", "the client did not close its connection when it gave up"
        conn.close()
    finally:
        stuck.close()
        os.unlink(path)


def test_a_server_of_another_user_is_never_handed_a_run(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client hands over its environment (secrets), streams and command line: only to a
    process of its own user, whatever made another's socket reachable at its path."""
    from driversdk import privatedir
    from driversdk.codeid import context_key
    from driversdk.runner import runclient

    monkeypatch.setenv(ENV_CACHE_DIR, str(cache))
    monkeypatch.setenv(ENV_LINGER, "30s")
    monkeypatch.setenv("DSX_SECRET", "not-for-nobody")
    directory = privatedir.private_dir(create=False)
    assert directory == str(cache)
    path = runwire.socket_path(directory, context_key())
    assert path is not None
    loot = cache.parent / "received"
    with listener_of_another_user(path, str(loot)):
        monkeypatch.setattr(runclient, "HAND_OVER_TIMEOUT", 2.0)  # the attacker never answers
        assert runclient.run_by_server("driversdk", ["run", "nothing.hcl"]) is None
    assert loot.read_bytes() == b"", "the client sent its request to another user's process"
