"""The host side of go-plugin: launch a plugin, check its handshake, connect, and kill it.

``launch_plugin`` gives the plugin the environment a Nomad client gives it, so a plugin that
loads here loads in Nomad, and turns every way a launch can fail into one sentence.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from driversdk.childwait import wait_child
from driversdk.errors import HandshakeError, PluginError
from driversdk.plugin.handshake import (
    APP_PROTOCOL_VERSION,
    ENV_CHECKS_ONLY,
    ENV_MAX_PORT,
    ENV_MIN_PORT,
    ENV_PROTOCOL_VERSIONS,
    MAGIC_COOKIE_KEY,
    MAGIC_COOKIE_VALUE,
    Handshake,
)
from driversdk.plugin.reattach import ReattachConfig
from driversdk.plugin.verify import CheckedSocket, check_plugin_socket, process_start_time

if TYPE_CHECKING:
    # Imported where it is used: a host can spawn a plugin before it has loaded grpc, and load
    # grpc while the plugin boots (see StartingPlugin).
    import grpc

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
]
STDERR_TAIL_LINES = 10
# How long a plugin that will not be connected to has to stop on SIGTERM before it is killed.
ABANDON_GRACE = 1.0


def remove_dead_plugin_socket(config: ReattachConfig) -> bool:
    """Remove the private socket dir (``plugin-*``, made by the plugin with mkdtemp) of a plugin
    that died without removing it: SIGKILLed, or killed with the host that launched it, whose
    next run finds only the reattach config in its state. Whether something was removed.

    Only what such a plugin leaves is touched: the process is gone, the directory is a real
    directory of ours named ``plugin-*``, and it holds nothing but its socket. A plugin that
    lives on, a socket in a shared ``PLUGIN_UNIX_SOCKET_DIR``, or a directory holding anything
    else is left alone."""
    import stat

    if config.network != "unix" or pid_alive(config.pid):
        return False
    directory, name = os.path.split(config.address)
    if not os.path.basename(directory).startswith("plugin-"):
        return False
    try:
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False
        entries = os.listdir(directory)
        if not set(entries) <= {name}:
            return False
        if not all(stat.S_ISSOCK(os.lstat(os.path.join(directory, entry)).st_mode) for entry in entries):
            return False
        for entry in entries:
            os.unlink(os.path.join(directory, entry))
        os.rmdir(directory)
    except OSError:
        return False  # gone already, or changed under us: leave it
    return True


def plugin_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a Nomad client gives a plugin: its own plus the go-plugin variables."""
    env = dict(os.environ if extra is None else extra)
    env[MAGIC_COOKIE_KEY] = MAGIC_COOKIE_VALUE
    env[ENV_PROTOCOL_VERSIONS] = str(APP_PROTOCOL_VERSION)
    env.setdefault(ENV_MIN_PORT, "10000")
    env.setdefault(ENV_MAX_PORT, "25000")
    return env


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _connect(address: str, timeout: float, dial: str | None = None) -> grpc.Channel:
    """A channel to the plugin at ``address``, dialled through ``dial`` when given (a path to the
    same socket that cannot be swapped: :class:`~driversdk.plugin.verify.CheckedSocket`)."""
    import grpc

    channel = grpc.insecure_channel(f"unix:{dial or address}", options=CHANNEL_OPTIONS)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        raise PluginError(f"the plugin's socket {address} did not accept a connection within {timeout:.0f}s") from None
    return channel


class PluginProcess:
    """A running plugin: its gRPC channel, and how to stop it the way go-plugin's host does."""

    def __init__(
        self,
        channel: grpc.Channel,
        reattach_config: ReattachConfig,
        popen: subprocess.Popen[bytes] | None,
        name: str,
        stderr_tail: collections.deque[str] | None = None,
        checked: CheckedSocket | None = None,
    ) -> None:
        self.channel = channel
        # A reattached plugin's channel dials through the descriptor of its checked socket dir.
        self._checked = checked
        self.reattach_config = reattach_config
        self.pid = reattach_config.pid
        self.name = name
        self._popen = popen
        self._stderr_tail = stderr_tail if stderr_tail is not None else collections.deque(maxlen=STDERR_TAIL_LINES)
        self._killed = False

    @property
    def address(self) -> str:
        return self.reattach_config.address

    def stderr_tail(self) -> list[str]:
        return list(self._stderr_tail)

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return pid_alive(self.pid)

    def exited_within(self, timeout: float) -> bool:
        """True once the process has exited, waiting at most ``timeout`` seconds: a stream broken by
        a plugin's death can be seen a moment before the process is gone."""
        return self._wait_exit(timeout)

    def _wait_exit(self, timeout: float) -> bool:
        if self._popen is not None:
            return wait_child(self._popen, timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(self.pid):
                return True
            time.sleep(0.02)
        return not pid_alive(self.pid)

    def kill(self, timeout: float = 2.0) -> None:
        """GRPCController.Shutdown, wait up to ``timeout`` seconds, then SIGKILL. Idempotent."""
        if self._killed:
            return
        self._killed = True
        if self.alive():
            import grpc

            from driversdk.pb import grpc_controller_pb2, grpc_controller_pb2_grpc

            with contextlib.suppress(grpc.RpcError):
                grpc_controller_pb2_grpc.GRPCControllerStub(self.channel).Shutdown(
                    grpc_controller_pb2.Empty(), timeout=timeout
                )
            if not self._wait_exit(timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self._wait_exit(5.0)
        self._close_channel()
        self._remove_orphaned_socket()

    def disconnect(self) -> None:
        """Close our channel and leave the process running (a later host reattaches to it)."""
        self._killed = True  # nothing of ours to stop any more
        self._close_channel()

    def _close_channel(self) -> None:
        self.channel.close()
        if self._checked is not None:
            self._checked.close()

    def _remove_orphaned_socket(self) -> None:
        """A plugin that was SIGKILLed could not remove its private socket dir; do it for it."""
        if not self.alive():
            remove_dead_plugin_socket(self.reattach_config)

    def __enter__(self) -> PluginProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def _pump_stderr(stream: IO[bytes], logger: logging.Logger, tail: collections.deque[str]) -> None:
    # Imported on this thread, not with the module: a host starts its plugins before it loads the
    # rest (validation loads the runner while they boot), and the hclog parser brings json and datetime.
    from driversdk.plugin.log import parse_hclog_line

    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if not line:
            continue
        tail.append(line)
        level, message, fields = parse_hclog_line(line)
        logger.log(level, message, extra={"plugin_fields": fields} if fields else None)
    stream.close()


def _pump_stdout(stream: IO[bytes], lines: queue.Queue[str | None]) -> None:
    first = True
    for raw in iter(stream.readline, b""):
        if first:
            lines.put(raw.decode("utf-8", "replace"))
            first = False
        # After the handshake, go-plugin hosts keep reading and discarding stdout.
    lines.put(None)
    stream.close()


class StartingPlugin:
    """A plugin process started and not yet connected to (:func:`spawn_plugin`).

    Starting is split from connecting so a host can do its own work while the plugin boots (an
    interpreter and its imports take as long as the host's): ``driversdk validate`` spawns the
    plugins a job needs, then loads the gRPC client side, then connects."""

    def __init__(self, popen: subprocess.Popen[bytes], label: str) -> None:
        self._popen = popen
        self.label = label
        # Read while the child is ours and unreaped, so it is the launched process's own.
        self.start_time = process_start_time(popen.pid) or 0
        self._tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._lines: queue.Queue[str | None] = queue.Queue()
        logger = logging.getLogger(f"driversdk.plugin.{label}")
        assert popen.stdout is not None and popen.stderr is not None
        self._err_thread = threading.Thread(target=_pump_stderr, args=(popen.stderr, logger, self._tail), daemon=True)
        self._out_thread = threading.Thread(target=_pump_stdout, args=(popen.stdout, self._lines), daemon=True)
        self._err_thread.start()
        self._out_thread.start()
        self._handshake_line: str | None = None  # once connect has read it

    @property
    def pid(self) -> int:
        return self._popen.pid

    def _give_up(self, message: str) -> HandshakeError:
        self.abandon()
        if self._tail:
            message += "; its last stderr lines: " + " | ".join(self._tail)
        return HandshakeError(message)

    def abandon(self) -> None:
        """Stop a plugin that will not be connected to, and reap it.

        SIGTERM first: a driversdk plugin that is serving stops and removes its private socket
        dir, and one still importing dies of it before it has made one. Whatever has not exited
        within ABANDON_GRACE is killed; the socket dir its handshake named, if it printed one, is
        then removed for it (:func:`remove_dead_plugin_socket`)."""
        if self._popen.poll() is None:
            self._popen.terminate()
            try:
                self._popen.wait(ABANDON_GRACE)
            except subprocess.TimeoutExpired:
                self._popen.kill()
        self._popen.wait()
        self._err_thread.join(timeout=2)
        self._out_thread.join(timeout=2)
        line = self._handshake_line
        if line is None:
            with contextlib.suppress(queue.Empty):
                line = self._lines.get_nowait()
        if line:
            try:
                handshake = Handshake.parse(line)
            except HandshakeError:
                return  # no handshake of ours: nothing we know of to remove
            remove_dead_plugin_socket(ReattachConfig(self._popen.pid, handshake.network, handshake.address))

    def connect(self, timeout: float = 60.0) -> PluginProcess:
        """Wait for the handshake (at most ``timeout`` seconds), check it, and connect."""
        label = self.label
        try:
            first = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise self._give_up(
                f"plugin {label!r} did not print its handshake within {timeout:.0f}s; it was killed"
            ) from None
        self._handshake_line = first
        if first is None:
            code = self._popen.wait()
            raise self._give_up(
                f"plugin {label!r} exited (code {code}) before completing the handshake; it is not a plugin, "
                "or it refused the host"
            )
        try:
            handshake = Handshake.parse(first)
        except HandshakeError as err:
            raise self._give_up(f"plugin {label!r}: {err}") from None
        try:
            channel = _connect(handshake.address, min(timeout, 30.0))
        except PluginError as err:
            raise self._give_up(f"plugin {label!r}: {err}") from None
        config = ReattachConfig(
            self._popen.pid,
            handshake.network,
            handshake.address,
            handshake.protocol,
            handshake.app_version,
            self.start_time,
        )
        return PluginProcess(channel, config, self._popen, label, self._tail)


def spawn_plugin(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    checks_only: bool = False,
) -> StartingPlugin:
    """Start ``cmd`` as a go-plugin plugin; :meth:`StartingPlugin.connect` finishes the launch.
    ``checks_only``: the plugin will only be asked for its schemas, config and fingerprint
    (``ENV_CHECKS_ONLY``)."""
    label = name or os.path.basename(cmd[0])
    environment = plugin_environment(env)
    # Never inherited from a host that was itself so launched.
    if checks_only:
        environment[ENV_CHECKS_ONLY] = "1"
    else:
        environment.pop(ENV_CHECKS_ONLY, None)
    try:
        popen = subprocess.Popen(
            list(cmd),
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as err:
        raise PluginError(f"cannot start plugin {cmd[0]!r}: {err.strerror}") from None
    return StartingPlugin(popen, label)


def launch_plugin(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    name: str | None = None,
) -> PluginProcess:
    """Start ``cmd`` as a go-plugin plugin, check its handshake, and connect to it."""
    return spawn_plugin(cmd, env=env, name=name).connect(timeout)


def reattach_plugin(config: ReattachConfig, *, name: str = "plugin", timeout: float = 10.0) -> PluginProcess:
    """Connect again to a plugin launched by an earlier host process, once it is proved to be
    that process (:func:`~driversdk.plugin.verify.check_plugin_socket`). Raises
    :class:`~driversdk.plugin.verify.PluginGone` when it has exited (launch a new one) and
    :class:`~driversdk.plugin.verify.ReattachRefused` when something else is at its pid or socket:
    nothing has been sent to it then."""
    checked = check_plugin_socket(config, name, timeout)
    try:
        channel = _connect(config.address, timeout, dial=checked.path)
    except BaseException:
        checked.close()
        raise
    return PluginProcess(channel, config, None, name, checked=checked)


def rpc_call_of(err: grpc.RpcError) -> grpc.Call | None:
    """The failed call behind ``err`` (its code, details, trailing metadata), if it has one.

    What a stub raises is both an RpcError and a Call (grpc's ``_InactiveRpcError``), but the
    published stubs give the two classes conflicting method signatures, so ``isinstance(err,
    grpc.Call)`` reads as impossible to mypy and it stops checking whatever follows it.
    """
    import grpc

    obj: object = err
    return obj if isinstance(obj, grpc.Call) else None


# ReattachConfig is part of this module's API: a host launches and reattaches with it, so its callers
# may take it from here as well as from driversdk.plugin.reattach, where it is defined.
__all__: list[Any] = [
    "PluginProcess",
    "ReattachConfig",
    "StartingPlugin",
    "launch_plugin",
    "plugin_environment",
    "reattach_plugin",
    "rpc_call_of",
    "spawn_plugin",
]
