"""Allocation updates move the agent's change index in batches, as a Nomad client syncs them.

A blocking query on a job's allocations (``?index=N``) wakes when the index passes N and reads the
whole list again. While a thousand allocations start, their events come several thousand at a
time; moving the index after each one woke every waiting client after each one. Nomad's client
sends allocation updates to its servers once per ``allocSyncIntv`` (200 ms), so a waiting client
sees them in a few batches a second; the agent's index moves the same way. Job registrations and
stops are not batched.
"""

from __future__ import annotations

from pathlib import Path

from driversdk.agent.agent import ALLOC_SYNC_INTERVAL, Agent
from driversdk.agent.events import RunEvent
from driversdk.agent.settings import AgentSettings
from driversdk.jobspec.clientconfig import ClientConfig


def _agent(tmp_path: Path) -> Agent:
    client = ClientConfig()
    client.data_dir = str(tmp_path / "data")
    return Agent(AgentSettings(client=client), log=lambda _line: None)


def test_a_burst_of_allocation_updates_moves_the_index_once_now_and_once_at_the_end(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    before = agent.index
    for n in range(50):
        agent.emit(RunEvent("task", f"event {n}", job="web", alloc_id=f"alloc-{n % 5}", task="t", type="Started"))
    burst = agent.index
    assert burst - before <= 2, "at once for the first update, then batched (were 50 moves)"
    # The updates after the first are not lost: the index moves for them when the period ends.
    after = agent.wait_change(burst, ALLOC_SYNC_INTERVAL * 20)
    assert after == burst + 1
    assert agent.wait_change(after, ALLOC_SYNC_INTERVAL * 3) == after, "one move for the whole batch"


def test_an_update_after_a_quiet_period_and_a_registration_move_it_at_once(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    agent.emit(RunEvent("task", "first", job="web", alloc_id="a", task="t", type="Started"))
    first = agent.index
    agent.wait_change(first, ALLOC_SYNC_INTERVAL * 3)  # nothing pending: returns after the wait
    assert agent.index == first
    agent.emit(RunEvent("task", "later", job="web", alloc_id="a", task="t", type="Terminated"))
    assert agent.index == first + 1, "the first update after a quiet period is seen at once"
    agent.bump()  # a job registered or stopped
    assert agent.index == first + 2
