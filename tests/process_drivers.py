"""Checks both process drivers (exec, raw_exec) must pass; each driver's tests call them with its
own plugin, config and shell task, so the two stay held to one standard."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from driversdk.driver import DriverPlugin
from driversdk.errors import TaskNotFoundError
from driversdk.model import ExitResult
from driversdk.testing import AllocDir, DriverHarness

TIMEOUT = 60
LOW_SOFT = 1024
Shell = Callable[[str], dict[str, Any]]
ROOT = Path(__file__).resolve().parents[1]
# main before driversdk.taskkit's one supervisor: tasks its plugins started (a shell running runc,
# raw_exec's own launcher, ProcessDriver's signal-forwarding shim) must be recovered by today's.
PRE_KIT_COMMIT = "61c0aa1b2b0a85b0b9ee920647fcb9691ad8cb60"
# The task traps both signals, so every driver reports the same exit whatever its pid 1 rules.
TRAPPING = "trap 'echo usr1' USR1; trap 'echo term; exit 3' TERM; echo ready; while :; do sleep 0.1; done"


def check_watch_exit(driver: DriverPlugin, alloc: AllocDir, task_reads: str, sh: Shell) -> None:
    """watch_exit called in-process as the SDK's server calls it: an unknown task is refused,
    the callback comes once without a thread of its own, and at once after the exit.
    ``task_reads`` is where the task sees the "web" task's local/go (a fifo it blocks on)."""
    with pytest.raises(TaskNotFoundError):
        driver.watch_exit("no-such-task", lambda result: None)
    task = alloc.task_config("web", driver_config=sh(f"read x < {task_reads}; exit 3"))
    go = alloc.path / "web" / "local" / "go"
    os.mkfifo(go)  # the task blocks reading it until the test writes a line
    driver.start_task(task)
    try:
        threads = threading.active_count()
        seen: list[ExitResult] = []
        reported = threading.Event()

        def on_exit(result: ExitResult) -> None:
            seen.append(result)
            reported.set()

        assert driver.watch_exit(task.id, on_exit) is True
        assert threading.active_count() == threads  # the callback waits; no thread does
        assert not seen
        go.write_text("go\n")
        assert reported.wait(TIMEOUT)
        assert seen == [ExitResult(exit_code=3)]
        assert driver.wait_task(task.id) == ExitResult(exit_code=3)
        late: list[ExitResult] = []
        assert driver.watch_exit(task.id, late.append)  # already exited: called at once
        assert late == [ExitResult(exit_code=3)]
    finally:
        driver.destroy_task(task.id, force=True)


@contextlib.contextmanager
def _low_soft_nofile() -> Iterator[int]:
    """Lower this process's soft open-file limit (children inherit it) while the block runs;
    yields the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LOW_SOFT, hard), hard))
    try:
        yield hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def check_tasks_keep_nofile(plugin: list[str], plugin_config: dict[str, Any], allocs: Path, sh: Shell) -> None:
    """The plugin raises its own open-file limit (one pidfd per task it waits for); its tasks get
    the limit it was started with, as Nomad's tasks get the agent's (Go restores it for children)."""
    names = ["first", "second"]
    alloc = AllocDir.create(allocs, tasks=names)
    try:
        with _low_soft_nofile() as hard:
            if hard <= LOW_SOFT:
                pytest.skip(f"the hard open-file limit {hard} leaves nothing to raise")
            harness = DriverHarness(plugin, plugin_config=plugin_config)
        with harness as h:
            pid = h.client.process.pid
            # The first task makes the plugin start its process watcher, which raises the limit.
            for name in names:
                task = alloc.task_config(name, driver_config=sh("ulimit -n; ulimit -Hn"))
                h.start(task)
                assert h.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
                h.client.destroy_task(task.id, force=False)
                h.forget(task.id)
                shown = alloc.wait_for_output(name, b"\n", 30).split()
                assert shown == [str(LOW_SOFT).encode(), str(hard).encode()]
            with open(f"/proc/{pid}/limits") as fh:
                line = next(x for x in fh if x.startswith("Max open files"))
            assert line.split()[3] == str(hard), f"the plugin did not raise its own limit: {line!r}"
    finally:
        alloc.close()


def pre_kit_checkout(base: Path) -> Path:
    """drivers/, driversdk/ and examples/ as of PRE_KIT_COMMIT, for PYTHONPATH."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PRE_KIT_COMMIT, "drivers", "driversdk", "examples"], capture_output=True
    )
    if archive.returncode != 0:
        pytest.skip(f"this checkout has no commit {PRE_KIT_COMMIT} (a shallow clone?)")
    out = base / "pre-kit"
    out.mkdir()
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def check_recovers_a_pre_kit_task(
    old_plugin: list[str], new_plugin: list[str], plugin_config: dict[str, Any], alloc: AllocDir, sh: Shell
) -> None:
    """A task started by the plugin of PRE_KIT_COMMIT, whose handle and supervisor outlive it, is
    recovered, signalled, stopped and destroyed by today's plugin with its real exit code.
    ``old_plugin`` runs with PYTHONPATH on the old checkout (``{old}`` in it is that dir)."""
    old_tree = pre_kit_checkout(alloc.path.parent)
    env = {**os.environ, "PYTHONPATH": str(old_tree)}
    task = alloc.task_config("web", driver_config=sh(TRAPPING))
    argv = [a.replace("{old}", str(old_tree)) for a in old_plugin]
    if argv[1:2] == ["-m"]:  # -m puts the cwd (this checkout) first on sys.path: run the module from the old one
        boot = f"import runpy, sys; sys.path.insert(0, {str(old_tree)!r}); "
        boot += f"runpy.run_module({argv[2]!r}, run_name='__main__')"
        argv = [argv[0], "-c", boot, *argv[3:]]
    old = DriverHarness(argv, plugin_config=plugin_config, env=env)
    try:
        handle = old.start(task)
        alloc.wait_for_output("web", b"ready\n", TIMEOUT)
        assert str(old_tree) in Path(f"/proc/{old.client.process.pid}/cmdline").read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old.client.process.pid, signal.SIGKILL)  # a crash: the task stays, the handle is kept
        old.client.process.kill()
    with DriverHarness(new_plugin, plugin_config=plugin_config) as new:
        client = new.client
        try:
            client.recover_task(handle)
            assert client.inspect_task(task.id).state.name == "RUNNING"
            client.signal_task(task.id, "SIGUSR1")
            alloc.wait_for_output("web", b"usr1\n", TIMEOUT)
            client.stop_task(task.id, timeout=TIMEOUT, signal="SIGTERM")
            assert client.wait_task(task.id, timeout=TIMEOUT) == ExitResult(exit_code=3)
            assert alloc.wait_for_output("web", b"term\n", TIMEOUT).endswith(b"term\n")
        finally:
            client.destroy_task(task.id, force=True)
