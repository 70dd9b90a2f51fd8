"""Cron expressions as Nomad's periodic block reads them, and the schedules made of them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from driversdk.agent.cron import Cron, CronError
from driversdk.agent.periodic import PeriodicError, Schedule

AFTER = datetime(2026, 11, 27, 22, 7, 13)  # a Friday


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("*/5 * * * *", datetime(2026, 11, 27, 22, 10)),
        ("0 3 * * MON-FRI", datetime(2026, 11, 30, 3, 0)),
        ("0 3 * * 1-5", datetime(2026, 11, 30, 3, 0)),
        ("@daily", datetime(2026, 11, 28, 0, 0)),
        ("@hourly", datetime(2026, 11, 27, 23, 0)),
        ("@weekly", datetime(2026, 11, 29, 0, 0)),
        ("@monthly", datetime(2026, 12, 1, 0, 0)),
        ("@yearly", datetime(2027, 1, 1, 0, 0)),
        ("*/2 * * * * * *", datetime(2026, 11, 27, 22, 7, 14)),
        ("0 0 29 2 *", datetime(2028, 2, 29, 0, 0)),
        ("0 0 1,15 * SUN", datetime(2026, 11, 29, 0, 0)),  # either day field matches, as in cron
        ("0 0 * * 7", datetime(2026, 11, 29, 0, 0)),  # 7 is Sunday too
        ("30 22 * * *", datetime(2026, 11, 27, 22, 30)),
        ("0 12 * DEC *", datetime(2026, 12, 1, 12, 0)),
        ("5/20 * * * *", datetime(2026, 11, 27, 22, 25)),
        ("0 0 1 1 * 2030", datetime(2030, 1, 1, 0, 0)),
        ("0 0 ? * FRI", datetime(2026, 12, 4, 0, 0)),
    ],
)
def test_next_time(expression: str, expected: datetime) -> None:
    assert Cron.parse(expression).next_after(AFTER) == expected


def test_never_again_is_none() -> None:
    assert Cron.parse("0 0 1 1 * 2020").next_after(AFTER) is None
    assert Cron.parse("0 0 30 2 *").next_after(AFTER) is None


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("* * * *", "has 4 fields"),
        ("61 * * * *", "outside the minute range 0-59"),
        ("* * * * MOO", "'MOO' is not a day of week"),
        ("*/0 * * * *", "must be a number above 0"),
        ("0 0 L * *", "(L, W, #) is not supported"),
        ("0 0 * * 5#3", "(L, W, #) is not supported"),
        ("? * * * *", "only for the day fields"),
        ("5-1 * * * *", "outside the minute range"),
    ],
)
def test_bad_expressions_are_sentences(expression: str, words: str) -> None:
    with pytest.raises(CronError) as err:
        Cron.parse(expression)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_schedule_in_its_time_zone() -> None:
    spec = {"Periodic": {"Specs": ["0 9 * * *"], "TimeZone": "Europe/Berlin", "ProhibitOverlap": True}}
    schedule = Schedule.of("report", spec)
    assert schedule is not None and schedule.prohibit_overlap
    # 09:00 in Berlin (UTC+1 in winter) is 08:00 UTC
    assert schedule.next_launch(datetime(2026, 11, 27, 22, 0, tzinfo=UTC)) == datetime(2026, 11, 28, 8, 0, tzinfo=UTC)
    child = schedule.child(datetime(2026, 11, 28, 8, 0, tzinfo=UTC))
    assert child["ID"] == "report-periodic-1795852800" and child["ParentID"] == "report" and "Periodic" not in child


def test_schedule_refusals() -> None:
    assert Schedule.of("x", {}) is None
    assert Schedule.of("x", {"Periodic": {"Specs": ["* * * * *"], "Enabled": False}}) is None
    with pytest.raises(PeriodicError, match="time_zone 'Mars/Base' is not a time zone"):
        Schedule.of("x", {"Periodic": {"Specs": ["* * * * *"], "TimeZone": "Mars/Base"}})
    with pytest.raises(PeriodicError, match=r"periodic\.crons: cron"):
        Schedule.of("x", {"Periodic": {"Specs": ["nope"]}})
    with pytest.raises(PeriodicError, match="needs crons"):
        Schedule.of("x", {"Periodic": {"Specs": []}})
