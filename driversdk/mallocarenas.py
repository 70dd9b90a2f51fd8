"""Fewer glibc malloc arenas for a long-lived process with many threads (the agent, a plugin).

glibc gives threads that contend on malloc arenas of their own, up to eight per core, and keeps
what a thread freed in its arena for reuse instead of returning it. A process that starts and
ends short threads by the thousand (the agent: a thread per allocation start, per task exit, per
API request) then holds tens of MiB in arenas it barely uses: the agent with 1000 allocations
was 167 MiB with the default and 133 MiB with two arenas (bench/bench_agent.py --count 1000).
Python's own small objects live in pymalloc's pools, untouched by this.
"""

from __future__ import annotations

import ctypes

M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h
ARENAS = 2


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap the arenas threads created from now on may use; True when the C library took it (glibc),
    False elsewhere (musl has no arenas to cap). Call it before the process starts its threads."""
    try:
        # The interpreter's own symbols, the C library's among them: no library search (which
        # runs ldconfig) in the start-up of a plugin.
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
