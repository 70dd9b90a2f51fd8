"""``driversdk run`` handed to the run server, when one serves this process context.

Most of a short run's time is Python loading driversdk (the runner, grpc, protobuf, the data
model: ~0.3 s) before the first container is created. A run server (driversdk.runner.runserver)
has all of that loaded and forks a copy of itself per run, as Mercurial's command server does for
``chg``: the copy takes this process's argv, environment, umask, working directory and standard
streams, runs exactly what this process would have run, and reports its exit, which this process
then exits with. Signals this process gets (Ctrl-C, SIGTERM, SIGHUP, Ctrl-Z) are passed on to it;
if this process is killed, so is the run (as a killed ``driversdk run`` process would be).

A server only serves the process context it was started in (driversdk.codeid.context_key: the
code, the interpreter, namespaces, cgroups, credentials, limits); the socket's name is derived
from that key, so a command from another context, or after the code changed, never reaches it.
When no server answers, the run happens here as always, and a server is started in the
background for the next one; it stops by itself after ``DRIVERSDK_LINGER`` without a run.
Whatever goes wrong before the run's copy has started also means the run happens here.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from types import FrameType

from driversdk.runner import runwire

HAND_OVER_TIMEOUT = 30.0  # seconds for a server to answer a request with the run's pid
# Passed on to the run as they come (SIGTSTP is passed on, then this process stops itself).
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGCONT, signal.SIGWINCH)  # fmt: skip


def run_by_server(argv0: str, argv: list[str]) -> int | None:
    """The exit code of the run a server made of ``argv``; None when it is to run here."""
    linger = _linger()
    if linger is None:
        return None
    from driversdk import privatedir
    from driversdk.codeid import context_key

    directory = privatedir.private_dir(create=True)
    if directory is None:
        return None
    key = context_key()
    path = runwire.socket_path(directory, key)
    if path is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        _start_server(path, linger)
        return None
    from driversdk.peercred import peer_uid

    if peer_uid(sock) != os.geteuid():
        # Never hand our environment (secrets), streams and command line to another user's
        # process, whatever made its socket reachable at our path.
        sock.close()
        return None
    try:
        pid = _hand_over(sock, key, argv0, argv)
        if pid is None:
            sock.close()
            return None
        return _follow(sock, pid)
    finally:
        sock.close()


def _linger() -> float | None:
    from driversdk.errors import DriverSDKError
    from driversdk.runner.linger import linger_seconds

    try:
        seconds = linger_seconds()
    except DriverSDKError:
        return None  # the run here says what is wrong with it
    return seconds if seconds > 0 else None


def _hand_over(sock: socket.socket, key: str, argv0: str, argv: list[str]) -> int | None:
    """Send the request; the pid of the run's process once it started, None if it did not."""
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        cwd = os.open(".", os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return None  # no working directory to hand over (removed): run here, and fail here
    request = {
        "protocol": runwire.PROTOCOL,
        "key": key,
        "argv0": argv0,
        "argv": argv,
        "env": dict(os.environ),
        "umask": umask,
    }
    # A server answers at once; one that does not (stuck, or busy with a client that never sent
    # its request) is given up on, and the run happens here. Closing the connection makes sure it
    # never runs it too: a copy that cannot tell this process its pid exits without running, and
    # the server kills a copy whose client went away.
    sock.settimeout(HAND_OVER_TIMEOUT)
    try:
        runwire.send(sock, request, [0, 1, 2, cwd])
        reply, _ = runwire.receive(sock)
    except (OSError, runwire.WireError, ValueError):
        return None
    finally:
        os.close(cwd)
    sock.settimeout(None)
    if reply is None or not isinstance(reply.get("pid"), int):
        return None  # the server declined ({"local": why}) or went away: run here
    return int(reply["pid"])


def _follow(sock: socket.socket, pid: int) -> int:
    """Pass signals on to the run until it reports its exit; that exit, as this process's."""
    try:
        target = os.pidfd_open(pid)
    except OSError:
        target = -1  # already gone: its exit is on its way

    def send(sig: int) -> None:
        try:
            if target >= 0:
                signal.pidfd_send_signal(target, sig)
        except OSError:
            pass  # it has ended

    def forward(sig: int, _frame: FrameType | None) -> None:
        send(sig)

    def suspend(sig: int, _frame: FrameType | None) -> None:
        send(signal.SIGTSTP)
        os.kill(os.getpid(), signal.SIGSTOP)  # resumed by SIGCONT, which is passed on too

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    signal.signal(signal.SIGTSTP, suspend)
    try:
        while True:
            try:
                message, _ = runwire.receive(sock)
            except (OSError, runwire.WireError) as err:
                message = None
                sys.stderr.write(f"error: lost the run server's connection ({err})\n")
            if message is None:
                sys.stderr.write("error: the run server went away before the run reported its exit\n")
                return 1
            if isinstance(message.get("exit"), int):
                return int(message["exit"])
            if isinstance(message.get("signal"), int):
                return _die_like(int(message["signal"]))
    finally:
        if target >= 0:
            os.close(target)


def _die_like(sig: int) -> int:
    """End as the run ended (killed by ``sig``), so a shell sees what it would have seen."""
    try:
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass
    return 128 + sig


def _start_server(path: str, linger: float) -> None:
    """Start the server for the next run, detached (its own session, no stdio of ours). Nothing
    here fails the run: a server that cannot start only means the next run runs here too."""
    import json
    import subprocess

    # The same interpreter with the same flags and module search path: its context key is ours.
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    command = [sys.executable, *flags, "-m", "driversdk.runner.runserver", path, f"{linger:g}", json.dumps(sys.path)]
    try:
        subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        pass
