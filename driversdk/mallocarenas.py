"""Fewer glibc malloc arenas for a long-lived process with many threads (the agent, a plugin),
and the freed heap given back once a big job is gone.

glibc gives threads that contend on malloc arenas of their own, up to eight per core, and keeps
what a thread freed in its arena for reuse instead of returning it. A process that starts and
ends short threads by the thousand (the agent: a thread per allocation start, per task exit, per
API request) then holds tens of MiB in arenas it barely uses: bench/bench_agent.py --count 1000
measured the agent at 167 MiB with the default and 133 MiB with two arenas.
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


def give_back_freed_memory() -> bool:
    """Return the heap's freed pages to the kernel (glibc's malloc_trim): after a big job is torn
    down the agent otherwise keeps the memory its allocations used (bench_agent --count 1000:
    ~40 MiB after the stop). True when the C library did; False where there is no such call."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
