"""Issue 25 item 3, replayed: another local user takes the place of a plugin root's run recorded.

A reattach record (pid, start time, socket path) outlives its plugin. The attacker runs as uid
nobody: it takes the recorded pid (pid reuse, made to happen with ns_last_pid), makes the
recorded socket dir again in the world-writable /tmp, or plants a symlink there, and serves a
socket. To get past a host that checks the listener's uid on a probe connection and then dials
the path again, its ``plugin.sock`` is first a symlink to a root-owned socket (any root daemon's
would do; here one of the test's, which tells the attacker when it was probed) and is swapped for
the attacker's own socket right after the probe. Whatever the attacker's socket reads is recorded:
a host that reattaches to it has already lost (gRPC's preface comes before any config or task).

Every test here fails on the code before the fix (uid-only probe, EPERM read as alive, the path
dialled twice); the genuine plugin of a killed run is still reattached (tests/agent/test_run_faults.py,
tests/agent/test_state_migration.py, tests/sdk/test_transport.py).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from driversdk.client import launch
from driversdk.plugin.host import reattach_plugin, remove_dead_plugin_socket
from driversdk.plugin.reattach import ReattachConfig
from driversdk.plugin.verify import PluginGone, ReattachRefused, process_start_time
from tests.agent.runs import ROOT, cli, db_rows, leaks, plugin_pid, wait_for, write_job
from tests.hostcheck import NOBODY

HELLO = [sys.executable, str(ROOT / "examples" / "hello_driver.py")]


@dataclass
class Attacker:
    pid: int
    loot: Path  # every byte the attacker's socket read

    def received(self) -> bytes:
        return self.loot.read_bytes()


class RootSocket:
    """A root-owned listening socket (as a root daemon's) that closes whatever connects, and says
    so on ``probed`` so the attacker can swap its symlink right after a host's probe."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.probed_r, self.probed_w = os.pipe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.1)
            if ready:
                conn, _ = self.sock.accept()
                conn.close()
                os.write(self.probed_w, b"p")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        os.close(self.probed_w)
        os.close(self.probed_r)


def _attacker_body(
    sock_dir: str, make_dir: bool, link_at: str | None, root_target: str, probed: int, loot: int, ready: int
) -> None:
    """In the forked child: become nobody, make the socket dir (or a symlink to one), serve. The
    loot file was opened before the uid drop."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    if make_dir:
        os.mkdir(sock_dir, 0o700)
    if link_at is not None:  # the recorded dir is a symlink the attacker plants to its own dir
        os.symlink(sock_dir, link_at)
    own = os.path.join(sock_dir, "real.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(own)
    listener.listen(8)
    os.symlink(root_target, os.path.join(sock_dir, "plugin.sock"))
    os.write(ready, b"r")
    conns: list[socket.socket] = []
    while True:
        ready, _, _ = select.select([listener, probed, *conns], [], [])
        if probed in ready:
            os.read(probed, 1)
            swap = os.path.join(sock_dir, "swap")
            os.symlink("real.sock", swap)
            os.rename(swap, os.path.join(sock_dir, "plugin.sock"))
        if listener in ready:
            conn, _ = listener.accept()
            conns.append(conn)
        for conn in [c for c in conns if c in ready]:
            data = conn.recv(65536)
            if data:
                os.write(loot, data)
            else:
                conns.remove(conn)
                conn.close()


@contextlib.contextmanager
def attacker(
    sock_dir: str, root: RootSocket, loot: Path, *, make_dir: bool = True, link_at: str | None = None, pid: int = 0
) -> Iterator[Attacker]:
    """Fork the attacker (with pid ``pid`` when given: ns_last_pid, retried until the kernel gives it)."""
    loot_fd = os.open(loot, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    ready_r, ready_w = os.pipe()
    child = 0
    try:
        for _ in range(200):
            if pid:
                with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
                    fh.write(str(pid - 1))
            child = os.fork()
            if child == 0:
                try:
                    if pid and os.getpid() != pid:
                        os._exit(3)
                    os.close(ready_r)
                    _attacker_body(sock_dir, make_dir, link_at, root.path, root.probed_r, loot_fd, ready_w)
                finally:
                    os._exit(0)
            if not pid or child == pid:
                break
            os.waitpid(child, 0)
            child = 0
        assert child, f"the attacker never got pid {pid}"
        os.close(ready_w)
        ready_w = -1
        assert os.read(ready_r, 1) == b"r", "the attacker did not start"
        yield Attacker(child, loot)
    finally:
        if ready_w >= 0:
            os.close(ready_w)
        os.close(ready_r)
        os.close(loot_fd)
        if child:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A sticky, world-writable dir of root's under /tmp, as /tmp itself: where plugins make their
    socket dirs and where another user may make anything of their own."""
    path = Path(tempfile.mkdtemp(prefix="dsx-reattach-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root_socket(tmp_path: Path) -> Iterator[RootSocket]:
    server = RootSocket(str(tmp_path / "daemon.sock"))
    yield server
    server.close()


def _hello_in(place: Path) -> tuple[object, ReattachConfig]:
    client = launch(HELLO, env={**os.environ, "TMPDIR": str(place)}, name="hello")
    return client, client.process.reattach_config


def test_a_pid_taken_by_another_user_with_the_socket_dir_made_again_is_refused(
    public_tmp: Path, root_socket: RootSocket, tmp_path: Path
) -> None:
    """The plugin stopped (its dir removed), another user's process has its pid and serves at its
    socket path: refused on the pid alone (EPERM from kill is not "alive and ours"), no byte sent."""
    sock_dir = str(public_tmp / "plugin-stopped")
    with attacker(sock_dir, root_socket, tmp_path / "loot") as evil:
        config = ReattachConfig(
            pid=evil.pid,
            network="unix",
            address=f"{sock_dir}/plugin.sock",
            start_time=process_start_time(evil.pid) or 0,
        )
        with pytest.raises(ReattachRefused, match=rf"process {evil.pid} belongs to another user"):
            reattach_plugin(config, name="docker", timeout=3)
        assert evil.received() == b""


def test_a_live_plugins_socket_dir_replaced_by_another_users_dir_is_refused(
    public_tmp: Path, root_socket: RootSocket, tmp_path: Path
) -> None:
    """Our plugin lives on (its pid and start time check out), but its socket dir was removed (a
    /tmp cleaner) and another user made one at the same path: refused on the dir's owner."""
    client, config = _hello_in(public_tmp)
    try:
        sock_dir = os.path.dirname(config.address)
        shutil.rmtree(sock_dir)
        with attacker(sock_dir, root_socket, tmp_path / "loot") as evil:
            with pytest.raises(ReattachRefused, match=rf"owned by uid {NOBODY}, not by {os.geteuid()}"):
                reattach_plugin(config, name="hello", timeout=3)
            assert evil.received() == b""
    finally:
        client.kill()  # type: ignore[attr-defined]


def test_a_symlinked_socket_dir_is_refused(public_tmp: Path, root_socket: RootSocket, tmp_path: Path) -> None:
    """As above, but the attacker plants a symlink at the recorded dir's path, to a dir of its own."""
    client, config = _hello_in(public_tmp)
    try:
        recorded = os.path.dirname(config.address)
        shutil.rmtree(recorded)
        with attacker(str(public_tmp / "elsewhere"), root_socket, tmp_path / "loot", link_at=recorded) as evil:
            assert os.path.islink(recorded)
            with pytest.raises(ReattachRefused, match="which is not a real directory"):
                reattach_plugin(config, name="hello", timeout=3)
            assert evil.received() == b""
    finally:
        client.kill()  # type: ignore[attr-defined]


def test_a_reused_pid_of_our_own_user_is_refused_by_its_start_time() -> None:
    """The recorded pid now belongs to another process of ours (not the plugin): its start time differs."""
    client, config = _hello_in(Path(tempfile.gettempdir()))
    other = subprocess.Popen(["sleep", "30"])
    try:
        reused = ReattachConfig(pid=other.pid, network="unix", address=config.address, start_time=config.start_time)
        assert config.start_time and process_start_time(other.pid) != config.start_time
        with pytest.raises(ReattachRefused, match=rf"process {other.pid} started at tick"):
            reattach_plugin(reused, name="hello", timeout=3)
    finally:
        other.kill()
        other.wait()
        client.kill()  # type: ignore[attr-defined]


def test_a_socket_served_by_another_process_than_the_recorded_one_is_refused() -> None:
    """The pid and its start time are the plugin's, but the socket at the recorded path is served by
    another process (SO_PEERCRED's pid, not only its uid)."""
    first, config = _hello_in(Path(tempfile.gettempdir()))
    second, other = _hello_in(Path(tempfile.gettempdir()))
    try:
        crossed = ReattachConfig(pid=config.pid, network="unix", address=other.address, start_time=config.start_time)
        with pytest.raises(ReattachRefused, match=rf"served by process {other.pid}, not by the plugin's process"):
            reattach_plugin(crossed, name="hello", timeout=3)
    finally:
        first.kill()  # type: ignore[attr-defined]
        second.kill()  # type: ignore[attr-defined]


def test_a_dead_plugins_socket_path_served_by_another_user_gets_nothing(
    public_tmp: Path, root_socket: RootSocket, tmp_path: Path
) -> None:
    """The plugin is gone; another user serves at its path: gone, never dialled, its dir not removed."""
    client, config = _hello_in(public_tmp)
    client.kill()  # type: ignore[attr-defined]
    sock_dir = os.path.dirname(config.address)
    assert not os.path.exists(sock_dir)
    with attacker(sock_dir, root_socket, tmp_path / "loot") as evil:
        with pytest.raises(PluginGone):
            reattach_plugin(config, name="hello", timeout=3)
        assert remove_dead_plugin_socket(config) is False, "another user's dir is never removed"
        assert os.path.isdir(sock_dir)
        assert evil.received() == b""


def test_a_genuine_plugin_is_reattached_through_its_checked_dir() -> None:
    client, config = _hello_in(Path(tempfile.gettempdir()))
    try:
        client.process.channel.close()  # type: ignore[attr-defined]
        again = reattach_plugin(config, name="hello", timeout=10)
        assert again.channel is not None
        again.kill()
        assert not again.alive()
    finally:
        client.kill()  # type: ignore[attr-defined]


# --- the whole replay through `driversdk run` -----------------------------------------------------


def test_a_run_refuses_the_impostor_of_its_killed_predecessors_plugin_and_recovers_the_task(
    engine: docker.DockerClient, tmp_path: Path, root_socket: RootSocket
) -> None:
    """Run A (docker, a long task) is killed; its plugin then stops cleanly, removing its socket dir
    and leaving its record. As nobody, the attacker takes the plugin's pid and makes its socket dir
    again in /tmp. Run B says what it refused, sends the attacker nothing, launches its own plugin
    and recovers the task (the container run A started)."""
    job, client, data = write_job(tmp_path, "echo up; sleep 300")
    reaper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.agent.reaper_run",
            "--keep",
            "--",
            *cli("run", str(job), "--client", str(client)),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_b: subprocess.Popen[str] | None = None
    try:
        wait_for("run A's task", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'"))
        pid = int(str(wait_for("run A's plugin", lambda: plugin_pid(data, "docker"))))
        [(saved,)] = db_rows(data, "SELECT reattach FROM run_plugins WHERE driver='docker'")
        recorded = ReattachConfig.from_json(str(saved))
        assert recorded.start_time, "the launch records the plugin's start time"
        [(run_pid,)] = db_rows(data, "SELECT run_pid FROM run_allocs")
        os.kill(int(str(run_pid)), signal.SIGKILL)
        os.kill(pid, signal.SIGTERM)  # it stops cleanly: socket dir removed, record left
        wait_for("the plugin to be reaped", lambda: not os.path.exists(f"/proc/{pid}"))
        sock_dir = os.path.dirname(recorded.address)
        assert not os.path.exists(sock_dir)
        with attacker(sock_dir, root_socket, tmp_path / "loot", pid=pid) as evil:
            run_b = subprocess.Popen(
                cli("run", str(job), "--client", str(client)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            assert run_b.stdout is not None
            seen = [""]
            while '==> task "work" recovered' not in seen[-1]:
                seen.append(run_b.stdout.readline())
                assert seen[-1], "run B ended early: " + "".join(seen) + run_b.communicate()[1]
            run_b.send_signal(signal.SIGINT)
            out, err = run_b.communicate(timeout=120)
            text = "".join(seen) + out
            assert evil.received() == b"", "the impostor was sent bytes"
            assert (
                f"==> driver \"docker\": refused to reattach to plugin 'docker': process {pid} belongs to another "
                "user, so it is not the plugin this host launched (its pid was reused); a new plugin is launched "
                "instead" in text
            ), text + err
            assert os.path.isdir(sock_dir), "the other user's dir is not ours to remove"
        assert "reattached to its running plugin" not in text
        assert '==> task "work" started' not in text, "the running container was recovered, not started again"
        assert "Traceback" not in text + err
        rows = db_rows(data, "SELECT reattach FROM run_plugins")
        assert rows == [], rows
    finally:
        for proc in (run_b,):
            if proc is not None and proc.poll() is None:
                proc.kill()
        reaper.kill()
        reaper.wait()
    assert leaks(engine, tmp_path) == []
