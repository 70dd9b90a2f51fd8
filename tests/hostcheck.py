"""What a test can see of the host when it checks that nothing was left behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


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


def labelled_containers(engine: Any, label: str) -> list[dict[str, Any]]:
    """``docker inspect`` of every container carrying ``label`` (a key, or key=value), read one by
    one: a container another test or plugin removes meanwhile is skipped, not an error (the
    docker SDK's ``containers.list`` inspects each and fails on the first one gone)."""
    import docker.errors

    found = []
    for summary in engine.api.containers(all=True, filters={"label": label}):
        try:
            found.append(engine.api.inspect_container(summary["Id"]))
        except docker.errors.NotFound:
            continue
    return found


def gone_within(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` is gone within ``timeout`` seconds (polled: a liveness check, not a
    measure of speed)."""
    import time

    from driversdk.plugin.host import pid_alive

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False
