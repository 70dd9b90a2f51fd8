"""The attacker is a task that can write to alloc/logs (exec mounts the alloc dir read-write).

It swaps the collector's log files, its next rotation target or its fifos for symlinks, hard
links, fifos and directories, hoping that the root-owned collector writes the task's output into
(or reads from) a host file. Every test uses the real collector process, and checks that the host
file is byte-identical afterwards, that no output was lost, and that the refusal was reported.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from driversdk.agent.logmon import tasklogs as logcollect
from driversdk.agent.run import log_files
from driversdk.errors import DriverSDKError

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"root:host secret that no task may touch\n"
SIZE = 1000  # max_size of the unit tests' log files, in bytes


def alloc(tmp_path: Path) -> tuple[Path, Path]:
    """An alloc dir laid out as the runner makes it, and a host file outside it."""
    logs = tmp_path / "allocs" / "a1" / "alloc" / "logs"
    logs.mkdir(parents=True)
    host = tmp_path / "host-secret"
    host.write_bytes(SECRET)
    return logs, host


def write(fifo: str, data: bytes) -> None:
    """Write as the task does: straight into the fifo the collector holds open."""
    fd = os.open(fifo, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def collected(logs: Path, kind: str = "stdout") -> bytes:
    """What the operator can read: the regular log files, oldest first."""
    return b"".join(Path(p).read_bytes() for p in log_files(str(logs.parents[1]), "web", kind))


def wait_size(path: Path, size: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size >= size:
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} never reached {size} bytes")


def events(logmon: logcollect.Logmon) -> list[str]:
    lines, _ = logcollect.read_events(logmon.events, 0)
    return lines


def test_planted_current_files_are_not_followed_and_nothing_is_lost(tmp_path: Path) -> None:
    logs, host = alloc(tmp_path)
    # Before a (re)started collector resumes: its current stdout file is a symlink to a host file,
    # its current stderr file a hard link to one.
    (logs / "web.stdout.0").symlink_to(host)
    os.link(host, logs / "web.stderr.0")
    logmon = logcollect.spawn(str(logs), "web", max_files=50, max_size=SIZE)
    out = bytes(range(256)) * 10
    err = b"E" * 2500
    try:
        write(logmon.stdout_fifo, out)
        write(logmon.stderr_fifo, err)
    finally:
        logcollect.stop(logmon)
    assert host.read_bytes() == SECRET
    assert collected(logs) == out
    assert collected(logs, "stderr") == err
    assert sorted(events(logmon)) == [
        'log file "web.stderr.0" in alloc/logs is a hard link to another file; the collector did not write to it '
        'and writes to "web.stderr.1"',
        'log file "web.stdout.0" in alloc/logs was replaced by a symlink; the collector did not follow it and writes '
        'to "web.stdout.1"',
    ]
    for name in ("web.stdout.1", "web.stdout.2", "web.stdout.3", "web.stderr.1"):
        st = os.lstat(logs / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640, name


def test_planted_rotation_targets_are_skipped_while_running(tmp_path: Path) -> None:
    logs, host = alloc(tmp_path)
    host_fifo = tmp_path / "host-fifo"
    os.mkfifo(host_fifo)
    logmon = logcollect.spawn(str(logs), "web", max_files=50, max_size=SIZE)
    first, rest = b"a" * 600, b"b" * 3000
    try:
        write(logmon.stdout_fifo, first)
        wait_size(logs / "web.stdout.0", len(first))
        # The task prepares every kind of trap at the next rotation targets.
        (logs / "web.stdout.1").symlink_to(host)
        os.link(host, logs / "web.stdout.2")
        os.mkfifo(logs / "web.stdout.3")  # opening it for writing would block a careless collector
        (logs / "web.stdout.4").symlink_to(host_fifo)
        (logs / "web.stdout.5").mkdir()
        write(logmon.stdout_fifo, rest)
    finally:
        logcollect.stop(logmon)
    assert host.read_bytes() == SECRET
    assert collected(logs) == first + rest
    names = [os.path.basename(p) for p in log_files(str(logs.parents[1]), "web", "stdout")]
    assert names == ["web.stdout.0", "web.stdout.6", "web.stdout.7", "web.stdout.8"]
    target = 'and writes to "web.stdout.6"'
    assert events(logmon) == [
        f'log file "web.stdout.1" in alloc/logs was replaced by a symlink; the collector did not follow it {target}',
        f'log file "web.stdout.2" in alloc/logs is a hard link to another file; the collector did not write to it '
        f"{target}",
        f'log file "web.stdout.3" in alloc/logs is a fifo, not a regular file; the collector did not write to it '
        f"{target}",
        f'log file "web.stdout.4" in alloc/logs was replaced by a symlink; the collector did not follow it {target}',
        f'log file "web.stdout.5" in alloc/logs is a directory, not a regular file; the collector did not write to '
        f"it {target}",
    ]
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o640 for p in log_files(str(logs.parents[1]), "web", "stdout"))


def test_events_are_read_from_an_offset(tmp_path: Path) -> None:
    logs, host = alloc(tmp_path)
    (logs / "web.stdout.0").symlink_to(host)
    logmon = logcollect.spawn(str(logs), "web", max_files=5, max_size=SIZE)
    logcollect.stop(logmon)
    lines, offset = logcollect.read_events(logmon.events, 0)
    assert len(lines) == 1 and offset == os.path.getsize(logmon.events)
    assert logcollect.read_events(logmon.events, offset) == ([], offset)
    assert not logmon.events.startswith(str(logs.parent) + os.sep), "events live outside the task's view"
    assert logcollect.read_events(str(tmp_path / "none"), 0) == ([], 0)


def refusal(logs: str) -> DriverSDKError:
    """The error spawn refuses with; a collector that started anyway is stopped, not leaked."""
    try:
        logmon = logcollect.spawn(logs, "web", max_files=5, max_size=SIZE)
    except DriverSDKError as err:
        return err
    logcollect.stop(logmon)
    pytest.fail("the collector started on a planted entry")


def host_fifo(tmp_path: Path) -> Path:
    path = tmp_path / "host-fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    ("plant", "what"),
    [
        (lambda p, t: p.symlink_to(t / "host-secret"), "is a symlink"),
        (lambda p, t: p.symlink_to(host_fifo(t)), "is a symlink"),
        (lambda p, t: os.link(t / "host-secret", p), "is a regular file"),
        (lambda p, t: p.mkdir(), "is a directory"),
    ],
    ids=["symlink-to-host-file", "symlink-to-host-fifo", "hard-link", "directory"],
)
def test_a_planted_fifo_is_refused_with_a_sentence(
    tmp_path: Path, plant: Callable[[Path, Path], object], what: str
) -> None:
    logs, host = alloc(tmp_path)
    fifo = Path(logcollect.fifo_paths(str(logs), "web")[1])
    plant(fifo, tmp_path)
    refused = refusal(str(logs))
    assert str(refused) == (
        f'the log collector for task "web" refused its stderr fifo ".web.stderr.fifo" in alloc/logs: it {what}, '
        "not the fifo the collector made; remove it and run the task again"
    )
    assert host.read_bytes() == SECRET
    assert not list(logs.glob("web.*")), "nothing was collected from the planted file"
    assert not os.path.lexists(logcollect.fifo_paths(str(logs), "web")[0]), "the fifo spawn made is removed"


def test_a_symlinked_logs_dir_is_refused(tmp_path: Path) -> None:
    logs, _ = alloc(tmp_path)
    elsewhere = tmp_path / "host-dir"
    elsewhere.mkdir()
    logs.rmdir()
    logs.symlink_to(elsewhere)
    refused = refusal(str(logs))
    assert str(refused) == (
        f'the log collector for task "web" refused the logs dir "{logs}": it is a symlink or not a directory; '
        "remove it and run the task again"
    )
    assert list(elsewhere.iterdir()) == []


def test_log_files_lists_only_regular_files(tmp_path: Path) -> None:
    logs, host = alloc(tmp_path)
    (logs / "web.stdout.0").write_bytes(b"zero\n")
    (logs / "web.stdout.1").symlink_to(host)
    os.link(host, logs / "web.stdout.2")
    (logs / "web.stdout.3").mkdir()
    (logs / "web.stdout.4").write_bytes(b"four\n")
    assert collected(logs) == b"zero\nfour\n"


# --- end to end: an exec task through `driversdk run` ----------------------------------------------


def _exec_usable() -> str | None:
    if os.geteuid() != 0:
        return "exec tasks need root"
    if shutil.which("runc") is None:
        return "runc is not installed"
    return None


@pytest.mark.skipif(_exec_usable() is not None, reason=str(_exec_usable()))
def test_an_exec_task_cannot_redirect_its_log_rotation_to_a_host_file(short_dir: Path) -> None:
    host = short_dir / "host-target"  # a host path: only the root collector could resolve it
    host.write_bytes(SECRET)
    data = short_dir / "data"
    client = short_dir / "client.hcl"
    client.write_text(
        f'data_dir = "{data}"\nplugin "exec" {{\n  config {{\n    state_dir = "{short_dir / "st"}"\n'
        '    denied_host_uids = ""\n    denied_host_gids = ""\n  }\n}\n'
    )
    size = 1536 * 1024
    script = f"ln -sf {host} /alloc/logs/web.stdout.1 && yes 0123456789abcdef | head -c {size}"
    job = short_dir / "job.hcl"
    job.write_text(
        f"""job "shop" {{
  type = "batch"
  group "web" {{
    task "web" {{
      driver = "exec"
      user   = "root" # only root (allowed above) may write alloc/logs, where the link is planted
      kill_timeout = "1s"
      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}
      logs {{
        max_files     = 10
        max_file_size = 1
      }}
    }}
  }}
}}
"""
    )
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert host.read_bytes() == SECRET
    assert (
        '==> task "web" event: log file "web.stdout.1" in alloc/logs was replaced by a symlink; the collector did '
        'not follow it and writes to "web.stdout.2" [job "shop", alloc '
    ) in done.stdout, done.stdout
    (alloc_dir,) = (data / "allocs").iterdir()
    logs = alloc_dir / "alloc" / "logs"
    assert os.path.islink(logs / "web.stdout.1"), "the task's symlink is left where it was, unused"
    out = collected(logs)
    assert len(out) == size and out == (b"0123456789abcdef\n" * (size // 17 + 1))[:size]
