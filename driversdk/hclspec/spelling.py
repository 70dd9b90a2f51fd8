"""The one "did you mean" of the project: a name nothing reads, and the known name it is closest to.

The job schema, the agent config and a driver's ``config { }`` schema all suggest the same way,
so an operator's typo (``imgae``) gets the same answer wherever it is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from difflib import get_close_matches


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``; did you mean "x"?`` for the known name closest to ``name``, or "" when none is close."""
    close = get_close_matches(name, sorted(str(k) for k in known), n=1, cutoff=0.6)
    return f'; did you mean "{close[0]}"?' if close else ""
