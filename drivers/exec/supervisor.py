"""The per-task supervisor: the process that outlives the plugin and records the task's exit.

A plugin that is killed and relaunched cannot ``wait()`` for its predecessor's children, so each
task runs under a tiny ``/bin/sh`` that runs ``runc run`` in the foreground and writes runc's
exit status to a file in the task's state dir. The shell starts through ``posix_spawn`` in its
own session with every signal disposition reset to default and an empty signal mask (nothing
the plugin ignores or blocks reaches the task), stdin on /dev/null and stdout/stderr on the
task's log fifos (never the plugin's own fd 1/2, which carry the handshake and hclog).

A shell rather than Python keeps the supervisor's start-up at about a millisecond.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any

from driversdk.errors import DriverError

SHELL = "/bin/sh"
# $0 runc, $1 bundle dir, $2 container id, $3 status file; the status file appears only once
# runc has returned, and echo writes "<code>\n" in one write, so a complete line means "exited".
# --keep leaves the stopped container (and its cgroup, where cgroup v1 counts OOM kills) for
# DestroyTask to delete.
SCRIPT = '"$0" run --keep --bundle "$1" "$2" </dev/null; echo $? >"$3"'
SIGNAL_OFFSET = 128  # runc reports a signalled container as 128 + signal number


def _reset_signals() -> list[int]:
    return [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def spawn(
    runc_argv: list[str],
    bundle: str,
    container_id: str,
    status_file: str,
    stdout_fd: int,
    stderr_fd: int,
    *,
    no_pivot: bool = False,
) -> int:
    """Start the supervisor; returns its pid. runc_argv is runc plus its global flags.

    ``no_pivot`` (the plugin's no_pivot_root) makes runc enter the root with MS_MOVE and chroot
    instead of pivot_root, which a root file system on a ramdisk (initramfs) cannot do."""
    runc = runc_argv[0]
    script = SCRIPT.replace("run --keep", "run --keep --no-pivot", 1) if no_pivot else SCRIPT
    if len(runc_argv) > 1:
        # Global flags (--root) go before the subcommand: bake them into the script.
        flags = " ".join(f"'{a}'" for a in runc_argv[1:])
        script = script.replace('"$0" run', f'"$0" {flags} run', 1)
    file_actions: list[tuple[Any, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, stdout_fd, 1),
        (os.POSIX_SPAWN_DUP2, stderr_fd, 2),
    ]
    try:
        return os.posix_spawn(
            SHELL,
            [SHELL, "-c", script, runc, bundle, container_id, status_file],
            {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
            file_actions=file_actions,
            setsid=True,
            setsigmask=(),
            setsigdef=_reset_signals(),
        )
    except OSError as err:
        raise DriverError(f"failed to start the task supervisor {SHELL}: {err.strerror}", recoverable=True) from None


@dataclass(frozen=True)
class Status:
    """What the status file says: runc's exit code, split into exit code and signal."""

    exit_code: int
    signal: int
    finished_at: float


def read_status(status_file: str) -> Status | None:
    try:
        with open(status_file) as fh:
            raw = fh.read()
        finished = os.stat(status_file).st_mtime
    except FileNotFoundError:
        return None
    if not raw.endswith("\n"):
        return None  # the shell created the file but has not written the line yet
    text = raw.strip()
    code = int(text) if text.lstrip("-").isdigit() else -1
    sig = code - SIGNAL_OFFSET if SIGNAL_OFFSET < code <= SIGNAL_OFFSET + 64 else 0
    return Status(exit_code=code, signal=sig, finished_at=finished)


def is_supervisor(pid: int, container_id: str) -> bool:
    """Whether ``pid`` is still the supervisor of this container (guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return len(argv) > 1 and argv[0] == SHELL.encode() and container_id.encode() in argv
