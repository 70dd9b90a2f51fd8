"""One streaming exec session (``nomad alloc exec``) bridged to a child process.

A process driver builds the argv that runs the command inside the task (``runc exec``, a
launcher entering the task's cgroup, ...); this runs it with pipes, pumps its stdout and stderr
to the session as they come, feeds the session's stdin to it, and returns its exit.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable
from typing import IO

from driversdk.driver import ExecSession
from driversdk.model import ExitResult

CHUNK = 65536
SIGNAL_OFFSET = 128
READER_JOIN = 5.0


def exit_result(returncode: int, *, signal_in_exit_code: bool = False) -> ExitResult:
    """A Popen return code as Nomad reports it: a signalled process exits 128 + signal.
    ``signal_in_exit_code``: the program (runc) itself reports a child killed by N as 128 + N."""
    if returncode < 0:
        return ExitResult(exit_code=128 - returncode, signal=-returncode)
    if signal_in_exit_code and SIGNAL_OFFSET < returncode <= SIGNAL_OFFSET + 64:
        return ExitResult(exit_code=returncode, signal=returncode - SIGNAL_OFFSET)
    return ExitResult(exit_code=returncode)


def _pump(stream: IO[bytes], send: Callable[[bytes], None]) -> None:
    read = getattr(stream, "read1", stream.read)
    for chunk in iter(lambda: read(CHUNK), b""):
        send(chunk)


def run_session(argv: list[str], session: ExecSession, *, env: dict[str, str] | None = None) -> ExitResult:
    """Run ``argv`` for ``session`` until it exits; returns its exit.

    The output pumps live as long as the session, not the task. The SDK reports the end of the
    client's request stream both as stdin EOF and as "cancelled", so a normal half-close looks
    like a cancel: once stdin ended the command runs to completion (its output still streams).
    """
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, session.send_stdout), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, session.send_stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    while proc.poll() is None:
        data = session.read_stdin(timeout=0.1)
        if data is None:
            break
        if data:
            with contextlib.suppress(OSError):
                proc.stdin.write(data)
                proc.stdin.flush()
    with contextlib.suppress(OSError):
        proc.stdin.close()
    code = proc.wait()
    for reader in readers:
        reader.join(timeout=READER_JOIN)
    return exit_result(code)
