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

``python -I -S launch.py serve <state dir>`` is the shared supervisor of a plugin state dir
(``shared.py`` starts it, detached; it outlives plugins). A child subreaper listening on
``<state dir>/supervisor.sock`` (0600), it forks each task a request names (a spec in
``<state dir>/tasks/*/``, the task's stdout/stderr passed as fds) with the same set-up, answers
``ok <pid> <start time>``, and writes each task's status file when it reaps it; a spec naming a
``pid_file`` (``runc run --detach``) makes the pid written there the task. With no child and no
request for IDLE_EXIT seconds it exits.

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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

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


def _fork_task(spec: dict[str, Any], descriptors: Callable[[], None]) -> tuple[int, str]:
    """Fork the task: the child sets its ``descriptors`` up, takes a process group of its own, is
    set up as the task (set_up) and execs. Returns its pid, and why it could not exec (the child
    is then reaped) or "" when it runs."""
    read_end, write_end = os.pipe()  # close-on-exec: EOF without data means the exec succeeded
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            descriptors()
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
    return pid, b"".join(chunks).decode(errors="replace")


def supervise(spec_path: str) -> int:
    spec = _load(spec_path)
    # The supervisor must not die of the signals meant for its task's group or a hung-up terminal.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    pid, failed = _fork_task(spec, lambda: os.close(READY_FD))
    if failed:
        _report(f"err {failed}\n")
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


# --- serve: one supervisor for every task of a plugin state dir -----------------------------------

SOCKET_NAME = "supervisor.sock"  # supervisor.py's (shared.py)
LOCK_NAME = "supervisor.lock"
TASKS_DIR = "tasks"
PR_SET_CHILD_SUBREAPER = 36
IDLE_EXIT = 2.0  # seconds without a child or a request before the server goes
UNKNOWN_KEEP = 60.0  # how long an exit nobody asked about yet is kept for a pid file to claim it
REQUEST_TIMEOUT = 5.0


def _start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (0 when unreadable): with the pid, the process's identity."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return 0
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


def _record_exit(spec: dict[str, Any], status: int) -> None:
    if os.WIFSIGNALED(status):
        killed_by = os.WTERMSIG(status)
        code, sig = SIGNAL_OFFSET + killed_by, killed_by
    else:
        code = os.waitstatus_to_exitcode(status)
        relayed = spec.get("signal_in_exit_code") and SIGNAL_OFFSET < code <= SIGNAL_OFFSET + 64
        sig = code - SIGNAL_OFFSET if relayed else 0
    with contextlib.suppress(OSError):  # the task's dir may be gone (destroyed while it ran)
        _write_status(spec["status_file"], code, sig)


class Server:
    """The event loop of ``serve``: single-threaded, one request at a time, every task its child.

    A request is ``spawn <spec path>`` with the task's stdout and stderr as SCM_RIGHTS fds; the
    reply ``ok <pid> <start time>`` or ``err <sentence>``. A spec naming a ``pid_file`` is a
    launcher that starts the task and exits (``runc run --detach``): the reply waits for it, and
    the task is the pid it wrote, which became this subreaper's child when the launcher exited.
    """

    def __init__(self, base: str) -> None:
        import time

        self.clock = time.monotonic
        self.base = base
        self.running: dict[int, dict[str, Any]] = {}  # task pid -> spec
        self.launching: dict[int, tuple[Any, dict[str, Any]]] = {}  # launcher pid -> (connection, spec)
        self.unknown: dict[int, tuple[int, int, float]] = {}  # pid -> (wait status, start time, when reaped)
        self.quitting: list[Any] = []  # connections of `quit` requests, answered `bye` on the way out

    # --- requests -------------------------------------------------------------------------------

    def handle(self, conn: Any) -> None:
        import socket
        import struct

        conn.settimeout(REQUEST_TIMEOUT)
        fds: list[int] = []
        try:
            _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            msg, fds, _flags, _addr = socket.recv_fds(conn, 4096, 2)
            for fd in fds:
                os.set_inheritable(fd, False)  # no other task's child may inherit them
            if uid != os.geteuid():
                self.reply(conn, f"err requests are taken from uid {os.geteuid()} only\n")
                return
            kind, _, spec_path = msg.decode(errors="replace").strip().partition(" ")
            if kind == "quit":  # the plugin destroyed its last task: leave now when nothing else runs
                if self.idle():
                    self.quitting.append(conn)  # answered once the socket is gone
                else:
                    self.reply(conn, "busy\n")
                return
            if kind != "spawn" or len(fds) != 2:
                self.reply(conn, "err a request is `spawn <spec>` with the task's stdout and stderr fds\n")
                return
            problem = self.check_spec(spec_path)
            if problem:
                self.reply(conn, f"err {problem}\n")
                return
            spec = _load(spec_path)
            self.spawn(conn, spec, fds[0], fds[1])
        except (OSError, ValueError) as err:
            self.reply(conn, f"err the supervisor could not take the request: {err}\n")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def check_spec(self, path: str) -> str:
        """Only a task dir of this state dir: a request cannot make the supervisor run, as root,
        a spec (or write a status file) anywhere else."""
        task_dir = os.path.dirname(path)
        inside = os.path.dirname(task_dir) == os.path.join(self.base, TASKS_DIR)
        if not os.path.isabs(path) or os.path.realpath(path) != path or not inside or "/../" in path:
            return f"spec {path!r} is not a launch spec in this state dir's tasks ({self.base}/{TASKS_DIR})"
        try:
            spec = _load(path)
        except (OSError, ValueError) as err:
            return f"spec {path!r} cannot be read: {err}"
        if spec.get("status_file") != os.path.join(task_dir, "exit_status"):
            return f"spec {path!r} names a status file outside its task dir"
        pid_file = spec.get("pid_file") or ""
        if pid_file and os.path.dirname(pid_file) != task_dir:
            return f"spec {path!r} names a pid file outside its task dir"
        return ""

    def spawn(self, conn: Any, spec: dict[str, Any], stdout_fd: int, stderr_fd: int) -> None:
        def stdio() -> None:
            null = os.open("/dev/null", os.O_RDONLY)
            for fd, target in ((null, 0), (stdout_fd, 1), (stderr_fd, 2)):
                os.dup2(fd, target)

        pid, failed = _fork_task(spec, stdio)
        if failed:
            self.reply(conn, f"err {failed}\n")
        elif spec.get("pid_file"):
            self.launching[pid] = (conn, spec)  # the reply waits for the launcher's exit
        else:
            self.running[pid] = spec
            self.reply(conn, f"ok {pid} {_start_time(pid)}\n")

    @staticmethod
    def reply(conn: Any, line: str) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(line.encode())
        conn.close()

    # --- exits ----------------------------------------------------------------------------------

    def reap(self) -> None:
        while True:
            try:
                # WNOWAIT first: the start time is read while the zombie still has its /proc entry.
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            start = _start_time(info.si_pid)
            pid, status = os.waitpid(info.si_pid, 0)
            self.ended(pid, status, start)

    def ended(self, pid: int, status: int, start: int) -> None:
        spec = self.running.pop(pid, None)
        if spec is not None:
            _record_exit(spec, status)
            return
        launch = self.launching.pop(pid, None)
        if launch is None:
            # A container init whose launcher we have not reaped yet, or what a task left behind.
            self.unknown[pid] = (status, start, self.clock())
            return
        conn, spec = launch
        if os.waitstatus_to_exitcode(status) != 0:
            # The launcher failed (its message went to the task's stderr): the task ran, and ended
            # with the launcher's status, as a program in the foreground that failed would.
            _record_exit(spec, status)
            self.reply(conn, f"ok {pid} {start}\n")
            return
        try:
            with open(spec["pid_file"]) as fh:
                task_pid = int(fh.read().strip())
        except (OSError, ValueError) as err:
            self.reply(conn, f"err {spec['path']} wrote no task pid to {spec['pid_file']}: {err}\n")
            return
        early = self.unknown.pop(task_pid, None)
        if early is not None:  # the task already ended: it was reaped before its launcher
            _record_exit(spec, early[0])
            self.reply(conn, f"ok {task_pid} {early[1]}\n")
            return
        self.running[task_pid] = spec
        self.reply(conn, f"ok {task_pid} {_start_time(task_pid)}\n")

    def prune(self) -> None:
        now = self.clock()
        for pid in [p for p, (_s, _t, when) in self.unknown.items() if now - when > UNKNOWN_KEEP]:
            del self.unknown[pid]

    def idle(self) -> bool:
        if self.running or self.launching:
            return False
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True  # no child at all: nothing left to record
        return False


def serve(base: str) -> int:
    """Run the state dir's shared supervisor until it has no task left and nobody asked for
    IDLE_EXIT seconds; fd 3 gets ``ready <pid>``, or ``busy`` when another one runs."""
    import fcntl
    import select
    import socket

    base = os.path.realpath(base)
    lock = os.open(os.path.join(base, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _report("busy\n")
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        _report(f"err failed to become a child subreaper: {os.strerror(ctypes.get_errno())}\n")
        return 1
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    # Through the dir's fd: a socket path is limited to 108 bytes, a state dir is not.
    dirfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    address = f"/proc/self/fd/{dirfd}/{SOCKET_NAME}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)  # a dead supervisor's: we hold the lock
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        listener.bind(address)  # 0600: only the plugin's user may ask
    finally:
        os.umask(umask)
    bound = os.stat(address).st_ino
    listener.listen(128)
    listener.setblocking(False)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
    server = Server(base)
    poller = select.epoll()
    poller.register(listener.fileno(), select.EPOLLIN)
    poller.register(wake_r, select.EPOLLIN)
    _report(f"ready {os.getpid()}\n")
    while True:
        server.reap()
        server.prune()
        events = poller.poll(IDLE_EXIT if server.idle() else UNKNOWN_KEEP)
        for fd, _mask in events:
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
                continue
            with contextlib.suppress(BlockingIOError):
                conn, _ = listener.accept()
                conn.setblocking(True)
                server.handle(conn)
        if server.quitting or (not events and server.idle()):
            break
    # Unlink first: a plugin that connects from now on starts a new supervisor; one whose
    # connection was queued but never accepted sees it closed unanswered and retries.
    with contextlib.suppress(OSError):
        if os.stat(address).st_ino == bound:
            os.unlink(address)
    listener.close()
    for conn in server.quitting:
        server.reply(conn, "bye\n")
    return 0


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
    if len(argv) == 2 and argv[0] == "serve":
        return serve(argv[1])
    sys.stderr.write("usage: launch.py supervise <spec> | serve <state dir> | exec <spec> <argv...>\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
