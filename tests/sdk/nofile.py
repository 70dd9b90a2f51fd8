"""Shared by the exec and raw_exec open-file-limit tests: a plugin started with a low soft limit."""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator

LOW_SOFT = 1024


@contextlib.contextmanager
def low_soft_nofile() -> Iterator[int]:
    """Lower this process's soft open-file limit (children inherit it) while the block runs.

    Yields the hard limit; the caller skips when it is not above LOW_SOFT (nothing to raise)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LOW_SOFT, hard), hard))
    try:
        yield hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
