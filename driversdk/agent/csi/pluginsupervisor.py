"""The CSI plugin supervisor of ``driversdk run``, for tasks with a ``csi_plugin`` block.

Before the task starts it lays out the plugin's directories and hands the task two
bidirectional mounts (the socket dir at ``mount_dir``, the staging/publish tree at
``stage_publish_base_dir``) and ``CSI_ENDPOINT``. Once the task runs it probes the socket every
5 s until the plugin is healthy (or ``health_timeout`` passes), registers it in the node's
plugin registry, then heartbeats every 30 s and reports health changes as task events. On stop
it deregisters and removes the socket dir. Timings and event texts follow Nomad (csi reference §5),
but for one thing: while the socket does not exist yet, the wait between probes watches for it
(every 50 ms) and probes as soon as it appears, instead of sleeping out the 5 s interval a plugin
that starts in a fraction of a second would otherwise pay before its first claim.

An instance that is going away is never handed to a claim: stop() deregisters it before anything
else (the task is stopped after), and so does the heartbeat as soon as the task has exited; claims
take the newest registered instance whose socket accepts a connection, so one whose process died
(its socket gone or refusing, its run killed before it could deregister) is passed over.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable

from driversdk.agent.csi.manager import sweep_mount_root
from driversdk.agent.csi.registry import PluginRegistration, PluginRegistry
from driversdk.csi.cancel import CallCancelled, Cancel
from driversdk.csi.client import CSIClient
from driversdk.csi.errors import CSIError
from driversdk.durations import parse_duration
from driversdk.errors import DriverSDKError
from driversdk.jobspec.job import Task
from driversdk.mountinfo import find_mount, read_mountinfo
from driversdk.mounts import MountRequest
from driversdk.paths import resolve_under

PROBE_INTERVAL = 5.0
SOCKET_POLL = 0.05  # how often the wait for ready looks for a socket that is not there yet
PROBE_TIMEOUT = 5.0
HEARTBEAT_INTERVAL = 30.0
ROLES = {"node": ("csi-node",), "controller": ("csi-controller",), "monolith": ("csi-controller", "csi-node")}


class SupervisorError(DriverSDKError):
    """The plugin directories could not be prepared."""


def go_duration(seconds: float) -> str:
    """Seconds as Go prints a duration in the health-timeout message: 30s, 1m30s, 1h0m0s."""
    whole = int(seconds)
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if whole < 60:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


# sun_path holds 108 bytes with the terminating NUL; gRPC refuses longer unix: targets outright.
MAX_SOCKET_PATH = 107
ALLOC_ID_LENGTH = 36


def socket_path_problem(data_dir: str) -> str | None:
    """The plugin socket lives at <data_dir>/client/csi/plugins/<alloc id>/csi.sock; say so when
    that cannot be a unix socket path, before anything starts."""
    example = os.path.join(csi_dir(data_dir), "plugins", "x" * ALLOC_ID_LENGTH, "csi.sock")
    if len(example) <= MAX_SOCKET_PATH:
        return None
    return (
        f"the CSI plugin socket path under data_dir {data_dir!r} would be {len(example)} characters "
        f"({os.path.dirname(os.path.dirname(example))}/<alloc id>/csi.sock) and unix sockets allow "
        f"{MAX_SOCKET_PATH}; use a data_dir at most {len(data_dir) - (len(example) - MAX_SOCKET_PATH)} characters long"
    )


def csi_dir(data_dir: str) -> str:
    """``<state>/csi``: plugin roots and sockets live below it (``<state>`` = ``<data_dir>/client``)."""
    return os.path.join(data_dir, "client", "csi")


def ensure_shared(path: str) -> bool:
    """Make ``path`` sit on a shared mount, so mounts a plugin makes below it reach the host and
    the tasks (bidirectional and host-to-task need that). Binds the dir onto itself when needed;
    returns True when it did."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    if find_mount(path).shared:
        return False
    for args in (["mount", "--bind", path, path], ["mount", "--make-shared", path]):
        done = subprocess.run(args, capture_output=True, text=True)
        if done.returncode != 0:
            raise SupervisorError(
                f"could not make {path} a shared mount for the CSI plugin's bidirectional mounts "
                f"({' '.join(args)}: {done.stderr.strip()}); run as root, or make the data_dir's mount shared "
                f"(mount --make-rshared on it)"
            )
    return True


def release_shared(path: str) -> None:
    """Undo :func:`ensure_shared` once nothing is mounted below the dir any more."""
    entries = read_mountinfo()
    if not any(e.mount_point == path for e in entries):
        return
    if any(e.mount_point.startswith(path.rstrip("/") + "/") for e in entries):
        return  # a plugin's staging or publish mount is still there
    subprocess.run(["umount", path], capture_output=True, check=False)


def answers(socket_path: str) -> bool:
    """Whether something listens on a plugin's socket now (a connect that does not wait): a
    socket that is gone or refuses is an instance whose task died or is stopping."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        probe.connect(socket_path)
    except BlockingIOError:
        return True  # listening, its backlog full: alive and busy
    except OSError as err:
        return err.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOTDIR)
    finally:
        probe.close()
    return True


def socket_present(path: str) -> bool:
    """Whether a unix socket is at ``path`` itself: the plugin owns the dir, so a symlink there is
    not followed (it is not the plugin's socket; the next interval's probe says what is wrong)."""
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def live_instance(registry: PluginRegistry, kind: str, name: str) -> PluginRegistration | None:
    """The newest registered instance of a plugin whose socket answers; else the newest one (its
    error then names it), or None."""
    instances = registry.instances(kind, name)
    return next((reg for reg in instances if answers(reg.socket_path)), instances[0] if instances else None)


def wait_for_live_plugin(
    registry: PluginRegistry, kind: str, name: str, timeout: float, cancel: Cancel | None = None
) -> PluginRegistration:
    """The newest registered instance of a plugin that answers, waited for up to ``timeout``
    (polled from 200 ms, doubling to 1 s); ``cancel`` ends the wait."""
    deadline = time.monotonic() + timeout
    wait = 0.2
    while True:
        for reg in registry.instances(kind, name):
            if answers(reg.socket_path):
                return reg
        if cancel is not None and cancel.cancelled:
            raise CallCancelled(
                f"{cancel.reason}: the wait for {kind} plugin '{name}' was given up", code="CANCELLED", call=kind
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CSIError(
                f"{kind} plugin '{name}' did not become ready: no live instance registered within {timeout:g}s; "
                "check that the plugin's task is running and healthy",
                code="DEADLINE_EXCEEDED",
                call="WaitForPlugin",
            )
        step = min(wait, remaining)
        if cancel is not None:
            cancel.wait(step)
        else:
            time.sleep(step)
        wait = min(wait * 2, 1.0)


class PluginSupervisor:
    def __init__(
        self,
        *,
        task: Task,
        alloc_id: str,
        data_dir: str,
        registry: PluginRegistry,
        say: Callable[[str], None],
        fs_isolated: bool = True,
        event: Callable[[str], None] | None = None,
    ) -> None:
        assert task.csi_plugin is not None
        self.task = task
        self.plugin = task.csi_plugin
        self.alloc_id = alloc_id
        self.registry = registry
        self.say = say
        # The runner reports structured events; without it, a text line through ``say``.
        self.event = event
        self.fs_isolated = fs_isolated
        self.csi_dir = csi_dir(data_dir)
        # csi_plugin.id and type come from the job file: validate refuses unsafe names, and this
        # refuses any path that would still leave the CSI dir (it is mounted rshared into the task).
        where = f'task "{task.name}": the CSI plugin directory of csi_plugin.id {self.plugin.id!r}'
        self.root = resolve_under(self.csi_dir, self.plugin.type, self.plugin.id, what=where)
        self.socket_dir = resolve_under(self.csi_dir, "plugins", alloc_id, what=f'task "{task.name}": the socket dir')
        self.socket_path = os.path.join(self.socket_dir, "csi.sock")
        self.health_timeout = parse_duration(self.plugin.health_timeout or "30s", "csi_plugin.health_timeout")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.healthy: bool | None = None
        self.failure = ""
        self.registered: list[str] = []
        self._task_done = threading.Event()
        # Ends a probe in flight when the supervisor stops: stop() must not wait out its timeout.
        self._cancel = Cancel("the plugin's supervisor is stopping")

    def _event(self, message: str, detail: str = "") -> None:
        text = message + (f": {detail}" if detail else "")
        if self.event is not None:
            self.event(text)
        else:
            self.say(f'==> task "{self.task.name}": {text}')

    # --- prestart ------------------------------------------------------------------------------

    def prestart(self) -> tuple[list[MountRequest], dict[str, str]]:
        """The mounts and environment the plugin task gets."""
        problem = socket_path_problem(os.path.dirname(os.path.dirname(self.csi_dir)))
        if problem is not None:
            raise SupervisorError(f'task "{self.task.name}": {problem}')
        for path in (self.root, self.socket_dir):
            os.makedirs(path, mode=0o700, exist_ok=True)
        ensure_shared(self.csi_dir)
        mounts = [
            MountRequest(volume="csi-plugin-socket", destination=self.plugin.mount_dir, host_path=self.socket_dir,
                         propagation="bidirectional"),
            MountRequest(volume="csi-plugin-mounts", destination=self.plugin.stage_publish_base_dir,
                         host_path=self.root, propagation="bidirectional"),
        ]  # fmt: skip
        inside = os.path.join(self.plugin.mount_dir, "csi.sock") if self.fs_isolated else self.socket_path
        env = {} if "CSI_ENDPOINT" in self.task.env else {"CSI_ENDPOINT": f"unix://{inside}"}
        return mounts, env

    # --- poststart: probe, register, heartbeat --------------------------------------------------

    def start(self, on_failure: Callable[[str], None], task_done: threading.Event | None = None) -> None:
        """Supervise in a thread; ``task_done`` (set when the task exits) ends the wait for ready early."""
        self._task_done = task_done or threading.Event()
        self._thread = threading.Thread(
            target=self._supervise, args=(on_failure,), daemon=True, name=f"csi-{self.plugin.id}"
        )
        self._thread.start()

    def _probe(self, client: CSIClient | None) -> tuple[CSIClient | None, str | None]:
        """One probe; returns the (possibly new) client and None when healthy, else the error."""
        try:
            if client is None:
                client = CSIClient(
                    self.socket_path, plugin=self.plugin.id, connect_timeout=PROBE_TIMEOUT, cancel=self._cancel
                )
            return client, None if client.probe() else "plugin is not ready"
        except CSIError as err:
            if client is not None and err.call == "connect":
                client.close()
                client = None
            return client, str(err)

    def _supervise(self, on_failure: Callable[[str], None]) -> None:
        client: CSIClient | None = None
        try:
            client, error = self._probe(client)
            waited = 0.0
            while error is not None:
                if self._task_done.is_set():
                    self.healthy = False
                    self.failure = (
                        f"the plugin task exited before the plugin became healthy (last probe: {error}); see "
                        f"`driversdk logs {self.task.name} --stderr`"
                    )
                    self._event("Plugin became unhealthy", f"Error: {self.failure}")
                    on_failure(self.failure)
                    return
                if waited >= self.health_timeout:
                    self.healthy = False
                    self._event("Plugin became unhealthy", f"Error: CSI plugin failed probe: {error}")
                    self.failure = (
                        f"CSI plugin did not become healthy before configured {go_duration(self.health_timeout)} "
                        "health timeout"
                    )
                    on_failure(self.failure)
                    return
                step = min(PROBE_INTERVAL, self.health_timeout - waited)
                waited += self._wait_to_probe(step)
                if self._stop.is_set():
                    return
                client, error = self._probe(client)
            self.healthy = True
            self._event("Plugin became healthy", f"plugin: {self.plugin.id}")
            assert client is not None
            try:
                self._register(client)
            except CSIError as err:
                self._deregister()
                self.failure = f"CSI plugin failed to register: {err}"
                on_failure(self.failure)
                return
            while not self._heartbeat_wait():
                if self._task_done.is_set():
                    # The task exited for good: no claim may be handed this instance. (One that
                    # only fails its probe stays registered, as in Nomad: its task may restart;
                    # claims skip it meanwhile, see wait_for_live_plugin.)
                    self._deregister()
                    if self.healthy:
                        self._event("Plugin became unhealthy", "Error: the plugin task is gone")
                    self.healthy = False
                    return
                client, error = self._probe(client)
                if error is None and not self.healthy:
                    self._event("Plugin became healthy", f"plugin: {self.plugin.id}")
                elif error is not None and self.healthy:
                    self._event("Plugin became unhealthy", f"Error: {error}")
                self.healthy = error is None
        finally:
            if client is not None:
                client.close()

    def _wait_to_probe(self, step: float) -> float:
        """Wait up to ``step`` before the next probe while not ready; returns the time waited.
        Wakes early when the task exits (the probe in between still gets its chance), and when the
        socket appears where there was none: a plugin that just started listening is probed now."""
        absent = not socket_present(self.socket_path)
        start = time.monotonic()
        deadline = start + step
        while not self._stop.is_set() and not self._task_done.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or (absent and socket_present(self.socket_path)):
                break
            self._stop.wait(min(SOCKET_POLL if absent else 0.1, left))
        return time.monotonic() - start

    def _heartbeat_wait(self) -> bool:
        """Wait for the next heartbeat, waking early when the task exits; True when stopping."""
        deadline = time.monotonic() + HEARTBEAT_INTERVAL
        while not self._task_done.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self._stop.wait(min(0.5, left)):
                return True
        return self._stop.is_set()

    def _register(self, client: CSIClient) -> None:
        info = client.plugin_info()
        for kind in ROLES[self.plugin.type]:
            self.registry.register(
                PluginRegistration(
                    type=kind,
                    name=self.plugin.id,
                    alloc_id=self.alloc_id,
                    socket_path=self.socket_path,
                    version=info.vendor_version,
                    options={
                        "Provider": info.name,
                        "MountPoint": self.root,
                        "ContainerMountPoint": self.plugin.stage_publish_base_dir,
                    },
                )
            )
            self.registered.append(kind)

    def _deregister(self) -> None:
        for kind in ROLES[self.plugin.type]:
            self.registry.deregister(kind, self.plugin.id, self.alloc_id)
        self.registered.clear()

    # --- stop ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Deregister, then stop supervising; the task itself is stopped by the alloc after this,
        so no claim is handed an instance that is being stopped."""
        self._stop.set()
        self._deregister()
        self._cancel.cancel()  # a probe in flight ends now
        if self._thread is not None:
            self._thread.join(PROBE_TIMEOUT + 5)
        self._deregister()  # registered by the thread meanwhile

    def cleanup(self) -> None:
        """After the task is gone: remove the socket dir; the plugin's mount tree when no other
        instance of it uses that tree (it may have kept staging paths, see csi.manager); and the
        shared bind when it was the last plugin."""
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        plugins_dir = os.path.dirname(self.socket_dir)
        try:
            os.rmdir(plugins_dir)
        except OSError:
            pass  # another plugin alloc still has its socket dir there
        if not any(self.plugin.id in self.registry.plugins(kind) for kind in ROLES[self.plugin.type]):
            sweep_mount_root(self.root)
        if not any(self.registry.plugins(kind) for kind in ("csi-node", "csi-controller")):
            release_shared(self.csi_dir)
