"""Cron expressions as Nomad's ``periodic { crons = [...] }`` reads them (the cronexpr syntax):
5 fields (minute hour day-of-month month day-of-week), 6 (a year after them) or 7 (a second
before them and a year after), or one of ``@yearly``/``@annually``, ``@monthly``, ``@weekly``,
``@daily``/``@midnight``, ``@hourly``. A field is ``*`` (or ``?`` for the day fields), numbers,
names (JAN-DEC, SUN-SAT), ranges ``a-b``, lists ``a,b`` and steps ``*/n``, ``a-b/n``, ``a/n``.
When both day fields are restricted a day matching either is a match, as in cron. The forms
cronexpr has beyond these (``L``, ``W``, ``#``) are refused with a sentence, never guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from driversdk.errors import ConfigError

_MACROS = {
    "@yearly": "0 0 0 1 1 * *",
    "@annually": "0 0 0 1 1 * *",
    "@monthly": "0 0 0 1 * * *",
    "@weekly": "0 0 0 * * 0 *",
    "@daily": "0 0 0 * * * *",
    "@midnight": "0 0 0 * * * *",
    "@hourly": "0 0 * * * * *",
}
_MONTHS = {name: i for i, name in enumerate(["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT",
                                              "NOV", "DEC"], start=1)}  # fmt: skip
_DAYS = {name: i for i, name in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}
# (name, lowest, highest, names)
_FIELDS = [
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
    ("year", 1970, 2099, {}),
]
# A search gives up after this many years without a match (e.g. "0 0 30 2 *": February 30th).
_HORIZON_YEARS = 8


class CronError(ConfigError):
    """A cron expression that is not one."""


@dataclass(frozen=True)
class Cron:
    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    years: frozenset[int]
    any_day: bool  # day of month is * or ?
    any_weekday: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        spec = _MACROS.get(text.strip().lower(), text.strip())
        parts = spec.split()
        if len(parts) == 5:
            parts = ["0", *parts, "*"]
        elif len(parts) == 6:
            parts = ["0", *parts]
        elif len(parts) != 7:
            raise CronError(
                f"cron {text!r} has {len(parts)} fields; write 5 (minute hour day-of-month month day-of-week), "
                "6 (and a year) or 7 (a second first), or @hourly, @daily, @weekly, @monthly, @yearly"
            )
        sets = [_field(text, part, *meta) for part, meta in zip(parts, _FIELDS, strict=True)]
        weekdays = frozenset(0 if d == 7 else d for d in sets[5])
        return cls(text, sets[0], sets[1], sets[2], sets[3], sets[4], weekdays, sets[6],
                   any_day=parts[3] in ("*", "?"), any_weekday=parts[5] in ("*", "?"))  # fmt: skip

    def _day_matches(self, day: datetime) -> bool:
        in_month = day.day in self.days
        weekday = (day.weekday() + 1) % 7  # cron counts from Sunday
        in_week = weekday in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return in_week
        if self.any_weekday:
            return in_month
        return in_month or in_week

    def next_after(self, after: datetime) -> datetime | None:
        """The first time strictly after ``after`` (naive wall-clock time) the expression
        matches, or None when it never does again."""
        t = after.replace(microsecond=0) + timedelta(seconds=1)
        limit = after.year + _HORIZON_YEARS
        while t.year <= limit:
            if t.year not in self.years:
                later = [y for y in self.years if y > t.year]
                if not later:
                    return None
                t = datetime(min(later), 1, 1)
                continue
            if t.month not in self.months:
                t = _next_month(t)
                continue
            if not self._day_matches(t):
                t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                continue
            if t.hour not in self.hours:
                t = datetime(t.year, t.month, t.day, t.hour) + timedelta(hours=1)
                continue
            if t.minute not in self.minutes:
                t = datetime(t.year, t.month, t.day, t.hour, t.minute) + timedelta(minutes=1)
                continue
            if t.second not in self.seconds:
                t += timedelta(seconds=1)
                continue
            return t
        return None


def _next_month(t: datetime) -> datetime:
    return datetime(t.year + 1, 1, 1) if t.month == 12 else datetime(t.year, t.month + 1, 1)


def _number(text: str, whole: str, name: str, names: dict[str, int]) -> int:
    upper = text.upper()
    if upper in names:
        return names[upper]
    if not text.isdigit():
        if any(mark in upper for mark in ("L", "W", "#")) and name.startswith("day"):
            raise CronError(f"cron {whole!r}: the {name} form {text!r} (L, W, #) is not supported by driversdk; "
                            "list the days instead")  # fmt: skip
        raise CronError(f"cron {whole!r}: {text!r} is not a {name}")
    return int(text)


def _field(whole: str, part: str, name: str, low: int, high: int, names: dict[str, int]) -> frozenset[int]:
    out: set[int] = set()
    for item in part.split(","):
        if not item:
            raise CronError(f"cron {whole!r}: the {name} field has an empty list item")
        body, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"cron {whole!r}: the step {step_text!r} of the {name} field must be a number above 0")
            step = int(step_text)
        if body in ("*", "?"):
            if body == "?" and not name.startswith("day"):
                raise CronError(f"cron {whole!r}: '?' is only for the day fields, not the {name}")
            first, last = low, high
        elif "-" in body:
            a, _, b = body.partition("-")
            first, last = _number(a, whole, name, names), _number(b, whole, name, names)
        else:
            first = _number(body, whole, name, names)
            last = high if slash else first
        if not (low <= first <= high and low <= last <= high) or first > last:
            raise CronError(f"cron {whole!r}: {item!r} is outside the {name} range {low}-{high}")
        out.update(range(first, last + 1, step))
    return frozenset(out)
