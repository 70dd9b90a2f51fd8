"""CLI conventions: --version, one --client/--data-dir parent accepted before or after the
sub-command, the exit-status table of the README, and `logs -n` / `logs -f` over rotated files.

The run state is made by hand (RunState, as `driversdk run` records a task) with log files written
by the test, so every log case is exact and needs no engine."""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driversdk import logtail
from driversdk.agent.state.runstate import RunState, TaskStart
from driversdk.model import DRIVER_API_VERSION

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "examples" / "hello_driver.py"
ALLOC = "0123456789abcdef"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driversdk.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def make_state(data: Path, state: str = "running", logmon_pid: int = 0) -> Path:
    """A data dir in which task "web" of job "shop" ran (or runs), as `driversdk run` records it;
    returns the task's logs dir."""
    alloc_dir = data / "allocs" / ALLOC
    logs = alloc_dir / "alloc" / "logs"
    logs.mkdir(parents=True)
    run = RunState(str(data))
    run.started(TaskStart(ALLOC, "shop", "web", "web", "docker", "task-id", str(alloc_dir), logmon_pid), b"")
    if state != "running":
        run.finished(ALLOC, "web", 3, 0, False)
    run.close()
    return logs


def finish(data: Path) -> None:
    run = RunState(str(data))
    run.finished(ALLOC, "web", 0, 0, False)
    run.close()


def write_client(tmp_path: Path, data: Path) -> Path:
    path = tmp_path / "client.hcl"
    path.write_text(f'data_dir = "{data}"\nplugin "hello" {{\n  command = ["{sys.executable}", "{HELLO}"]\n}}\n')
    return path


def write_volume(tmp_path: Path) -> Path:
    path = tmp_path / "vol.hcl"
    path.write_text(
        'id = "v1"\nplugin_id = "p"\ncapability {\n  access_mode = "single-node-writer"\n'
        '  attachment_mode = "file-system"\n}\n'
    )
    return path


# --- --version -----------------------------------------------------------------------------------


def test_version_names_the_package_and_the_plugin_api() -> None:
    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"driversdk {importlib.metadata.version('driversdk')}\n"
        f"driver plugin API {DRIVER_API_VERSION} (go-plugin protocol 2, grpc)\n"
    )


# --- the --client / --data-dir parent --------------------------------------------------------------

# Each data-dir command, split where the options may go: [group words], [leaf words and arguments].
DATA_DIR_COMMANDS = {
    "status": ([], ["status"]),
    "logs": ([], ["logs", "web"]),
    "logs -n": ([], ["logs", "web", "-n", "1"]),
    "plugin status": (["plugin"], ["status"]),
    "volume status": (["volume"], ["status"]),
    "volume register": (["volume"], ["register", "{volume}"]),
}


@pytest.mark.parametrize("option", ["--data-dir", "--client"])
@pytest.mark.parametrize("name", list(DATA_DIR_COMMANDS))
def test_every_data_dir_command_takes_the_options_before_and_after(tmp_path: Path, name: str, option: str) -> None:
    data = tmp_path / "data"
    logs = make_state(data)
    (logs / "web.stdout.0").write_text("one\ntwo\n")
    value = str(data) if option == "--data-dir" else str(write_client(tmp_path, data))
    group, leaf = DATA_DIR_COMMANDS[name]
    leaf = [w.replace("{volume}", str(write_volume(tmp_path))) for w in leaf]
    positions = {
        "before the command": [option, value, *group, *leaf],
        "after the command": [*group, *leaf, option, value],
    }
    if group:
        positions["between group and sub-command"] = [*group, option, value, *leaf]
    results = {where: cli(*args) for where, args in positions.items()}
    for where, done in results.items():
        assert done.returncode == 0, f"{where}: {done.stdout}{done.stderr}"
        assert done.stderr == "", where
    outputs = {where: done.stdout for where, done in results.items() if "register" not in name}
    assert len(set(outputs.values())) <= 1, outputs  # the same data dir, wherever the option went
    if name == "logs":
        assert results["after the command"].stdout == "one\ntwo\n"


def test_the_option_nearest_the_command_wins(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_state(data)
    done = cli("--data-dir", str(tmp_path / "nope"), "status", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert "shop/web/web  docker" in done.stdout
    done = cli("volume", "--data-dir", str(tmp_path / "nope"), "status", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr


def test_validate_takes_client_before_the_command_too(tmp_path: Path) -> None:
    client = write_client(tmp_path, tmp_path / "data")
    job = tmp_path / "job.hcl"
    job.write_text('job "shop" {\n  group "web" {\n    task "web" {\n      driver = "hello"\n'
                   '      config {\n        command = "/bin/true"\n      }\n    }\n  }\n}\n')  # fmt: skip
    before = cli("--client", str(client), "validate", str(job))
    after = cli("validate", str(job), "--client", str(client))
    assert before.returncode == after.returncode == 0, before.stdout + after.stdout + before.stderr
    assert before.stdout == after.stdout
    assert "job 'shop': valid" in before.stdout
    without = cli("validate", str(job))
    assert without.returncode == 1, "without the client config the hello driver is unknown"


@pytest.mark.parametrize(
    "args",
    [
        ["--data-dir", "/tmp", "validate", "job.hcl"],
        ["--data-dir", "/tmp", "run", "job.hcl"],
        ["plugin", "--client", "c.hcl", "probe", "--", "true"],
        ["--data-dir", "/tmp", "plugin", "probe", "--", "true"],
    ],
    ids=lambda a: " ".join(a),
)
def test_an_option_the_command_would_ignore_is_refused(args: list[str]) -> None:
    done = cli(*args)
    assert done.returncode == 2
    flag = next(a for a in args if a.startswith("--"))
    assert f"driversdk: error: {flag} does not apply to `driversdk " in done.stderr


# --- exit status ---------------------------------------------------------------------------------


def test_exit_status_table(tmp_path: Path) -> None:
    """0 success; 1 failed / invalid / could not do its work, with one sentence; 2 refused command line."""
    data = tmp_path / "data"
    logs = make_state(data, state="failed")
    (logs / "web.stdout.0").write_text("out\n")
    d = ["--data-dir", str(data)]
    missing = ["--data-dir", str(tmp_path / "nope")]
    bad_job = tmp_path / "bad.hcl"
    bad_job.write_text('job "x" {\n  group "g" {\n    task "t" {\n      driver = "nosuch"\n    }\n  }\n}\n')
    not_hcl = tmp_path / "broken.hcl"
    not_hcl.write_text("job {{{\n")
    table: list[tuple[list[str], int, str]] = [
        (["validate", str(bad_job)], 1, "problem(s)"),
        (["validate", str(not_hcl)], 1, "error: "),
        (["validate"], 2, "the following arguments are required: job"),
        (["status", *d], 0, "failed exit=3"),
        (["status", *missing], 1, "does not exist; nothing has been run with it"),
        (["status", "--bogus", *d], 2, "unrecognized arguments: --bogus"),
        (["logs", "web", *d], 0, "out"),
        (["logs", "web", "-f", *d], 0, "out"),  # the task has ended: -f prints and returns
        (["logs", "db", *d], 1, "task 'db' has not been run with this data_dir"),
        (["logs", "web", "--stderr", *d], 1, "log entry for task 'web' and log type 'stderr' not found"),
        (["logs", "web", *missing], 1, "does not exist; nothing has been run with it"),
        (["logs", "web", "-n", "x", *d], 2, "expected a number of lines (0 or more), not 'x'"),
        (["volume", *d, "status"], 0, "no CSI volumes registered"),
        (["volume", *d, "status", "v9"], 1, 'volume "v9" is not registered in namespace "default"'),
        (["volume", *d, "deregister", "v9"], 1, "v9"),
        (["volume", *d, "register", str(bad_job)], 1, "error: "),
        (["volume", *d], 2, "required: volume_cmd"),
        (["plugin", "status", *d], 0, "no CSI plugins are registered"),
        (["plugin", "probe", "--config", "[1]", "--", "true"], 1, "--config must be a JSON object"),
        (["plugin", "probe"], 2, "the following arguments are required: command"),
        (["run"], 2, "the following arguments are required: job"),
        (["run", str(bad_job)], 2, 'no plugin is configured for driver "nosuch"'),
        (["nosuch"], 2, "invalid choice: 'nosuch'"),
    ]
    for args, code, text in table:
        done = cli(*args)
        shown = " ".join(a.replace(str(tmp_path), "$TMP") for a in args)
        assert done.returncode == code, f"driversdk {shown}: {done.stdout}{done.stderr}"
        assert text in done.stdout + done.stderr, f"driversdk {shown}: {done.stdout}{done.stderr}"
        assert "Traceback" not in done.stderr, shown
        if code == 1 and done.stderr:
            assert done.stderr.count("\n") == 1, f"one sentence: {done.stderr}"


# --- logs -n ---------------------------------------------------------------------------------------


@pytest.fixture
def rotated(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Rotated stdout files with a line spanning two files, a newest file without a final newline,
    and entries a task could plant: a symlink to a host file, a fifo, a hard link."""
    data = tmp_path / "data"
    logs = make_state(data, state="failed")
    secret = tmp_path / "host-secret"
    secret.write_text("SECRET\n")
    (logs / "web.stdout.2").symlink_to(secret)
    (logs / "web.stdout.3").write_text("a\nb\nc")
    (logs / "web.stdout.4").write_text("c-end\nd\n")
    os.link(secret, logs / "web.stdout.5")
    (logs / "web.stdout.6").write_text("e\nf")
    os.mkfifo(logs / "web.stdout.7")
    (logs / "web.stderr.0").write_text("not stdout\n")
    yield data, logs


ALL = "a\nb\ncc-end\nd\ne\nf"


@pytest.mark.parametrize(
    ("count", "expected"),
    [("0", ""), ("1", "f"), ("2", "e\nf"), ("3", "d\ne\nf"), ("4", "cc-end\nd\ne\nf"), ("6", ALL), ("100", ALL)],
)
def test_logs_tail_over_rotated_files(rotated: tuple[Path, Path], count: str, expected: str) -> None:
    data, _ = rotated
    done = cli("logs", "web", "-n", count, "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
    assert cli("logs", "web", "--tail", count, "--data-dir", str(data)).stdout == expected


def test_logs_reads_only_regular_files_with_one_name(rotated: tuple[Path, Path]) -> None:
    data, _ = rotated
    done = cli("logs", "web", "--data-dir", str(data))  # would hang on the fifo if it opened it blocking
    assert done.returncode == 0, done.stderr
    assert done.stdout == ALL
    assert "SECRET" not in done.stdout


def test_tail_with_a_trailing_newline_and_an_empty_newest_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    logs = make_state(data, state="failed")
    (logs / "web.stdout.0").write_text("1\n2\n")
    (logs / "web.stdout.1").write_text("3\n")
    (logs / "web.stdout.2").write_text("")
    assert cli("logs", "web", "-n", "2", "--data-dir", str(data)).stdout == "2\n3\n"


def test_a_symlinked_logs_dir_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    logs = make_state(data, state="failed")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "web.stdout.0").write_text("SECRET\n")
    logs.rmdir()
    logs.symlink_to(elsewhere)
    done = cli("logs", "web", "--data-dir", str(data))
    assert done.returncode == 1
    assert done.stderr == (
        f'error: "logs" in {logs.parent} is a symlink or not a directory (the task can write there); '
        "its logs are not read through it\n"
    )


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(alphabet="ab\n", max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=4),
    count=st.integers(min_value=0, max_value=12),
    block=st.integers(min_value=1, max_value=5),
)
def test_last_lines_is_the_tail_of_the_joined_stream(text: str, cuts: list[int], count: int, block: int) -> None:
    """Any split of a stream into files, read backwards in blocks of any size: the last ``count``
    lines are those of the joined text (a final line without a newline counts)."""
    edges = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp, "alloc", "alloc", "logs")
        logs.mkdir(parents=True)
        for index, (start, end) in enumerate(itertools.pairwise(edges)):
            (logs / f"web.stdout.{index}").write_text(text[start:end])
        saved = logtail.BLOCK
        logtail.BLOCK = block
        try:
            reader = logtail.LogDir.open(str(logs.parent.parent), "web", "stdout")
            assert reader is not None
            got, follower = logtail.last_lines(reader, count)
            follower.close()
            reader.close()
        finally:
            logtail.BLOCK = saved
    lines = text.splitlines(keepends=True)
    assert got.decode() == "".join(lines[max(0, len(lines) - count) :] if count else [])


# --- logs -f ---------------------------------------------------------------------------------------


def read_until(proc: subprocess.Popen[bytes], expected: bytes, seen: bytearray, timeout: float = 30) -> None:
    """Read the follower's stdout until ``expected`` has arrived (or fail after ``timeout``)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    while expected not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{expected!r} never arrived; got {bytes(seen)!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"the follower exited before {expected!r}; got {bytes(seen)!r}"
            seen += chunk


def blocked_in_select(pid: int) -> str:
    """The kernel function the process sleeps in, once it sleeps in select/poll."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        if state == "S" and ("select" in wchan or "poll" in wchan):
            return wchan
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never slept in select/poll (last: {state} {wchan})")


def inotify_inodes(pid: int) -> set[int]:
    """Inodes the process watches through inotify, from /proc/<pid>/fdinfo."""
    inodes: set[int] = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            text = info.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("inotify wd:"):
                fields = dict(f.split(":", 1) for f in line.split()[1:])
                inodes.add(int(fields["ino"], 16))
    return inodes


def test_logs_follow_appends_and_rotation_then_exits_when_the_task_ends(tmp_path: Path) -> None:
    data = tmp_path / "data"
    logs = make_state(data)
    (logs / "web.stdout.0").write_text("old-1\nold-2\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "driversdk.cli", "logs", "web", "-f", "-n", "1", "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    seen = bytearray()
    try:
        read_until(proc, b"old-2\n", seen)
        # It waits on an inotify watch of the logs dir, asleep in select: no sleep loop.
        blocked_in_select(proc.pid)
        assert logs.stat().st_ino in inotify_inodes(proc.pid)
        with open(logs / "web.stdout.0", "a") as fh:
            fh.write("appended\npartial")
        read_until(proc, b"appended\npartial", seen)
        blocked_in_select(proc.pid)
        (logs / "web.stdout.1").write_text("-rest\nrotated\n")  # the line spans the rotation
        read_until(proc, b"partial-rest\nrotated\n", seen)
        assert proc.poll() is None, "the task still runs: -f keeps following"
        finish(data)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    assert proc.stdout is not None and proc.stderr is not None
    seen += proc.stdout.read()
    assert bytes(seen) == b"old-2\nappended\npartial-rest\nrotated\n"
    assert proc.stderr.read() == b""


def test_follow_ends_while_the_collector_lives_on(tmp_path: Path) -> None:
    """The collector of an ended task may outlive it (the run stops it with the allocation): -f
    reads what it still copies, then returns once the files are quiet, not when it exits."""
    collector = subprocess.Popen(["sleep", "300"])
    try:
        data = tmp_path / "data"
        logs = make_state(data, logmon_pid=collector.pid)
        (logs / "web.stdout.0").write_text("before\n")
        proc = subprocess.Popen(
            [sys.executable, "-m", "driversdk.cli", "logs", "web", "-f", "--data-dir", str(data)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        seen = bytearray()
        try:
            read_until(proc, b"before\n", seen)
            finish(data)
            with open(logs / "web.stdout.0", "a") as fh:
                fh.write("last words\n")
            assert proc.wait(timeout=30) == 0
        finally:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        assert bytes(seen) + proc.stdout.read() == b"before\nlast words\n"
        assert collector.poll() is None
    finally:
        collector.kill()
        collector.wait()


FOLLOWER = """
import sys
from driversdk import logtail
from driversdk.agent.state.runstate import RunState

data, alloc = sys.argv[1], sys.argv[2]
state = RunState(data)
logs = logtail.LogDir.open(alloc, "web", "stdout")
def write(chunk):
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
def running():
    return [r.state for r in state.tasks()] == ["running"]
# An hour between liveness checks: within this test only inotify can wake the follower.
logtail.follow(logtail.Follower(logs), write, running, recheck=3600)
"""


def test_follow_is_woken_by_inotify_alone(tmp_path: Path) -> None:
    """The proof that data does not arrive by polling, without measuring time: the follower's only
    timer (its liveness check of the run state) is an hour long, yet an append and a rotation each
    reach it within the 30 s the test waits, while it sleeps in select between them. Nothing but an
    inotify event can have woken it. The CLI runs the same loop with a 1 s liveness timer."""
    data = tmp_path / "data"
    logs = make_state(data)
    (logs / "web.stdout.0").write_text("")
    proc = subprocess.Popen(
        [sys.executable, "-c", FOLLOWER, str(data), str(logs.parent.parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    seen = bytearray()
    try:
        blocked_in_select(proc.pid)
        with open(logs / "web.stdout.0", "a") as fh:
            fh.write("one\n")
        read_until(proc, b"one\n", seen)
        blocked_in_select(proc.pid)
        (logs / "web.stderr.0").write_text("other kind\n")  # not this follower's: it sleeps on
        (logs / "web.stdout.1").write_text("two\n")
        read_until(proc, b"one\ntwo\n", seen)
        blocked_in_select(proc.pid)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    assert proc.stderr is not None
    assert bytes(seen) == b"one\ntwo\n", proc.stderr.read()
