"""Periodic jobs, launched on schedule as Nomad's periodic dispatcher launches them.

A registered job with a ``periodic`` block (``Periodic`` in the API JSON: ``Specs``/``Spec``,
``ProhibitOverlap``, ``TimeZone``, ``Enabled``) runs no allocation of its own: at each time its
crons name (in its time zone, UTC by default) the dispatcher registers a child job, the parent's
specification without ``Periodic``, as ``<parent>-periodic-<unix seconds>`` with ``ParentID``
set. Nomad names it ``<parent>/periodic-<unix seconds>``; a job ID here becomes a path component
(and reaches driver plugins as the job name), so the slash is a dash. With ``ProhibitOverlap`` a
launch is skipped while the previous child still runs. Launches missed while the agent was down
are not made up for, as Nomad does not either.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from driversdk.agent.cron import Cron, CronError
from driversdk.errors import ConfigError

CHILD_SEPARATOR = "-periodic-"


class PeriodicError(ConfigError):
    """A periodic block the dispatcher cannot follow."""


@dataclass(frozen=True)
class Schedule:
    job_id: str
    spec: dict[str, Any]
    crons: tuple[Cron, ...]
    zone: ZoneInfo
    prohibit_overlap: bool

    @classmethod
    def of(cls, job_id: str, spec: dict[str, Any]) -> Schedule | None:
        """The job's schedule; None for a job that is not periodic (or whose periodic block is
        disabled). Raises PeriodicError naming the field that is wrong."""
        periodic = spec.get("Periodic")
        if not isinstance(periodic, dict) or periodic.get("Enabled") is False:
            return None
        texts = periodic.get("Specs") or ([periodic["Spec"]] if periodic.get("Spec") else [])
        if not texts or not all(isinstance(t, str) for t in texts):
            raise PeriodicError(f'job "{job_id}": periodic needs crons = ["<cron expression>", …]')
        kind = periodic.get("SpecType") or "cron"
        if kind != "cron":
            raise PeriodicError(f'job "{job_id}": periodic spec type {kind!r} is not supported; use crons')
        try:
            crons = tuple(Cron.parse(t) for t in texts)
        except CronError as err:
            raise PeriodicError(f'job "{job_id}": periodic.crons: {err}') from None
        name = periodic.get("TimeZone") or "UTC"
        try:
            zone = ZoneInfo(str(name))
        except (ZoneInfoNotFoundError, ValueError):
            raise PeriodicError(f'job "{job_id}": periodic.time_zone {name!r} is not a time zone (e.g. "UTC", '
                                '"Europe/Berlin")') from None  # fmt: skip
        return cls(job_id, spec, crons, zone, bool(periodic.get("ProhibitOverlap")))

    def next_launch(self, after: datetime) -> datetime | None:
        """The next launch strictly after ``after`` (an aware time), as an aware UTC time."""
        local = after.astimezone(self.zone).replace(tzinfo=None)
        times = [t for t in (c.next_after(local) for c in self.crons) if t is not None]
        if not times:
            return None
        return min(times).replace(tzinfo=self.zone).astimezone(UTC)

    def child(self, at: datetime) -> dict[str, Any]:
        """The job launched at ``at``: the parent's specification without its schedule."""
        child_id = f"{self.job_id}{CHILD_SEPARATOR}{int(at.timestamp())}"
        spec = {k: v for k, v in self.spec.items() if k not in ("Periodic", "ID", "Name")}
        return dict(spec, ID=child_id, Name=child_id, ParentID=self.job_id)


class PeriodicDispatcher:
    """One thread that sleeps until the next launch of any tracked job, then launches it."""

    def __init__(
        self,
        launch: Callable[[dict[str, Any]], None],
        still_running: Callable[[str], bool],
        log: Callable[[str, str], None],
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._launch = launch
        self._still_running = still_running
        self._log = log
        self._now = now
        self._schedules: dict[str, Schedule] = {}
        self._next: dict[str, datetime] = {}
        self._last_child: dict[str, str] = {}
        self._changed = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="periodic", daemon=True)
        self._thread.start()

    def track(self, schedule: Schedule) -> None:
        with self._changed:
            self._schedules[schedule.job_id] = schedule
            launch = schedule.next_launch(self._now())
            if launch is None:
                self._next.pop(schedule.job_id, None)
            else:
                self._next[schedule.job_id] = launch
            self._changed.notify_all()

    def untrack(self, job_id: str) -> None:
        with self._changed:
            self._schedules.pop(job_id, None)
            self._next.pop(job_id, None)
            self._changed.notify_all()

    def next_launch(self, job_id: str) -> datetime | None:
        with self._changed:
            return self._next.get(job_id)

    def close(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join(5)

    def _loop(self) -> None:
        while True:
            with self._changed:
                if self._closing:
                    return
                due = [(at, job) for job, at in self._next.items()]
                now = self._now()
                ready = [(at, job) for at, job in due if at <= now]
                if not ready:
                    wait = min((at - now).total_seconds() for at, _ in due) if due else None
                    self._changed.wait(timeout=min(wait, 60.0) if wait is not None else None)
                    continue
                launches = []
                for at, job in sorted(ready):
                    schedule = self._schedules[job]
                    following = schedule.next_launch(at)
                    if following is None:
                        self._next.pop(job)
                    else:
                        self._next[job] = following
                    launches.append((schedule, at))
            for schedule, at in launches:
                self._launch_one(schedule, at)

    def launch_now(self, schedule: Schedule) -> str:
        """A child launched at once, out of schedule (prohibit_overlap does not hold it back, as
        Nomad's force does not); its id."""
        child = schedule.child(self._now())
        self._launch(child)
        self._last_child[schedule.job_id] = child["ID"]
        return str(child["ID"])

    def _launch_one(self, schedule: Schedule, at: datetime) -> None:
        previous = self._last_child.get(schedule.job_id)
        if schedule.prohibit_overlap and previous is not None and self._still_running(previous):
            self._log("info", f"client.periodic: job {schedule.job_id!r}: launch at {at.isoformat()} skipped, "
                              f"{previous!r} still runs (prohibit_overlap)")  # fmt: skip
            return
        child = schedule.child(at)
        try:
            self._launch(child)
        except Exception as err:  # a launch that fails is said; the next one is tried on schedule
            self._log("error", f"client.periodic: job {schedule.job_id!r}: launch {child['ID']!r} failed: {err}")
            return
        self._last_child[schedule.job_id] = child["ID"]
        self._log("info", f"client.periodic: job {schedule.job_id!r}: launched {child['ID']!r}")
