"""driversdk.durations: Go's duration grammar, one error sentence naming the field."""

from __future__ import annotations

import pytest

from driversdk.durations import parse_duration
from driversdk.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("+0", 0.0),
        ("30s", 30.0),
        ("+5s", 5.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("1h2m3.5s", 3723.5),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("5.s", 5.0),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("100ns", 1e-7),
        ("1h1h", 7200.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "kill_timeout") == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", ".", ".s", "1", "s", "1d", "1 s", "5 minutes", "1.5.2s", "ms", "-"])
def test_bad_durations_name_the_field(bad: str) -> None:
    with pytest.raises(ConfigError, match=f"kill_timeout {bad!r} is not a duration such as"):
        parse_duration(bad, "kill_timeout")


def test_negative_durations_are_refused_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="is negative"):
        parse_duration("-1s", "kill_timeout")
    assert parse_duration("-1m", "offset", allow_negative=True) == -60.0
