"""driversdk.taskkit: the task map, owner records and the streaming exec bridge both process
drivers share (their own tests drive them through real plugins; these pin the kit's rules)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from driversdk.driver import ExecSession, TerminalSize
from driversdk.errors import TaskNotFoundError
from driversdk.model import ExitResult
from driversdk.taskkit import owner as kit
from driversdk.taskkit.owner import OwnedRecord, Phase, ProcessIdentity, owner_fields
from driversdk.taskkit.streaming import exit_result, run_session
from driversdk.taskkit.taskmap import TaskMap


@dataclass(frozen=True)
class Rec(OwnedRecord):
    name: str
    task_dir: str
    phase: Phase
    owner_pid: int
    owner_start_time: int
    since: float

    @property
    def key(self) -> str:
        return self.name

    @property
    def path(self) -> str:
        return kit.record_path(self.task_dir)

    @classmethod
    def decode(cls, data: bytes) -> Rec:
        raw = json.loads(data)
        return cls(name=str(raw["name"]), task_dir=str(raw["task_dir"]), **owner_fields(raw))


def _dead() -> ProcessIdentity:
    proc = subprocess.Popen(["true"])
    identity = ProcessIdentity.of(proc.pid)
    proc.wait()
    assert identity is not None
    return identity


def _rec(tmp_path: Path, phase: Phase = "starting", who: ProcessIdentity | None = None, since: float = 0.0) -> Rec:
    who = who or ProcessIdentity.current()
    return Rec("t1", str(tmp_path / "tasks" / "t1"), phase, who.pid, who.start_time, since)


def test_records_are_created_once_replaced_atomically_and_private(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    record = _rec(tmp_path).moved_to("starting")
    assert kit.create(record)
    assert not kit.create(record.moved_to("started"))  # never overwritten
    assert kit.load(record.path, Rec.decode) == record
    kit.save(record.moved_to("started"))
    loaded = kit.load(record.path, Rec.decode)
    assert loaded is not None and loaded.phase == "started" and loaded.owner == ProcessIdentity.current()
    assert os.stat(record.path).st_mode & 0o777 == 0o600
    assert kit.list_records(str(tmp_path / "tasks")) == [record.path]  # no temp file left
    kit.remove(record.task_dir)
    assert kit.load(record.path, Rec.decode) is None
    kit.remove(record.task_dir)  # again: nothing to do


def test_a_record_with_an_unknown_phase_is_refused(tmp_path: Path) -> None:
    raw = json.loads(_rec(tmp_path).encode())
    raw["phase"] = "running"
    with pytest.raises(ValueError, match="unknown phase 'running'"):
        Rec.decode(json.dumps(raw).encode())


def test_a_record_write_never_follows_a_planted_temp_symlink(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    record = _rec(tmp_path)
    temp = tmp_path / "tasks" / f".t1.json.{os.getpid()}.tmp"
    temp.symlink_to(victim)
    with pytest.raises(OSError):
        kit.create(record)
    assert victim.read_text() == "keep"


def test_orphan_rule(tmp_path: Path) -> None:
    now = time.time()
    dead, live = _dead(), ProcessIdentity.current()
    assert kit.is_orphan(_rec(tmp_path, "starting", dead, now - 600), tracked=set(), grace=300, now=now)
    assert kit.is_orphan(_rec(tmp_path, "destroying", dead, now - 600), tracked=set(), grace=300, now=now)
    assert not kit.is_orphan(_rec(tmp_path, "starting", dead, now - 1), tracked=set(), grace=300, now=now)
    assert not kit.is_orphan(_rec(tmp_path, "starting", live, now - 600), tracked=set(), grace=300, now=now)
    assert not kit.is_orphan(_rec(tmp_path, "starting", dead, now - 600), tracked={"t1"}, grace=300, now=now)
    assert not kit.is_orphan(_rec(tmp_path, "started", dead, now - 600), tracked=set(), grace=300, now=now)


def test_replace_abandoned_releases_a_dead_start_but_never_a_live_one(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    released: list[Rec] = []

    def release(record: Rec) -> None:  # as a driver's: remove what the task left, its record last
        released.append(record)
        kit.remove(record.task_dir)

    dead_start = _rec(tmp_path, "starting", _dead(), 1.0)
    assert kit.create(dead_start)
    mine = _rec(tmp_path).moved_to("starting")
    assert kit.replace_abandoned(mine, str(tmp_path), Rec.decode, release)
    assert released == [dead_start]
    other = _rec(tmp_path).moved_to("starting")  # owned by a live process (this one)
    assert not kit.replace_abandoned(other, str(tmp_path), Rec.decode, release)
    assert released == [dead_start]
    claimed = kit.claim(mine, str(tmp_path), Rec.decode)
    assert claimed.phase == "started"
    assert kit.load(mine.path, Rec.decode) == claimed


def test_exclusive_lets_one_pass_in_at_a_time(tmp_path: Path) -> None:
    with kit.exclusive(str(tmp_path)) as first:
        assert first
        # flock is per open file description: a second open in this process contends too.
        with kit.exclusive(str(tmp_path)) as second:
            assert not second


def test_periodic_pass_survives_a_failing_pass() -> None:
    calls: queue.Queue[int] = queue.Queue()
    count = 0

    def run_pass() -> None:
        nonlocal count
        count += 1
        calls.put(count)
        if count == 1:
            raise RuntimeError("first pass fails")

    periodic = kit.PeriodicPass("test-pass", run_pass, lambda: 0.01)
    periodic.start()
    try:
        assert calls.get(timeout=30) == 1
        assert calls.get(timeout=30) == 2  # the thread outlived the failure
    finally:
        periodic.stop()


@dataclass
class _Held:
    task: Any


def test_task_map() -> None:
    tasks: TaskMap[_Held] = TaskMap()
    config = type("Cfg", (), {"id": "a"})()
    held = _Held(task=config)
    tasks.put(held)
    assert tasks.has("a") and tasks.get("a") is held and tasks.records() == [held]
    tasks.remove("a")
    tasks.remove("a")
    assert not tasks.has("a")
    with pytest.raises(TaskNotFoundError):
        tasks.get("a")


def test_exit_result_reports_a_signal_as_128_plus_it() -> None:
    assert exit_result(0) == ExitResult(exit_code=0)
    assert exit_result(3) == ExitResult(exit_code=3)
    assert exit_result(-signal.SIGKILL) == ExitResult(exit_code=137, signal=signal.SIGKILL)


class _Session(ExecSession):
    def __init__(self, stdin: list[bytes]) -> None:
        self.task_id = "t"
        self.command = []
        self.tty = False
        self._stdin = list(stdin)
        self.stdout = bytearray()
        self.stderr = bytearray()
        self._lock = threading.Lock()

    def read_stdin(self, timeout: float | None = None) -> bytes | None:
        return self._stdin.pop(0) if self._stdin else None

    def send_stdout(self, data: bytes) -> None:
        with self._lock:
            self.stdout.extend(data)

    def send_stderr(self, data: bytes) -> None:
        with self._lock:
            self.stderr.extend(data)

    def terminal_size(self) -> TerminalSize | None:
        return None

    def on_resize(self, callback: Callable[[TerminalSize], None]) -> None:
        pass

    @property
    def cancelled(self) -> bool:
        return False


def test_run_session_feeds_stdin_streams_both_outputs_and_returns_the_exit() -> None:
    script = (
        "import sys; d = sys.stdin.read(); sys.stdout.write(d.upper()); sys.stderr.write('e' * 200000); sys.exit(4)"
    )
    session = _Session([b"hello ", b"", b"world"])
    result = run_session([sys.executable, "-c", script], session)
    assert result == ExitResult(exit_code=4)
    assert bytes(session.stdout) == b"HELLO WORLD"
    assert bytes(session.stderr) == b"e" * 200000  # every chunk arrived before the return


def test_run_session_reports_a_killed_command() -> None:
    session = _Session([])
    result = run_session(["/bin/sh", "-c", "kill -TERM $$"], session)
    assert result == ExitResult(exit_code=128 + signal.SIGTERM, signal=signal.SIGTERM)


def test_a_pass_releases_each_orphan_and_survives_a_bad_record_or_a_failed_release(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    dead = _dead()

    def orphan(name: str, phase: Phase = "starting", who: ProcessIdentity = dead) -> Rec:
        record = Rec(name, str(tasks / name), phase, who.pid, who.start_time, 0.0)
        assert kit.create(record)
        return record

    orphan("a")
    orphan("b")
    orphan("started", phase="started")  # the host owns it
    orphan("live", who=ProcessIdentity.current())  # its owner runs
    orphan("tracked")
    (tasks / "garbled.json").write_text("{not json")
    stale = tasks / ".a.json.1.tmp"
    stale.write_text("{}")
    os.utime(stale, (0, 0))
    released: list[str] = []

    def release(record: Rec) -> None:
        if record.name == "a":
            raise OSError("device busy")  # logged; the pass goes on
        released.append(record.name)
        kit.remove(record.task_dir)

    removed = kit.release_orphans(str(tasks), Rec.decode, release, tracked={"tracked"}, grace=1.0, now=time.time())
    assert removed == released == ["b"]
    assert sorted(p.name for p in tasks.glob("*.json")) == [
        "a.json",
        "garbled.json",
        "live.json",
        "started.json",
        "tracked.json",
    ]
    assert not stale.exists()  # a record write whose writer died
