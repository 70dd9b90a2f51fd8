"""Garbage collection of terminal allocations (driversdk.agent.allocgc) through the real CLI, on
alloc dirs and state rows made by real runs of raw_exec tasks: Nomad's gc_max_allocs at the start
of a run, `driversdk system gc`, and an alloc dir its tasks turned hostile (a symlink to a host
dir, a bind mount left in it)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agent.runs import ROOT


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driversdk.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )


def _job(tmp: Path, name: str, count: int, command: str = "true") -> Path:
    path = tmp / f"{name}.hcl"
    path.write_text(
        f'job "{name}" {{\n  type = "batch"\n  group "g" {{\n    count = {count}\n    task "t" {{\n'
        f'      driver = "raw_exec"\n      kill_timeout = "2s"\n      config {{\n        command = "/bin/sh"\n'
        f'        args = ["-c", "{command}"]\n      }}\n    }}\n  }}\n}}\n'
    )
    return path


def _client(tmp: Path, gc: str = "") -> Path:
    path = tmp / "client.hcl"
    path.write_text(
        f'data_dir = "{tmp / "data"}"\nclient {{\n{gc}\n}}\n'
        f'plugin "raw_exec" {{\n  config {{\n    enabled = true\n    state_dir = "{tmp / "raw-state"}"\n  }}\n}}\n'
    )
    return path


def _allocs(tmp: Path) -> list[tuple[str, str, str]]:
    """(alloc id, job, state) of every allocation state.db knows, oldest update first."""
    with sqlite3.connect(tmp / "data" / "state.db") as db:
        rows = db.execute("SELECT alloc_id, job, state FROM run_allocs ORDER BY updated, rowid").fetchall()
    return [(str(a), str(j), str(s)) for a, j, s in rows]


def _dirs(tmp: Path) -> set[str]:
    return {p.name for p in (tmp / "data" / "allocs").iterdir()}


def _run(job: Path, client: Path) -> subprocess.CompletedProcess[str]:
    done = _cli("run", str(job), "--client", str(client))
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_a_run_collects_the_oldest_terminal_allocations_over_gc_max_allocs(tmp_path: Path) -> None:
    client = _client(tmp_path)
    _run(_job(tmp_path, "many", 55), client)
    first = _allocs(tmp_path)
    assert len(first) == 55 and {s for *_, s in first} == {"stopped"}
    assert _dirs(tmp_path) == {a for a, *_ in first}
    # A new allocation: Nomad's client makes room for it, the allocations over longest first.
    done = _run(_job(tmp_path, "one", 1), client)
    after = _allocs(tmp_path)
    assert len(after) == 50, after
    gone = [a for a, *_ in first[:6]]
    assert [a for a, *_ in after[:49]] == [a for a, *_ in first[6:]], "the oldest six were collected, in order"
    assert _dirs(tmp_path) == {a for a, *_ in after}
    for alloc in gone:
        assert f'garbage collected allocation {alloc[:8]} of job "many"' in done.stdout, done.stdout
    assert "over the limit (50)" in done.stdout
    # Under the limit, nothing more goes.
    _run(_job(tmp_path, "one", 1), client)
    assert len(_allocs(tmp_path)) == 50


def test_gc_max_allocs_of_the_client_config(tmp_path: Path) -> None:
    client = _client(tmp_path, gc="  gc_max_allocs = 3")
    _run(_job(tmp_path, "many", 4), client)
    first = [a for a, *_ in _allocs(tmp_path)]
    _run(_job(tmp_path, "one", 1), client)
    assert [a for a, *_ in _allocs(tmp_path)][:2] == first[2:]
    assert len(_dirs(tmp_path)) == 3


def test_system_gc_collects_every_terminal_allocation_and_never_a_running_one(tmp_path: Path) -> None:
    client = _client(tmp_path)
    _run(_job(tmp_path, "done", 3), client)
    ended = {a for a, *_ in _allocs(tmp_path)}
    ready = tmp_path / "ready"
    job = _job(tmp_path, "long", 1, command=f"touch {ready}; exec sleep 300")
    run = subprocess.Popen(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert run.poll() is None and time.monotonic() < deadline, "the long task never started"
            time.sleep(0.1)
        running = next(a for a, j, _ in _allocs(tmp_path) if j == "long")
        logs = tmp_path / "data" / "allocs" / running / "alloc" / "logs"
        before = sorted(p.name for p in logs.iterdir())
        done = _cli("system", "gc", "--client", str(client))
        assert done.returncode == 0, done.stderr
        assert "3 terminal allocation(s) garbage collected, 0 kept" in done.stdout
        assert _dirs(tmp_path) == {running}
        assert [(a, s) for a, _, s in _allocs(tmp_path)] == [(running, "running")]
        assert sorted(p.name for p in logs.iterdir()) == before, "the running allocation's dir is untouched"
        assert not ended & _dirs(tmp_path)
    finally:
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=120)
    assert run.returncode == 1, out
    # Stopped by Ctrl-C, it is terminal now: the next collection takes it, and nothing is left.
    done = _cli("system", "gc", "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 0 and _dirs(tmp_path) == set() and _allocs(tmp_path) == []
    assert not subprocess.run(["pgrep", "-f", str(ready)], capture_output=True).stdout


def test_a_symlink_in_an_alloc_dir_is_removed_as_a_link_never_followed(tmp_path: Path) -> None:
    client = _client(tmp_path)
    _run(_job(tmp_path, "done", 1), client)
    (alloc,) = _dirs(tmp_path)
    host = tmp_path / "host"
    (host / "sub").mkdir(parents=True)
    (host / "sub" / "precious").write_text("keep me")
    alloc_dir = tmp_path / "data" / "allocs" / alloc
    # What a task could leave: links to a host dir and a host file, in its dirs and at the top.
    (alloc_dir / "alloc" / "data" / "escape").symlink_to(host)
    (alloc_dir / "t" / "local" / "file").symlink_to(host / "sub" / "precious")
    (alloc_dir / "top").symlink_to(host / "sub")
    done = _cli("system", "gc", "--client", str(client))
    assert done.returncode == 0, done.stderr
    assert not alloc_dir.exists() and not os.path.lexists(alloc_dir)
    assert (host / "sub" / "precious").read_text() == "keep me"
    assert sorted(p.name for p in host.iterdir()) == ["sub"]


def _mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.mark.root
def test_a_bind_mount_left_in_an_alloc_dir_is_not_crossed(tmp_path: Path) -> None:
    client = _client(tmp_path)
    _run(_job(tmp_path, "done", 1), client)
    (alloc,) = _dirs(tmp_path)
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("keep me")
    target = tmp_path / "data" / "allocs" / alloc / "alloc" / "data" / "mnt"
    target.mkdir()
    subprocess.run(["mount", "--bind", str(host), str(target)], check=True)
    try:
        done = _cli("system", "gc", "--client", str(client))
        assert done.returncode == 1, done.stdout
        assert (
            f'error: allocation {alloc[:8]} of job "done" was not garbage collected: {target} is still mounted in its '
            "alloc dir; unmount it (umount) and run `driversdk system gc`\n"
        ) == done.stderr
        assert (host / "precious").read_text() == "keep me"
        assert (target / "precious").exists() and _dirs(tmp_path) == {alloc}
        assert [a for a, *_ in _allocs(tmp_path)] == [alloc], "kept: its state row stays too"
    finally:
        if _mounted(target):
            subprocess.run(["umount", str(target)], check=True)
    done = _cli("system", "gc", "--client", str(client))
    assert done.returncode == 0 and _dirs(tmp_path) == set()
    assert (host / "precious").read_text() == "keep me"


@pytest.mark.root
def test_a_mount_made_after_the_collection_read_mountinfo_is_still_not_crossed(tmp_path: Path) -> None:
    """A collection reads the mount points once (not once per alloc dir): one mounted after that
    read is refused by the removal itself, which checks each directory's mount as it descends."""
    from driversdk.agent.allocgc import _Refused, _remove_at

    allocs = tmp_path / "allocs"
    target = allocs / "a1" / "alloc" / "data" / "mnt"
    target.mkdir(parents=True)
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("keep me")
    subprocess.run(["mount", "--bind", str(host), str(target)], check=True)
    try:
        with pytest.raises(_Refused, match="is a mount point in its alloc dir"):
            _remove_at(str(allocs), "a1")
        assert (host / "precious").read_text() == "keep me"
    finally:
        if _mounted(target):
            subprocess.run(["umount", str(target)], check=True)
