"""The small parent a :class:`~driversdk.taskkit.processdriver.ProcessDriver` task runs under.

Run as a script (``python -I -S shim.py RESULT_FILE ARGV...``), never imported by the plugin:
it forks the task, forwards every signal it is sent to the task, waits for it and writes its
exit status to RESULT_FILE. The task's exit status belongs to its parent only; with this shim as
the parent, a plugin started after the one that launched the task (a crash, an upgrade) still
learns how the task ended. It imports nothing beyond the standard library's built-ins, so it
starts in milliseconds and runs whatever the task's environment holds.
"""

from __future__ import annotations

import json
import os
import signal
import sys

# Every catchable signal a host may send with SignalTask / StopTask; SIGKILL and SIGSTOP cannot
# be caught, and the driver sends SIGKILL to the whole process group instead.
FORWARDED = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGWINCH,
    signal.SIGCONT,
    signal.SIGTSTP,
)


def _write_result(path: str, status: int) -> None:
    code = os.waitstatus_to_exitcode(status)
    result = {"exit_code": code, "signal": 0} if code >= 0 else {"exit_code": 0, "signal": -code}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: shim.py RESULT_FILE COMMAND [ARG...]", file=sys.stderr)
        return 2
    result_file, command = argv[0], argv[1:]
    child = 0

    def forward(signum: int, _frame: object) -> None:
        if child > 0:  # 0 in the forked task before its exec, and before the fork returned
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    # Installed before the fork, so no signal sent once the task exists can kill the shim instead.
    for signum in FORWARDED:
        signal.signal(signum, forward)
    # Blocked across the fork: one arriving while the forked task still has our handler would be
    # lost (there is no child to forward to yet); blocked, it waits and reaches the task itself.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    child = os.fork()
    if child == 0:
        # The task starts with every disposition at its default: Python ignores SIGPIPE and
        # SIGXFSZ, and an ignored signal would stay ignored across exec.
        for signum in (*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        try:
            os.execvp(command[0], command)
        except OSError as err:
            os.write(2, f"cannot run {command[0]!r}: {err.strerror}\n".encode())
        os._exit(127)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    # waitpid is retried after each forwarded signal (PEP 475).
    _, status = os.waitpid(child, 0)
    _write_result(result_file, status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
