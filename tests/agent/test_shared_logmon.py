"""One log collector process per data dir serves every task (issue 31): real collector processes,
real fifos, real writer processes (``/bin/sh`` loops writing numbered lines, one write a line).

Each test counts the collector processes of its data dir in /proc; the attacker test plants
links as an exec task could (alloc/logs is the task's to write), and the kill tests use SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.agent.logmon import tasklogs as logcollect
from driversdk.agent.run import log_files
from tests.agent.runs import ROOT

SECRET = b"root:host secret that no task may touch\n"
WAIT = 30.0


def collectors(data: Path) -> list[int]:
    """Pids of the live log collector processes of ``data`` (zombies are not running)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if "logmon/collector.py" in cmdline and f"{data}/" in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


def until(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def logs_dir(data: Path, alloc: str) -> Path:
    path = data / "allocs" / alloc / "alloc" / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def collected(logs: Path, task: str, kind: str = "stdout") -> bytes:
    """What the operator reads: the task's regular log files, oldest first."""
    return b"".join(Path(p).read_bytes() for p in log_files(str(logs.parents[1]), task, kind))


def writer(fifo: str, lines: int, tag: str) -> subprocess.Popen[bytes]:
    """A task writing ``lines`` numbered lines into its fifo, one write(2) each (dash's echo)."""
    script = 'i=0; while [ "$i" -lt "$1" ]; do echo "$2 $i"; i=$((i+1)); done'
    return subprocess.Popen(["/bin/sh", "-c", f"exec >{fifo}; {script}", "sh", str(lines), tag])


def endless_writer(fifo: str, stop: Path) -> subprocess.Popen[bytes]:
    """A task writing numbered lines until ``stop`` exists, then END."""
    script = f'exec >{fifo}; i=0; while [ ! -e {stop} ]; do echo "$i"; i=$((i+1)); done; echo END'
    return subprocess.Popen(["/bin/sh", "-c", script])


def numbered(data: bytes, tag: str, count: int) -> None:
    """Every line ``<tag> <n>`` for n in 0..count-1, in order, none lost or doubled."""
    lines = data.decode().splitlines()
    assert len(lines) == count, (tag, len(lines), count)
    for n, line in enumerate(lines):
        assert line == f"{tag} {n}", (tag, n, line)


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data"
    path.mkdir()
    yield path
    # Whatever a test served is removed by it; the collector, serving nothing and held by nobody, ends.
    until(lambda: not collectors(path), "the idle collector ended")


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the collector checks files are root's")


def test_twenty_tasks_are_served_by_one_collector_process(data: Path) -> None:
    served = [(logs_dir(data, f"a{i % 5}"), f"t{i}") for i in range(20)]
    threads = threading.active_count()
    logmons = [logcollect.spawn(str(logs), task, max_files=3, max_size=1000) for logs, task in served]
    try:
        assert len(collectors(data)) == 1, "one process for every task of the data dir"
        assert len({m.pid for m in logmons}) == 1
        for logmon in logmons:  # what the log hook does for each task it starts
            logcollect.watch_events(logmon, lambda _sentence: None)
        assert threading.active_count() <= threads + 1, "one poller thread for every task's events, not one each"
        for logmon, (_, task) in zip(logmons, served, strict=True):
            with open(logmon.stdout_fifo, "w") as fifo:
                fifo.write(f"hello from {task}\n")
    finally:
        for logmon in logmons:
            logcollect.unwatch_events(logmon)
            logcollect.stop(logmon)
    for logs, task in served:
        assert collected(logs, task) == f"hello from {task}\n".encode()
        assert not os.path.lexists(logcollect.fifo_paths(str(logs), task)[0]), "the fifos are removed"


def test_a_hundred_writers_at_once_lose_no_line_across_rotated_files(data: Path) -> None:
    tasks, lines = 100, 2000
    served = [(logs_dir(data, f"a{i // 4}"), f"t{i}") for i in range(tasks)]
    # Small files: each task's ~20 KB rotate through a dozen files, all kept.
    logmons = [logcollect.spawn(str(logs), task, max_files=100, max_size=2048) for logs, task in served]
    writers: list[subprocess.Popen[bytes]] = []
    try:
        assert len(collectors(data)) == 1
        writers = [writer(m.stdout_fifo, lines, task) for m, (_, task) in zip(logmons, served, strict=True)]
        assert [w.wait(timeout=120) for w in writers] == [0] * tasks
    finally:
        for w in writers:
            w.kill()
            w.wait()
        for logmon in logmons:
            logcollect.stop(logmon)
    for logs, task in served:
        numbered(collected(logs, task), task, lines)
        assert len(log_files(str(logs.parents[1]), task, "stdout")) > 5, "rotated by size"


def test_a_killed_collector_is_replaced_and_no_line_of_any_task_is_lost(data: Path, tmp_path: Path) -> None:
    served = [(logs_dir(data, "a1"), "one"), (logs_dir(data, "a2"), "two")]
    logmons = [logcollect.spawn(str(logs), task, max_files=1000, max_size=64 * 1024) for logs, task in served]
    stop = tmp_path / "stop"
    writers = [endless_writer(m.stdout_fifo, stop) for m in logmons]
    try:
        until(lambda: all(len(collected(logs, task)) > 100_000 for logs, task in served), "both tasks write")
        first = logmons[0].pid
        os.kill(first, signal.SIGKILL)
        before = [len(collected(logs, task)) for logs, task in served]
        until(lambda: collectors(data) and first not in collectors(data), "a new collector took over")
        # The new one copies on what the tasks wrote meanwhile (they waited on the full fifo).
        until(
            lambda: all(
                len(collected(logs, t)) > size + 1_000_000 for (logs, t), size in zip(served, before, strict=True)
            ),
            "the tasks' writes go on",
        )
        stop.touch()
        codes = [w.wait(timeout=60) for w in writers]
        assert codes == [0, 0], f"a writer died (-13 is SIGPIPE): {codes}"
        assert len(collectors(data)) == 1
    finally:
        stop.touch()
        for w in writers:
            w.kill()
            w.wait()
        for logmon in logmons:
            logcollect.stop(logmon)
    for logs, task in served:
        lines = collected(logs, task).decode().splitlines()
        assert lines[-1] == "END", task
        assert lines[:-1] == [str(n) for n in range(len(lines) - 1)], f"{task}: a line was lost or doubled"
        assert len(lines) > 100_000


def test_an_attackers_planted_links_do_not_disturb_another_tasks_collection(data: Path, tmp_path: Path) -> None:
    logs = logs_dir(data, "a1")  # one group: both tasks share alloc/logs
    host = tmp_path / "host-secret"
    host.write_bytes(SECRET)
    # The attacker's files, planted before it writes: a symlink and a hard link to a host file.
    (logs / "evil.stdout.0").symlink_to(host)
    os.link(host, logs / "evil.stderr.0")
    evil = logcollect.spawn(str(logs), "evil", max_files=100, max_size=1000)
    good = logcollect.spawn(str(logs), "good", max_files=100, max_size=1000)
    try:
        assert len(collectors(data)) == 1 and evil.pid == good.pid
        writers = [writer(evil.stdout_fifo, 3000, "evil"), writer(good.stdout_fifo, 3000, "good")]
        writers.append(writer(evil.stderr_fifo, 300, "err"))
        assert [w.wait(timeout=60) for w in writers] == [0, 0, 0]
    finally:
        logcollect.stop(evil)
        logcollect.stop(good)
    assert host.read_bytes() == SECRET, "the host file is untouched"
    numbered(collected(logs, "good"), "good", 3000)
    numbered(collected(logs, "evil"), "evil", 3000)
    numbered(collected(logs, "evil", "stderr"), "err", 300)
    good_events, _ = logcollect.read_events(good.events, 0)
    evil_events, _ = logcollect.read_events(evil.events, 0)
    assert good_events == [], "the other task's collection saw nothing of it"
    assert sorted(evil_events) == [
        'log file "evil.stderr.0" in alloc/logs is a hard link to another file; the collector did not write to it '
        'and writes to "evil.stderr.1"',
        'log file "evil.stdout.0" in alloc/logs was replaced by a symlink; the collector did not follow it and '
        'writes to "evil.stdout.1"',
    ]


CLIENT = """
import sys, time
from driversdk.agent.logmon import tasklogs as logcollect
logmon = logcollect.spawn(sys.argv[1], "web", max_files=5, max_size=100000)
print(logmon.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_client_leaves_the_collector_to_the_next_one(data: Path) -> None:
    logs = logs_dir(data, "a1")
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(logs)], stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert client.stdout is not None
        pid = int(client.stdout.readline())
        with open(logcollect.fifo_paths(str(logs), "web")[0], "w") as fifo:
            fifo.write("before\n")
        # Another process (a second run on the data dir) comes and goes: the collector serves on.
        other = logcollect.spawn(str(logs_dir(data, "a2")), "other", max_files=5, max_size=100000)
        assert other.pid == pid
        logcollect.stop(other)
        assert collectors(data) == [pid]
    finally:
        client.kill()  # SIGKILL: what a run or agent killed -9 leaves
        client.wait()
    assert collectors(data) == [pid], "the collector serves on"
    logmon = logcollect.spawn(str(logs), "web", max_files=5, max_size=100000)  # the next run recovers the task
    try:
        assert logmon.pid == pid and collectors(data) == [pid], "adopted, no second collector"
        with open(logmon.stdout_fifo, "w") as fifo:
            fifo.write("after\n")
    finally:
        logcollect.stop(logmon)
    assert collected(logs, "web") == b"before\nafter\n"


def test_a_task_whose_disk_is_full_does_not_stop_the_others(data: Path) -> None:
    full_logs = logs_dir(data, "a1")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(full_logs)], check=True)
    full_writer: subprocess.Popen[bytes] | None = None
    try:
        full = logcollect.spawn(str(full_logs), "full", max_files=5, max_size=1_000_000)
        ok_logs = logs_dir(data, "a2")
        ok = logcollect.spawn(str(ok_logs), "ok", max_files=100, max_size=4096)
        try:
            full_writer = writer(full.stdout_fifo, 50_000, "full")  # ~600 KB into 64 KiB: ENOSPC
            until(lambda: logcollect.read_events(full.events, 0)[0], "the full disk is reported")
            ok_writer = writer(ok.stdout_fifo, 5000, "ok")
            assert ok_writer.wait(timeout=60) == 0
            assert collectors(data) == [ok.pid], "the same collector serves on"
        finally:
            if full_writer is not None:
                full_writer.kill()  # blocked on its full fifo: nothing of it was dropped
                full_writer.wait()
            logcollect.stop(full)
            logcollect.stop(ok)
        numbered(collected(ok_logs, "ok"), "ok", 5000)
        [sentence] = logcollect.read_events(full.events, 0)[0]
        assert sentence == (
            'the log collector could not write task "full"\'s stdout to alloc/logs: No space left on device; it '
            "tries again every 1s and the task's writes wait meanwhile"
        )
    finally:
        subprocess.run(["umount", "-l", str(full_logs)], check=False)


def test_the_control_socket_protocol_and_sigterm_drains_every_fifo(data: Path) -> None:
    """The collector on its own, spoken to as the runner does: one JSON line, one reply line."""
    import json
    import socket

    logs = logs_dir(data, "a1")
    sock_path = str(data / logcollect.SOCKET_NAME)
    server = subprocess.Popen(
        [sys.executable, "-I", "-S", str(ROOT / "driversdk/agent/logmon/collector.py"), "--serve", sock_path],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    conn = socket.socket(socket.AF_UNIX)
    try:
        assert server.stdout is not None and server.stdout.readline() == b"ready\n"
        assert os.stat(sock_path).st_mode & 0o777 == 0o600
        conn.connect(sock_path)
        replies = conn.makefile("rb")

        def ask(**request: object) -> str:
            conn.sendall(json.dumps(request).encode() + b"\n")
            return replies.readline().decode().rstrip("\n")

        fifos = logcollect.fifo_paths(str(logs), "web")
        for fifo in fifos:
            os.mkfifo(fifo, 0o600)
        add = {"op": "add", "dir": str(logs), "task": "web", "max_files": 100, "max_size": 10_000, "events": ""}
        assert ask(op="ping") == "ok"
        assert ask(**add) == "ok"
        assert ask(**add) == "ok", "adding a served task again is harmless"
        (logs / ".evil.stdout.fifo").symlink_to(tmp := data / "host-fifo")
        os.mkfifo(tmp)
        assert ask(**(add | {"task": "evil"})) == (
            'refused the log collector for task "evil" refused its stdout fifo ".evil.stdout.fifo" in alloc/logs: '
            "it is a symlink, not the fifo the collector made; remove it and run the task again"
        )
        assert ask(op="dance").startswith("error ")
        # Stopped, the collector cannot read: what the task writes waits in the fifo, then SIGTERM.
        os.kill(server.pid, signal.SIGSTOP)
        payload = b"".join(b"line %d\n" % n for n in range(20000))  # 208 KB: within the 1 MiB fifo
        fd = os.open(fifos[0], os.O_WRONLY | os.O_NONBLOCK)
        try:
            assert os.write(fd, payload) == len(payload)
        finally:
            os.close(fd)
        os.kill(server.pid, signal.SIGTERM)
        os.kill(server.pid, signal.SIGCONT)
        assert server.wait(timeout=WAIT) == 0
        assert collected(logs, "web") == payload, "everything the fifo held was written out before the exit"
        assert not os.path.exists(sock_path), "the socket goes with its collector"
    finally:
        conn.close()
        if server.poll() is None:
            server.kill()
        server.wait()
        for fifo in logcollect.fifo_paths(str(logs), "web"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fifo)


def test_a_request_from_another_user_is_not_served_even_through_an_open_socket(data: Path) -> None:
    """A request names files the collector opens and writes as root: only its own user is heard,
    also when the socket's mode (0600) was opened up by mistake."""
    import json
    import shutil
    import socket
    import tempfile

    opened = Path(tempfile.mkdtemp(prefix="dsl-", dir="/tmp"))  # a dir every user may pass through
    opened.chmod(0o755)
    sock_path = str(opened / logcollect.SOCKET_NAME)
    server = subprocess.Popen(
        [sys.executable, "-I", "-S", str(ROOT / "driversdk/agent/logmon/collector.py"), "--serve", sock_path],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == b"ready\n"
        os.chmod(sock_path, 0o666)
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # uid 65534 asks, in a child of this test (root's interpreter is not theirs to run)
            try:
                os.setgid(65534)
                os.setuid(65534)
                intruder = socket.socket(socket.AF_UNIX)
                intruder.connect(sock_path)
                intruder.sendall(json.dumps({"op": "ping"}).encode() + b"\n")
                os.write(write_end, b"answer:" + intruder.makefile("rb").readline())
            except BaseException as err:
                os.write(write_end, f"error:{err!r}".encode())
            finally:
                os._exit(0)
        os.close(write_end)
        heard = os.read(read_end, 4096)
        os.close(read_end)
        os.waitpid(child, 0)
        # Closed unanswered: an empty reply, or the request's write or read failing on the closed
        # connection (EPIPE, ECONNRESET), depending on when the close came.
        closed = (b"answer:", b"error:BrokenPipeError", b"error:ConnectionResetError")
        assert heard.startswith(closed) and heard != b"answer:ok\n", f"a request of uid 65534 was answered: {heard!r}"
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(sock_path)
        conn.sendall(json.dumps({"op": "ping"}).encode() + b"\n")
        assert conn.makefile("rb").readline() == b"ok\n", "its own user is still served"
        conn.close()
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(opened, ignore_errors=True)
