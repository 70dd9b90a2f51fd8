"""ExitSlot: a task's exit, set once, awaited by blocking waiters and callbacks."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from driversdk.exits import ExitSlot, supervised_exit
from driversdk.model import ExitResult, TaskConfig

WAIT = 60.0  # generous: nothing here is about speed


def test_set_once_and_later_sets_change_nothing() -> None:
    slot = ExitSlot()
    assert not slot.done and slot.result is None
    assert slot.set(ExitResult(exit_code=3))
    assert not slot.set(ExitResult(exit_code=9))
    assert slot.done and slot.result == ExitResult(exit_code=3)
    assert slot.wait() == ExitResult(exit_code=3)


def test_wait_times_out_with_none_then_returns_the_exit_set_elsewhere() -> None:
    slot = ExitSlot()
    assert slot.wait(timeout=0.01) is None
    setter = threading.Thread(target=slot.set, args=(ExitResult(exit_code=1, signal=9),))
    setter.start()
    assert slot.wait(timeout=WAIT) == ExitResult(exit_code=1, signal=9)
    setter.join()


def test_callbacks_before_and_after_set_each_run_once() -> None:
    slot = ExitSlot()
    seen: list[tuple[str, ExitResult]] = []
    slot.add_callback(lambda r: seen.append(("early", r)))
    assert seen == []
    result = ExitResult(exit_code=0, oom_killed=True)
    slot.set(result)
    slot.add_callback(lambda r: seen.append(("late", r)))  # already set: called at once
    slot.set(ExitResult(exit_code=5))
    assert seen == [("early", result), ("late", result)]


def test_callbacks_run_outside_the_lock() -> None:
    """A callback may use the slot again (a lock held around it would deadlock here)."""
    slot = ExitSlot()
    nested: list[ExitResult | None] = []

    def callback(result: ExitResult) -> None:
        nested.append(slot.wait())
        slot.add_callback(nested.append)

    slot.add_callback(callback)
    setter = threading.Thread(target=slot.set, args=(ExitResult(exit_code=2),), daemon=True)
    setter.start()
    setter.join(WAIT)
    assert not setter.is_alive(), "set() deadlocked running a callback"
    assert nested == [ExitResult(exit_code=2), ExitResult(exit_code=2)]


def test_a_raising_callback_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    slot = ExitSlot()
    seen: list[ExitResult] = []

    def boom(result: ExitResult) -> None:
        raise RuntimeError("waiter is gone")

    slot.add_callback(boom)
    slot.add_callback(seen.append)
    assert slot.set(ExitResult(exit_code=4))
    assert seen == [ExitResult(exit_code=4)]
    assert "exit callback failed" in caplog.text


def test_a_callback_added_after_set_raises_to_its_caller() -> None:
    slot = ExitSlot()
    slot.set(ExitResult())

    def boom(result: ExitResult) -> None:
        raise RuntimeError("raised on the caller's thread")

    with pytest.raises(RuntimeError, match="caller's thread"):
        slot.add_callback(boom)


@dataclass(frozen=True)
class _Status:
    exit_code: int
    signal: int
    finished_at: float


def test_supervised_exit_reads_the_status_and_reports_an_oom_kill_as_nomad_does() -> None:
    task = TaskConfig(id="t1", name="web", alloc_id="a1")
    ended = supervised_exit(task, _Status(137, 9, 1700000000.0), lambda: True)
    assert ended.result == ExitResult(exit_code=137, signal=9, oom_killed=True)
    assert ended.completed_at == datetime.fromtimestamp(1700000000.0, UTC)
    assert ended.event is not None
    assert (ended.event.task_id, ended.event.alloc_id, ended.event.task_name) == ("t1", "a1", "web")
    assert (ended.event.message, ended.event.annotations) == ("OOM Killed", {"oom_killed": "true"})
    plain = supervised_exit(task, _Status(3, 0, 1700000000.0), lambda: False)
    assert plain.result == ExitResult(exit_code=3) and plain.event is None


def test_supervised_exit_without_a_status_is_an_unknown_exit(caplog: pytest.LogCaptureFixture) -> None:
    def never() -> bool:
        raise AssertionError("no status: the cgroup is not asked")

    ended = supervised_exit(TaskConfig(id="t1", name="web"), None, never)
    assert ended.result == ExitResult(exit_code=-1) and ended.event is None
    assert "supervisor of task t1 went away without recording an exit status" in caplog.text
