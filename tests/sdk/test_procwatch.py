"""The process watcher: one thread reports the exits of many processes, reaping only its children."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable

import pytest

from driversdk.procwatch import ProcessWatcher

WAIT = 60.0  # generous: the assertions are about what is reported, never about how fast


class Exits:
    """Collects (pid, returncode) reports; each pid's event is set on its first report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports: list[tuple[int, int | None]] = []
        self._events: dict[int, threading.Event] = {}

    def callback(self, pid: int) -> Callable[[int | None], None]:
        event = self._events.setdefault(pid, threading.Event())

        def report(code: int | None) -> None:
            with self._lock:
                self.reports.append((pid, code))
            event.set()

        return report

    def wait(self, pid: int) -> None:
        assert self._events[pid].wait(WAIT), f"exit of pid {pid} was never reported"

    def codes(self, pid: int) -> list[int | None]:
        with self._lock:
            return [code for p, code in self.reports if p == pid]


def _spawn(script: str) -> int:
    # posix_spawn, not subprocess.Popen: a Popen object would waitpid the child itself
    # (on wait() or when collected), and the point is that the watcher reaps it.
    return os.posix_spawn("/bin/sh", ["/bin/sh", "-c", script], dict(os.environ))


def _spawn_reading(fd: int, script: str) -> int:
    """A child that first reads a line from ``fd`` (its stdin): it exits once the pipe closes."""
    return os.posix_spawn(
        "/bin/sh", ["/bin/sh", "-c", f"read x; {script}"], {}, file_actions=[(os.POSIX_SPAWN_DUP2, fd, 0)]
    )


def _is_reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _our_zombies() -> list[int]:
    me = str(os.getpid())
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and fields[1] == me:
            found.append(int(name))
    return found


def _watcher() -> ProcessWatcher:
    return ProcessWatcher(name=f"procwatch-test-{uuid.uuid4().hex[:8]}")


def _threads_named(name: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == name)


def test_own_children_report_their_exit_codes_and_are_reaped() -> None:
    watcher, exits = _watcher(), Exits()
    pids = {_spawn("exit 0"): 0, _spawn("exit 3"): 3, _spawn("kill -TERM $$"): -signal.SIGTERM}
    for pid in pids:
        watcher.watch(pid, exits.callback(pid), reap=True)
    for pid, code in pids.items():
        exits.wait(pid)
        assert exits.codes(pid) == [code]
        assert _is_reaped(pid)


def test_two_hundred_children_each_reported_once_without_zombies() -> None:
    watcher, exits = _watcher(), Exits()
    # They wait on a pipe so all 200 are registered while alive, then exit together.
    read_end, write_end = os.pipe()
    try:
        pids = {_spawn_reading(read_end, f"exit {i % 100}"): i % 100 for i in range(200)}
        for pid in pids:
            watcher.watch(pid, exits.callback(pid), reap=True)
    finally:
        os.close(read_end)
        os.close(write_end)  # EOF: every child's read returns
    for pid in pids:
        exits.wait(pid)
    assert sorted(exits.reports) == sorted(pids.items())
    assert all(_is_reaped(pid) for pid in pids)
    assert not [pid for pid in _our_zombies() if pid in pids]
    assert _threads_named(watcher._name) == 1


def test_a_process_that_is_not_our_child_is_reported_and_not_reaped() -> None:
    watcher, exits = _watcher(), Exits()
    # The shell backgrounds sleep and exits: sleep is our grandchild, adopted by init.
    out = subprocess.run(
        ["/bin/sh", "-c", "sleep 600 >/dev/null 2>&1 </dev/null & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    watcher.watch(pid, exits.callback(pid), reap=False, identity=lambda: os.path.exists(f"/proc/{pid}"))
    try:
        assert not exits._events[pid].wait(0.3), "reported while the process was still running"
    finally:
        os.kill(pid, signal.SIGKILL)
    exits.wait(pid)
    assert exits.codes(pid) == [None]  # not our child: its status is not ours to read


def test_a_child_watched_without_reap_is_left_for_its_owner() -> None:
    watcher, exits = _watcher(), Exits()
    pid = _spawn("exit 7")
    watcher.watch(pid, exits.callback(pid), reap=False)
    exits.wait(pid)
    assert exits.codes(pid) == [None]
    # Still a zombie for whoever owns it to collect.
    assert os.waitpid(pid, 0) == (pid, 7 << 8)


def test_an_already_exited_child_is_reported_at_once_and_reaped() -> None:
    watcher, exits = _watcher(), Exits()
    pid = _spawn("exit 5")
    while pid not in _our_zombies():
        threading.Event().wait(0.01)
    watcher.watch(pid, exits.callback(pid), reap=True)
    exits.wait(pid)
    assert exits.codes(pid) == [5]
    assert _is_reaped(pid)


def test_a_pid_that_is_gone_is_reported_at_once() -> None:
    watcher, exits = _watcher(), Exits()
    pid = _spawn("exit 0")
    os.waitpid(pid, 0)  # reaped: the pid names no process now
    watcher.watch(pid, exits.callback(pid), reap=False, identity=lambda: False)
    exits.wait(pid)
    gone = _spawn("exit 0")
    os.waitpid(gone, 0)
    watcher.watch(gone, exits.callback(gone), reap=False)
    exits.wait(gone)
    assert exits.codes(pid) == [None] and exits.codes(gone) == [None]


def test_a_reused_pid_counts_as_the_process_being_gone() -> None:
    """identity says no (the pid now names some other process): reported at once, untouched."""
    watcher, exits = _watcher(), Exits()
    other = subprocess.Popen(["sleep", "600"])
    try:
        watcher.watch(other.pid, exits.callback(other.pid), reap=False, identity=lambda: False)
        exits.wait(other.pid)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_raising_callback_does_not_stop_the_watcher(caplog: pytest.LogCaptureFixture) -> None:
    watcher, exits = _watcher(), Exits()
    failed = threading.Event()

    def boom(code: int | None) -> None:
        failed.set()
        raise RuntimeError("callback failure")

    first = _spawn("exit 1")
    watcher.watch(first, boom, reap=True)
    assert failed.wait(WAIT)
    second = _spawn("exit 2")
    watcher.watch(second, exits.callback(second), reap=True)
    exits.wait(second)
    assert exits.codes(second) == [2]
    assert _is_reaped(first)
    assert f"exit callback for pid {first} failed" in caplog.text


def test_one_thread_however_many_processes() -> None:
    watcher, exits = _watcher(), Exits()
    before = threading.active_count()
    read_end, write_end = os.pipe()
    try:
        pids = [_spawn_reading(read_end, "exit 0") for _ in range(50)]
        for pid in pids:
            watcher.watch(pid, exits.callback(pid), reap=True)
        assert threading.active_count() == before + 1
        assert _threads_named(watcher._name) == 1
    finally:
        os.close(read_end)
        os.close(write_end)
    for pid in pids:
        exits.wait(pid)
    assert threading.active_count() == before + 1


def test_the_open_file_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("an unlimited hard limit is not a value the soft limit can take")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    try:
        watcher, exits = _watcher(), Exits()
        pid = _spawn("exit 0")
        watcher.watch(pid, exits.callback(pid), reap=True)
        exits.wait(pid)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
