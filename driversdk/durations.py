"""Go durations as Nomad's job files and agent configs write them ("500ms", "1m30s", "1.5h").

One grammar and one error sentence for the whole project: Go's time.ParseDuration accepts an
optional sign, then one or more <decimal number><unit> pairs (a bare "0" too), with the units
ns, us (or µs), ms, s, m and h.
"""

from __future__ import annotations

import re

from driversdk.errors import ConfigError

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# Longest unit names first, so "ms" is not read as "m" followed by a stray "s".
_PAIR = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str, what: str, *, allow_negative: bool = False) -> float:
    """Seconds; ``what`` names the field in the error (e.g. "kill_timeout")."""
    if not isinstance(text, str):
        raise ConfigError(f'{what} {text!r} is not a duration such as "30s" or "1m30s"')
    body = text[1:] if text[:1] in "+-" else text
    negative = text.startswith("-")
    if body == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(body):
        match = _PAIR.match(body, pos)
        if match is None:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise ConfigError(f'{what} {text!r} is not a duration such as "30s" or "1m30s" (units: ns, us, ms, s, m, h)')
    if negative and total and not allow_negative:
        raise ConfigError(f"{what} {text!r} is negative; give a duration of zero or more")
    return -total if negative else total
