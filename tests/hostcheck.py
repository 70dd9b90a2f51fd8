"""What a test can see of the host when it checks that nothing was left behind."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
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


NOBODY = 65534


@contextlib.contextmanager
def listener_of_another_user(path: str, received: str | None = None) -> Iterator[int]:
    """A unix socket at ``path`` listened on by a process of uid nobody (bound as root first, so
    any directory will do: the kernel records the listener's credentials at listen()). Yields its
    pid; whatever connects is accepted and its bytes read, and appended to the file ``received``
    when given. The attacker of the tests that check whose socket a host talks to."""
    import signal
    import socket

    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(ready_r)
            loot = os.open(received or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
            os.chmod(path, 0o777)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            sock.listen(8)
            os.write(ready_w, b"x")
            while True:
                conn, _ = sock.accept()
                while data := conn.recv(65536):
                    os.write(loot, data)
                conn.close()
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x", "the other user's listener did not start"
        yield child
    finally:
        os.close(ready_r)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def runc_containers(under: str) -> list[str]:
    """runc's containers (in its host-wide /run/runc) whose bundle is below ``under``."""
    # Not checked: runc fails a listing when a container of another test goes while it reads.
    listed = subprocess.run(["runc", "list", "-f", "json"], capture_output=True, text=True).stdout
    return [c["id"] for c in json.loads(listed or "null") or [] if str(c.get("bundle", "")).startswith(under)]
