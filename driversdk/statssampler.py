"""TaskStats streams sampled in batches: one pool job and one event-loop wake-up for many streams.

A host keeps a TaskStats stream open for every running task, each asking for a sample every
``collection_interval`` (Nomad: 1 s). Sampling each stream on its own costs, per sample, a
thread-pool hop and a wake-up of the event loop, and with a thousand tasks those alone kept the
plugin's one interpreter busy enough to slow every unary call behind it. Here the streams that
asked for the same interval share a clock of ``SLOTS_PER_INTERVAL`` slots per interval: each
stream's next sample falls in the last slot at or before its due time (a slot early at most,
never late), and the streams whose samples fall in one slot are sampled together by a few jobs
on the pool, each job sampling its share of the streams one after another and handing all their
answers back to the loop at once.

Every stream still gets a fresh sample of its own task at least once per interval: the batch only
changes which thread takes the sample and how the answers travel, not what is read or when it is
due. A stream that is closed (the host cancelled it) leaves its slot at once; a sample already on
the pool for it is taken but its answer dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, TypeAlias

from driversdk.pb import driver_pb2

if TYPE_CHECKING:
    from driversdk.driver import DriverPlugin

# Slots per interval: the granularity at which streams of one interval are grouped. A stream is
# sampled up to interval/SLOTS early (never late), and a thousand 1 s streams make ten batches
# of about a hundred a second rather than one burst of a thousand that would hold the loop.
SLOTS_PER_INTERVAL = 10


class _Request:
    """One stream's pending sample: its task, and the future the stream awaits."""

    __slots__ = ("closed", "future", "task_id")

    def __init__(self, task_id: str, future: asyncio.Future[driver_pb2.TaskStatsResponse | None]) -> None:
        self.task_id = task_id
        self.future = future
        # Set on the loop when the stream leaves; a pool job reads it to skip a sample nobody awaits.
        self.closed = False


Outcome: TypeAlias = tuple[_Request, driver_pb2.TaskStatsResponse | None, Exception | None]


class _Clock:
    """The streams of one interval: their pending samples by slot, and one timer for the earliest."""

    def __init__(self, sampler: StatsSampler, interval: float, loop: asyncio.AbstractEventLoop) -> None:
        self.sampler = sampler
        self.interval = interval
        self.slot_seconds = interval / SLOTS_PER_INTERVAL
        self.loop = loop
        self.pending: dict[int, dict[_Request, None]] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.timer_slot = 0
        self.streams = 0

    def slot_now(self) -> int:
        return math.floor(self.loop.time() / self.slot_seconds)

    def add(self, slot: int, request: _Request) -> None:
        """Queue ``request`` for ``slot``; a slot whose time has passed is sampled on the next loop turn."""
        self.pending.setdefault(slot, {})[request] = None
        # The timer always waits for the earliest pending slot.
        if self.timer is None or slot < self.timer_slot:
            self._arm(slot)

    def discard(self, slot: int, request: _Request) -> None:
        waiting = self.pending.get(slot)
        if waiting is not None:
            waiting.pop(request, None)
            if not waiting:
                del self.pending[slot]
        if not self.pending and self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _arm(self, slot: int) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer_slot = slot
        # A time already past runs the callback on the loop's next turn.
        self.timer = self.loop.call_at(slot * self.slot_seconds, self._fire)

    def _fire(self) -> None:
        self.timer = None
        slot = self.timer_slot
        due = self.pending.pop(slot, None)
        if self.pending:
            self._arm(min(self.pending))
        if due:
            self.sampler.dispatch(list(due))


class StatsStream:
    """One TaskStats stream's samples: ``await next()`` for each; ``close()`` when the stream ends."""

    def __init__(self, clock: _Clock, task_id: str) -> None:
        self._clock = clock
        self._task_id = task_id
        self._slot: int | None = None  # the slot of the last sample asked for
        clock.streams += 1

    async def next(self) -> driver_pb2.TaskStatsResponse | None:
        """The task's next sample (None once the task has exited); the first one at once.

        A driver's failure is raised here, for the stream to end with as a status."""
        clock = self._clock
        request = _Request(self._task_id, clock.loop.create_future())
        now = clock.slot_now()
        # The first sample at once; each later one a whole interval of slots after the last, or
        # at once if that slot has passed already (the host was slow to take the last answer).
        slot = now if self._slot is None else max(self._slot + SLOTS_PER_INTERVAL, now)
        self._slot = slot
        clock.add(slot, request)
        try:
            return await request.future
        finally:
            if not request.future.done() or request.future.cancelled():  # the stream was cancelled
                request.closed = True
                clock.discard(slot, request)

    def close(self) -> None:
        """The stream ended (its last request already left its slot): the clock goes with its last stream."""
        self._clock.streams -= 1
        if self._clock.streams == 0:
            self._clock.sampler.forget(self._clock)


class StatsSampler:
    """The TaskStats streams of one plugin, sampled by slot on ``pool`` (``workers`` threads)."""

    def __init__(self, driver: Callable[[], DriverPlugin], pool: Executor, workers: int) -> None:
        self._driver = driver
        self._pool = pool
        self._workers = workers
        self._clocks: dict[float, _Clock] = {}

    def open(self, task_id: str, interval: float) -> StatsStream:
        """A stream of ``task_id``'s samples, at least one every ``interval`` seconds (> 0)."""
        clock = self._clocks.get(interval)
        if clock is None:
            clock = self._clocks[interval] = _Clock(self, interval, asyncio.get_running_loop())
        return StatsStream(clock, task_id)

    def forget(self, clock: _Clock) -> None:
        if self._clocks.get(clock.interval) is clock:
            del self._clocks[clock.interval]
        if clock.timer is not None:
            clock.timer.cancel()
            clock.timer = None

    def pending(self) -> int:
        """Samples queued and not yet on the pool, over every clock (what closed streams must not leave)."""
        return sum(len(due) for clock in self._clocks.values() for due in clock.pending.values())

    def clocks(self) -> int:
        return len(self._clocks)

    def dispatch(self, requests: list[_Request]) -> None:
        """Sample ``requests`` on the pool: split over the workers, so a driver whose sample waits
        on I/O (a daemon's API) has one sample in flight per worker, not one per batch."""
        loop = asyncio.get_running_loop()
        jobs = min(self._workers, len(requests))
        share = -(-len(requests) // jobs)
        for start in range(0, len(requests), share):
            self._pool.submit(self._sample, requests[start : start + share], loop)

    def _sample(self, requests: list[_Request], loop: asyncio.AbstractEventLoop) -> None:
        """On a pool worker: each request's own task sampled now, the answers sent back at once."""
        from driversdk import convert

        outcomes: list[Outcome] = []
        try:
            driver = self._driver()
        except Exception as err:
            outcomes = [(request, None, err) for request in requests]
        else:
            for request in requests:
                if request.closed:
                    continue
                try:
                    stats = driver.task_stats(request.task_id)
                    response = None
                    if stats is not None:
                        response = driver_pb2.TaskStatsResponse(stats=convert.task_stats_to_proto(stats))
                except Exception as err:  # this stream ends with it as a status; the others go on
                    outcomes.append((request, None, err))
                else:
                    outcomes.append((request, response, None))
        # A closed loop means the plugin is exiting: nobody is left to answer.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_deliver, outcomes)


def _deliver(outcomes: list[Outcome]) -> None:
    for request, response, error in outcomes:
        if request.future.done():  # its stream was cancelled meanwhile
            continue
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(response)


__all__ = ["SLOTS_PER_INTERVAL", "StatsSampler", "StatsStream"]
