"""Run a command as a child subreaper and say which of its descendants outlived it.

``python -m tests.agent.reaper_run [--interrupt-on TEXT] -- COMMAND...``: this process becomes a
child subreaper (prctl PR_SET_CHILD_SUBREAPER), so a process the command leaves behind, even one
that detached from it (a daemon, a double fork, a plugin orphaned by its host's exit), is
re-parented here instead of to init. The command's stdout is passed through; with
``--interrupt-on`` the command gets SIGINT (a Ctrl-C) once a line holds TEXT. When the command has
exited, the last line printed is ``LEFT <json>``: its exit code and every live descendant (pid and
command line). Those are then killed, so the test that asks leaves nothing either; with
``--keep`` they are left to run and reaped as they exit (a test that kills a run and then stops
its plugin itself needs the plugin's pid freed for reuse, which an orphan of init may never be).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def _parents() -> dict[int, tuple[int, str]]:
    """Every live (not zombie) process: pid -> (parent pid, command line)."""
    out: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if fields[0] != "Z":
            out[int(name)] = (int(fields[1]), cmdline)
    return out


def descendants(root: int) -> list[tuple[int, str]]:
    table = _parents()
    found = []
    for pid, (_, cmdline) in table.items():
        seen = pid
        while seen in table and seen != root:
            seen = table[seen][0]
            if seen == root:
                found.append((pid, cmdline))
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--interrupt-on")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if args.interrupt_on and args.interrupt_on in line:
            proc.send_signal(signal.SIGINT)
    code = proc.wait()
    left = descendants(os.getpid())
    print("LEFT " + json.dumps({"code": code, "left": [f"{pid}: {cmd}" for pid, cmd in left]}), flush=True)
    for pid, _ in [] if args.keep else left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # Reap whatever was re-parented here (killed above, or exited meanwhile).
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
