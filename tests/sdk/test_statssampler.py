"""The batch sampler behind TaskStats streams, in process, with the make-believe streams driver.

Streams of one interval whose samples fall due together are sampled by one pool job; each must
still get a fresh sample of its own task, a failure must end only its own stream, and a stream
that leaves (queued, or while its batch is on the pool) must leave nothing behind.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from driversdk.errors import TaskNotFoundError
from driversdk.model import TaskConfig, TaskStats
from driversdk.statssampler import StatsSampler

PLUGINS = Path(__file__).resolve().parent / "plugins"
PATIENCE = 60.0


@pytest.fixture
def streams_driver(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(PLUGINS))
    return importlib.import_module("streams_driver")


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(1, thread_name_prefix="test-sample")
    yield executor
    executor.shutdown(wait=True)


def _start(driver: Any, *names: str) -> None:
    for name in names:
        driver.start_task(TaskConfig(id=name, name=name))


def test_each_stream_of_a_batch_gets_a_fresh_sample_of_its_own_task(
    streams_driver: Any, pool: ThreadPoolExecutor
) -> None:
    driver = streams_driver.StreamsDriver(watch=True)
    names = [f"t{i}" for i in range(20)]
    _start(driver, *names)

    async def run() -> None:
        sampler = StatsSampler(lambda: driver, pool, workers=1)
        streams = {name: sampler.open(name, 3600.0) for name in names}
        # Asked for in one loop turn: one slot, one job on the one worker.
        answers = await asyncio.wait_for(asyncio.gather(*(s.next() for s in streams.values())), PATIENCE)
        for name, answer in zip(names, answers, strict=True):
            assert answer is not None
            assert answer.stats.id == name and answer.stats.agg_resource_usage.memory.rss == 1
        # A sample is taken when asked for, never reused: t0, sampled once more meanwhile, answers
        # a new stream with its third.
        driver.task_stats("t0")
        another = sampler.open("t0", 3600.0)
        again = await asyncio.wait_for(another.next(), PATIENCE)
        assert again is not None and again.stats.agg_resource_usage.memory.rss == 3
        another.close()
        for stream in streams.values():
            stream.close()
        assert sampler.clocks() == 0

    asyncio.run(run())


def test_a_failing_task_ends_only_its_own_stream(streams_driver: Any, pool: ThreadPoolExecutor) -> None:
    driver = streams_driver.StreamsDriver(watch=True)
    _start(driver, "here")

    async def run() -> None:
        sampler = StatsSampler(lambda: driver, pool, workers=1)
        missing, here = sampler.open("gone", 3600.0), sampler.open("here", 3600.0)
        failed, answered = await asyncio.wait_for(
            asyncio.gather(missing.next(), here.next(), return_exceptions=True), PATIENCE
        )
        assert isinstance(failed, TaskNotFoundError) and "gone" in str(failed)
        assert not isinstance(answered, BaseException) and answered is not None
        assert answered.stats.id == "here"
        # An exited task answers None: its stream ends.
        driver.stop_task("here", 1.0, "")
        assert await asyncio.wait_for(sampler.open("here", 3600.0).next(), PATIENCE) is None
        missing.close()
        here.close()

    asyncio.run(run())


def test_a_stream_cancelled_while_queued_leaves_nothing_behind(streams_driver: Any, pool: ThreadPoolExecutor) -> None:
    driver = streams_driver.StreamsDriver(watch=True)
    _start(driver, "t")

    async def run() -> None:
        sampler = StatsSampler(lambda: driver, pool, workers=1)
        stream = sampler.open("t", 3600.0)
        assert await asyncio.wait_for(stream.next(), PATIENCE) is not None
        # The next sample is due an interval (an hour) on: queued, with the clock's timer armed.
        waiting = asyncio.ensure_future(stream.next())
        await asyncio.sleep(0)
        assert sampler.pending() == 1 and sampler.clocks() == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert sampler.pending() == 0
        stream.close()
        assert sampler.clocks() == 0

    asyncio.run(run())


def test_a_stream_cancelled_mid_batch_is_skipped_and_the_others_answered(
    streams_driver: Any, pool: ThreadPoolExecutor
) -> None:
    entered, gate = threading.Event(), threading.Event()

    class Gated(streams_driver.StreamsDriver):  # type: ignore[misc]  # a module loaded at run time
        """Task "slow" takes its sample only once the test opens the gate."""

        def task_stats(self, task_id: str) -> TaskStats | None:
            if task_id == "slow":
                entered.set()
                assert gate.wait(PATIENCE)
            stats: TaskStats | None = super().task_stats(task_id)
            return stats

    driver = Gated(watch=True)
    _start(driver, "slow", "left", "stays")

    async def run() -> None:
        sampler = StatsSampler(lambda: driver, pool, workers=1)
        slow, left, stays = (sampler.open(name, 3600.0) for name in ("slow", "left", "stays"))
        # One batch, in this order, on the one worker; it stops at "slow" until the gate opens.
        asked = [asyncio.ensure_future(s.next()) for s in (slow, left, stays)]
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, entered.wait, PATIENCE)
        asked[1].cancel()  # "left" leaves while its batch is on the pool
        with pytest.raises(asyncio.CancelledError):
            await asked[1]
        gate.set()
        first, last = await asyncio.wait_for(asyncio.gather(asked[0], asked[2]), PATIENCE)
        assert first is not None and first.stats.id == "slow"
        assert last is not None and last.stats.id == "stays"
        assert sampler.pending() == 0
        for stream in (slow, left, stays):
            stream.close()
        assert sampler.clocks() == 0

    asyncio.run(run())
    # The job saw that "left" had gone and did not sample it.
    assert driver._tasks["left"].samples == 0
