"""The run server: driversdk loaded once, forked per ``driversdk run`` (see driversdk.runner.runclient).

Started by a run client (``python -m driversdk.runner.runserver SOCKET LINGER SYS_PATH``) in the
process context it serves, it loads the modules a run needs, then listens on SOCKET (in the user's
private cache dir, its name derived from the context key) and, for each client of its own user and
key, forks. The copy takes the client's standard streams, working directory, umask, environment
and argv, answers with its pid, runs the command line exactly as ``driversdk`` would, and reports
its exit. The server reports the exit of a copy killed by a signal, and kills the copy whose client
went away without waiting for it (a killed client: as if the run itself had been killed). With no
run for LINGER seconds it removes its socket and exits.

It must have no thread of its own when it forks (a forked copy would inherit a lock some thread
held): it checks, and serves nothing otherwise.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from driversdk.codeid import context_key
from driversdk.peercred import peer_uid
from driversdk.runner import runwire

# What `driversdk run` loads: imported before the first fork, so a run's copy has them already.
PRELOAD = (
    "driversdk.cli",
    "driversdk.client",
    "driversdk.convert",
    "driversdk.runner.run",
    "driversdk.runner.validate",
    "driversdk.runner.allocrunner",
    "driversdk.runner.drivermanager",
    "driversdk.runner.taskrunner",
    "driversdk.runner.prelaunch",
    "driversdk.runner.events",
    "driversdk.runner.hclload",
    "driversdk.runner.hcl.tree",
    "driversdk.hclspec.spec",
    "driversdk.hclspec.codec",
    "driversdk.plugin.host",
)
_REQUEST_TIMEOUT = 10.0  # a client that connected sends its request at once


@dataclass
class _Run:
    conn: socket.socket
    pid: int


@dataclass
class _Server:
    listener: socket.socket
    path: str
    inode: int
    key: str
    linger: float
    runs: dict[int, _Run] = field(default_factory=dict)  # by pid
    wakeup: tuple[int, int] = (-1, -1)  # the self-pipe signals are written to (read end, write end)
    last_activity: float = field(default_factory=time.monotonic)
    stopping: bool = False  # told to stop ({"stop": true}): exits once its runs have ended


ENV_LOG = "DRIVERSDK_RUN_SERVER_LOG"  # a file to append the server's decisions to (why a run was not served)


def _log(message: str) -> None:
    target = os.environ.get(ENV_LOG)
    if not target:
        return
    try:
        with open(target, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} runserver[{os.getpid()}] {message}\n")
    except OSError:
        pass


def main(argv: list[str]) -> int:
    path, linger_text, sys_path = argv[0], argv[1], argv[2]
    # The client's module search path (its first entry is its script's dir, or its working dir
    # for python -m): modules imported lazily during a run must come from where its own would.
    sys.path[:] = json.loads(sys_path)
    linger = float(linger_text)
    key = context_key()
    if runwire.socket_path(os.path.dirname(path), key) != path:
        _log(f"not serving {path}: this process's context key is {key[:32]} (the code or context changed)")
        return 0
    for module in PRELOAD:
        try:
            __import__(module)
        except ImportError:
            pass  # an extra that is not installed: a run needing it loads (and reports) it itself
    # Not kept busy: the directory the first client ran in (it may be a mount someone unmounts).
    os.chdir("/")
    if threading.active_count() != 1:
        _log(f"not serving {path}: a thread was started while loading ({threading.enumerate()})")
        return 0  # forking would not be safe
    listener = _listen(path)
    if listener is None:
        _log(f"not serving {path}: another server listens there")
        return 0
    _log(f"serving {path} (linger {linger:g}s)")
    server = _Server(listener, path, os.stat(path).st_ino, key, linger)
    try:
        _serve(server)
    except BaseException as err:
        _log(f"stopping: {err!r}")
        raise
    finally:
        _remove_socket(server)
    return 0


def _listen(path: str) -> socket.socket | None:
    """Listen on ``path``, unless another server already answers there (a stale socket of a
    server that died is replaced)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return None  # a live server
    except FileNotFoundError:
        pass
    except OSError:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    finally:
        probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket itself 0600 (its directory is the user's alone anyway)
    try:
        listener.bind(path)
    except OSError:
        listener.close()
        return None  # another server bound it first
    finally:
        os.umask(old)
    listener.listen(16)
    return listener


def _remove_socket(server: _Server) -> None:
    try:
        if os.stat(server.path).st_ino == server.inode:
            os.unlink(server.path)
    except OSError:
        pass
    server.listener.close()


def _serve(server: _Server) -> None:
    wake_r, wake_w = server.wakeup = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stop = False

    def on_term(sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True
        _log(f"stopping: signal {sig}")

    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd says a copy ended
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    selector = selectors.DefaultSelector()
    selector.register(server.listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "signal")
    try:
        while not stop:
            idle_for = time.monotonic() - server.last_activity
            if not server.runs and (idle_for >= server.linger or server.stopping):
                _log("stopping: " + ("told to" if server.stopping else f"no run for {server.linger:g}s"))
                return
            if server.stopping and server.listener.fileno() >= 0:
                selector.unregister(server.listener)
                _remove_socket(server)  # no new run reaches it
            timeout = None if server.runs else max(0.0, server.linger - idle_for)
            for selected, _ in selector.select(timeout):
                if selected.data == "accept":
                    _accept(server, selector)
                elif selected.data == "signal":
                    while True:
                        try:
                            if not os.read(wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                    _reap(server, selector)
                else:
                    _client_event(server, selector, selected.data)
    finally:
        signal.set_wakeup_fd(-1)
        selector.close()
        os.close(wake_r)
        os.close(wake_w)


def _accept(server: _Server, selector: selectors.BaseSelector) -> None:
    try:
        conn, _ = server.listener.accept()
    except OSError:
        return
    server.last_activity = time.monotonic()
    uid = peer_uid(conn)
    if uid != os.geteuid():
        _log(f"refused a connection of uid {uid}")
        conn.close()  # another user's command: never run as ours
        return
    conn.settimeout(_REQUEST_TIMEOUT)
    try:
        request, fds = runwire.receive(conn, want_fds=runwire.FDS)
    except (OSError, runwire.WireError):
        conn.close()
        return
    if request is None:
        conn.close()
        return
    if request.get("stop") is True and request.get("protocol") == runwire.PROTOCOL:
        runwire._close(fds)
        conn.close()
        server.stopping = True  # runs under way go on; no new one is taken
        return
    why = _refusal(request, fds, server.key)
    if why:
        _log(f"not serving a run: {why}")
        runwire._close(fds)
        try:
            runwire.send(conn, {"local": why})
        except OSError:
            pass
        conn.close()
        return
    conn.settimeout(None)
    pid = os.fork()
    if pid == 0:
        _become_the_run(server, selector, conn, request, fds)  # never returns
    runwire._close(fds)
    server.runs[pid] = _Run(conn, pid)
    selector.register(conn, selectors.EVENT_READ, pid)


def _refusal(request: dict[str, object], fds: list[int], key: str) -> str:
    if request.get("protocol") != runwire.PROTOCOL:
        return f"protocol {request.get('protocol')!r}, not {runwire.PROTOCOL}"
    if request.get("key") != key:
        return "another process context"
    if len(fds) != runwire.FDS:
        return f"{len(fds)} descriptors, not {runwire.FDS}"
    argv, env = request.get("argv"), request.get("env")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return "argv is not a list of strings"
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return "env is not a map of strings"
    if not isinstance(request.get("argv0"), str) or not isinstance(request.get("umask"), int):
        return "argv0 or umask missing"
    return ""


def _client_event(server: _Server, selector: selectors.BaseSelector, pid: int) -> None:
    """The client of a running copy sent something or went away: only going away means anything."""
    run = server.runs.get(pid)
    if run is None:
        return
    try:
        data = run.conn.recv(1, socket.MSG_PEEK)
    except OSError:
        data = b""
    if data:
        run.conn.recv(4096)  # nothing is expected from it; read and drop
        return
    # The client was killed (it never leaves a run of its own accord): so is the run.
    selector.unregister(run.conn)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(server: _Server, selector: selectors.BaseSelector) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        run = server.runs.pop(pid, None)
        if run is None:
            continue
        server.last_activity = time.monotonic()
        final = (
            {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.waitstatus_to_exitcode(status)}
        )
        try:
            runwire.send(run.conn, final)  # after the copy's own report, if it made one: ignored
        except OSError:
            pass
        try:
            selector.unregister(run.conn)
        except (KeyError, ValueError):
            pass
        run.conn.close()


def _become_the_run(
    server: _Server,
    selector: selectors.BaseSelector,
    conn: socket.socket,
    request: dict[str, object],
    fds: list[int],
) -> None:
    """In the forked copy: take the client's place, run its command line, report, exit."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        server.listener.close()
        for run in server.runs.values():
            run.conn.close()
        selector.close()
        for fd in server.wakeup:
            os.close(fd)
        os.setpgid(0, 0)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.fchdir(fds[3])
        runwire._close(fds)
        os.umask(int(str(request["umask"])))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        import tempfile

        tempfile.tempdir = None  # chosen again from this environment's TMPDIR, if anything asked already
        argv = [str(a) for a in request["argv"]] if isinstance(request["argv"], list) else []
        sys.argv = [str(request["argv0"]), *argv]
        sys.stdout.reconfigure(line_buffering=os.isatty(1))  # type: ignore[union-attr]
        try:
            runwire.send(conn, {"pid": os.getpid()})
        except OSError:
            os._exit(1)  # the client gave up waiting and runs the command itself: never run it twice
        from driversdk import cli

        try:
            code = cli.main(argv)
        except SystemExit as done:  # argparse's refusals
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            runwire.send(conn, {"exit": code})
        except OSError:
            pass
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
