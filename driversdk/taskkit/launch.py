"""The task supervisor and launcher of every process driver built on the kit: the small process
that outlives the plugin. Run as a script, never imported by the plugin (supervisor.py starts it).

``python -I -S launch.py supervise <spec>`` is started by the plugin (posix_spawn, own
session, stdout/stderr on the task's log fifos, fd 3 a pipe back to the plugin). It forks the
task, which before ``execve`` puts itself in its own process group and in the task's cgroups,
sets its ``oom_score_adj``, enters the group's network namespace when there is one, changes to
its working dir and drops to the task's user. The supervisor reports ``ok <pid>`` (or ``err
<sentence>`` when the exec failed) on fd 3, waits for the task and writes ``<code> <signal>`` to
the status file, which a relaunched plugin reads after re-attaching. A program that reports its
own child's death by signal N as exit ``128 + N`` (runc, a shell) is named so in the spec
(``signal_in_exit_code``), and the status file then says which signal.

``python -I -S launch.py exec <spec> <argv...>`` does the same set-up in place and execs
``argv`` (ExecTask: a command in the task's cgroups, as its user, with its environment).

Stdlib only, so it starts in a few tens of milliseconds and needs no driversdk import.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any

READY_FD = 3
SIGNAL_OFFSET = 128  # a task killed by signal N exits "128 + N", as shells and Nomad's executor report it
CLONE_NEWNET = 0x40000000


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)


def _reset_signals() -> None:
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def set_up(spec: dict[str, Any]) -> str:
    """Turn this process into the task's: the step that failed is returned by the caller's handler.

    Order matters: cgroups and oom_score_adj need root, so they come before dropping to the user.
    """
    step = "join the task's cgroups"
    try:
        for procs in spec["cgroup_procs"]:
            with open(procs, "w") as fh:
                fh.write("0")
        step = "set oom_score_adj"
        if spec.get("oom_score_adj") is not None:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write(str(int(spec["oom_score_adj"])))
        if spec.get("netns"):
            step = f"enter the network namespace {spec['netns']}"
            _setns(spec["netns"])
        step = f"change to the working dir {spec['cwd']}"
        os.chdir(spec["cwd"])
        if spec.get("switch_user"):
            step = f"switch to uid {spec['uid']} gid {spec['gid']}"
            os.setgroups(list(spec["groups"]))
            os.setgid(int(spec["gid"]))
            os.setuid(int(spec["uid"]))
        _reset_signals()
    except OSError as err:
        raise OSError(err.errno, f"failed to {step}: {err.strerror}") from None
    return step


def _load(path: str) -> dict[str, Any]:
    with open(path) as fh:
        spec: dict[str, Any] = json.load(fh)
    return spec


def _report(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(READY_FD, message.encode())
        os.close(READY_FD)


def _write_status(path: str, code: int, sig: int) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{code} {sig}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def supervise(spec_path: str) -> int:
    spec = _load(spec_path)
    # The supervisor must not die of the signals meant for its task's group or a hung-up terminal.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    read_end, write_end = os.pipe()  # close-on-exec: EOF without data means the exec succeeded
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.close(READY_FD)
            os.setpgid(0, 0)
            set_up(spec)
            try:
                os.execve(spec["path"], spec["argv"], spec["env"])
            except OSError as err:
                raise OSError(err.errno, f"failed to run {spec['path']}: {err.strerror}") from None
        except OSError as err:
            with contextlib.suppress(OSError):
                os.write(write_end, (err.strerror or str(err)).encode())
        finally:
            os._exit(127)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 4096):
        chunks.append(chunk)
    os.close(read_end)
    if chunks:
        os.waitpid(pid, 0)
        _report("err " + b"".join(chunks).decode(errors="replace") + "\n")
        return 1
    _report(f"ok {pid}\n")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        killed_by = os.WTERMSIG(status)
        _write_status(spec["status_file"], SIGNAL_OFFSET + killed_by, killed_by)
    else:
        code = os.waitstatus_to_exitcode(status)
        relayed = spec.get("signal_in_exit_code") and SIGNAL_OFFSET < code <= SIGNAL_OFFSET + 64
        _write_status(spec["status_file"], code, code - SIGNAL_OFFSET if relayed else 0)
    return 0


def exec_in_task(spec_path: str, argv: list[str]) -> int:
    spec = _load(spec_path)
    try:
        set_up(spec)
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as err:
        sys.stderr.write(f"{argv[0]}: {err.strerror or err}\n")
    return 127


NOFILE_ENV = "DRIVERSDK_TASK_NOFILE"  # supervisor.py's


def _restore_nofile() -> None:
    """Put back the soft open-file limit the plugin was started with (it raised its own)."""
    wanted = os.environ.pop(NOFILE_ENV, "")
    if wanted.isdigit():
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(int(wanted), hard), hard))


def main(argv: list[str]) -> int:
    _restore_nofile()
    if len(argv) >= 2 and argv[0] == "supervise":
        return supervise(argv[1])
    if len(argv) >= 3 and argv[0] == "exec":
        return exec_in_task(argv[1], argv[2:])
    sys.stderr.write("usage: launch.py supervise <spec> | exec <spec> <argv...>\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
