"""What a test can see of the host when it checks that nothing was left behind."""

from __future__ import annotations

import os
from pathlib import Path


def processes(needle: str) -> list[str]:
    """Processes (other than this one) whose command line mentions ``needle``, as "pid: cmdline"."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline and int(pid) != os.getpid():
            found.append(f"{pid}: {cmdline}")
    return found
