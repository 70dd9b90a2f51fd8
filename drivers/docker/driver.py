"""The docker task driver: containers on a real Docker engine through the docker SDK."""

from __future__ import annotations

import logging
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from drivers.docker import pinrecord, reconcile
from drivers.docker.config import PluginConfig, TaskDockerConfig, plugin_spec, task_spec
from drivers.docker.fingerprint import fingerprint as read_fingerprint
from drivers.docker.handle import STATE_VERSION, ContainerHandle, DriverState
from drivers.docker.images import ImageGC, ensure_image, pull_image, split_reference
from drivers.docker.labels import LABEL_ALLOC_ID, LABEL_TASK_ID
from drivers.docker.logs import LogCollector
from drivers.docker.probe import EngineProbe, engine_socket
from drivers.docker.pulls import PullCoordinator
from drivers.docker.stats import sample_stats
from driversdk.driver import DriverPlugin, ExecSession
from driversdk.errors import ConfigError, DriverError, TaskNotFoundError
from driversdk.hclspec import Spec
from driversdk.model import (
    AgentConfig,
    Capabilities,
    ExecResult,
    ExitResult,
    Fingerprint,
    FSIsolation,
    HealthState,
    MountConfigSupport,
    NetworkIsolationMode,
    NetworkIsolationSpec,
    NetworkOverride,
    TaskConfig,
    TaskEvent,
    TaskHandle,
    TaskState,
    TaskStats,
    TaskStatus,
)
from driversdk.mounts import ensure_mounts_usable
from driversdk.signals import signal_name

if TYPE_CHECKING:
    from drivers.docker import engine as sdk
else:
    from drivers.docker import sdk  # the docker SDK, loaded on first use

log = logging.getLogger("driversdk.docker")

# Connections kept per engine connection pool (the docker SDK keeps one pool per request URL, 10
# by default). Every task's StartTask asks for its image at the same URL: a group of 100 tasks
# starting together returns 100 connections to that pool at once, and beyond the bound urllib3
# discards them with a warning that reads the pool's size, racing the SDK's closing of pools it
# evicts (its least recently used, past 25): the StartTask then fails with "'NoneType' object has
# no attribute 'qsize'". The bound is kept above what a host starts at once (a pool only keeps the
# connections that were in use at the same time).
ENGINE_POOL_SIZE = 512

PAUSE_PREFIX = "nomad_init_"
# How long a stats request waits for an engine that went away before ending the stream.
STATS_ENGINE_WAIT = 60.0


def _docker_time(text: str | None) -> datetime | None:
    if not text or text.startswith("0001-01-01"):
        return None
    main, _, frac = text.rstrip("Z").partition(".")
    when = datetime.fromisoformat(main).replace(tzinfo=UTC)
    return when.replace(microsecond=int(frac[:6].ljust(6, "0"))) if frac else when


def _unreachable(err: BaseException) -> bool:
    """The engine did not answer (refused, reset, timed out), as opposed to answering with an error."""
    if isinstance(err, sdk.APIError):
        return False
    return isinstance(err, sdk.requests.exceptions.RequestException | sdk.DockerException)


@contextmanager
def _engine_call(what: str) -> Iterator[None]:
    """Turn an engine that does not answer into a sentence (and no traceback in our log)."""
    try:
        yield
    except Exception as err:
        if not _unreachable(err):
            raise
        raise DriverError(
            f"{what}: cannot reach the docker daemon ({err}); check that dockerd is running", recoverable=True
        ) from None


def _privileged_hint(privileged: bool, explanation: str) -> str:
    """What to do when the engine cannot grant ``privileged``: an engine that itself runs with a
    reduced capability set (a sandbox, rootless docker) fails to apply the full set at start."""
    if not privileged or ("apply caps" not in explanation and "operation not permitted" not in explanation):
        return ""
    return (
        "; this docker engine cannot grant privileged mode (it lacks capabilities itself): drop "
        "privileged = true and add only the capabilities the task needs with cap_add, allowed by the docker "
        "plugin option allow_caps"
    )


class DockerDriver(DriverPlugin):
    name = "docker"
    version = "0.1.0"

    def __init__(self, warm_up: bool = True) -> None:
        super().__init__()
        # False for a driver that will start no task (built for validation): nothing is made ahead.
        self._warm_up_enabled = warm_up
        self.config = PluginConfig()
        self._api: Any = None
        self._api_lock = threading.Lock()
        self._configured = False
        self._tasks: dict[str, ContainerHandle] = {}
        self._lock = threading.Lock()
        self._detected = False
        self._healthy: bool | None = None
        self._watcher: threading.Thread | None = None
        self._shut_down = threading.Event()  # ends the engine watcher
        self._images = ImageGC()
        self._pulls = PullCoordinator()
        self._tls: sdk.docker.tls.TLSConfig | None = None
        self._reconciler: reconcile.Reconciler | None = None

    # --- configuration ---------------------------------------------------------------------

    def config_schema(self) -> Spec:
        return plugin_spec()

    def set_config(self, config: dict[str, Any], agent: AgentConfig | None) -> None:
        decoded = PluginConfig.from_decoded(config)
        # The same config again (a host that validated, then runs) keeps the client made for it.
        if not (self._configured and decoded == self.config):
            with self._api_lock:  # waits for a client being made with the old config, then drops it
                self._configured = False  # until this config is known good (its tls files load)
                self.config = decoded
                self._tls = self._tls_config()
                self._api = None
                self._configured = True
            # The engine client (the SDK, a version request) is made now, on a thread, instead of by
            # the first StartTask; an engine that does not answer is the fingerprint's to report.
            # A driver that will start no task (built for validation) leaves it to a first use.
            if self._warm_up_enabled:
                threading.Thread(target=self._warm_up, daemon=True, name="docker-client").start()
        # Pins a plugin killed mid-start left mounted in an alloc dir (see pinrecord).
        pinrecord.release_stale()
        # Nomad starts its reconciler on the first Fingerprint, for want of a post-config hook;
        # SetConfig is ours, and every host (Nomad, the runner, the test harness) sends it.
        if self._reconciler is not None:
            self._reconciler.stop()
        self._reconciler = reconcile.Reconciler(self.config.dangling, self.api, self._tracked_containers)
        self._reconciler.start()

    def shutdown(self) -> None:
        self._shut_down.set()
        if self._reconciler is not None:
            self._reconciler.stop()

    def _tracked_containers(self) -> set[str]:
        with self._lock:
            return {h.state.container_id for h in self._tasks.values()}

    def task_config_schema(self) -> Spec:
        return task_spec()

    def capabilities(self) -> Capabilities:
        return Capabilities(
            send_signals=True,
            exec=True,
            fs_isolation=FSIsolation.IMAGE,
            network_isolation_modes=(NetworkIsolationMode.HOST, NetworkIsolationMode.GROUP, NetworkIsolationMode.TASK),
            must_create_network=True,
            mount_configs=MountConfigSupport.ALL,
            disable_log_collection=self.config.disable_log_collection,
        )

    def _tls_config(self) -> sdk.docker.tls.TLSConfig | None:
        """Client TLS to the engine: only with an endpoint and any of tls { cert, key, ca } set, as in Nomad."""
        c = self.config
        if not c.endpoint or not (c.tls_cert or c.tls_key or c.tls_ca):
            return None
        if bool(c.tls_cert) != bool(c.tls_key):
            raise ConfigError("tls needs both cert and key for a client certificate; set both or neither")
        try:
            return sdk.docker.tls.TLSConfig(
                client_cert=(c.tls_cert, c.tls_key) if c.tls_cert else None,
                ca_cert=c.tls_ca or None,
                verify=bool(c.tls_ca),
            )
        except sdk.docker.errors.TLSParameterError as err:
            raise ConfigError(f"tls in the docker plugin config: {err}") from None

    def _client(self, version: str, timeout: int) -> Any:
        if self.config.endpoint:
            if self._tls is None:
                return sdk.docker.APIClient(
                    base_url=self.config.endpoint, version=version, timeout=timeout, tls=False,
                    max_pool_size=ENGINE_POOL_SIZE,
                )  # fmt: skip
            fixed = sdk.MINIMUM_DOCKER_API_VERSION if version == "auto" else version
            client: Any = sdk.docker.APIClient(
                base_url=self.config.endpoint, version=fixed, timeout=timeout, tls=self._tls,
                max_pool_size=ENGINE_POOL_SIZE,
            )  # fmt: skip
            # requests lets REQUESTS_CA_BUNDLE (and friends) in the environment replace the session's
            # CA: the configured tls.ca must be what verifies the engine, so the version is asked after.
            client.trust_env = False
            if version == "auto":
                client._version = client._retrieve_server_version()
            return client
        return sdk.docker.from_env(version=version, timeout=timeout, max_pool_size=ENGINE_POOL_SIZE).api

    def api(self) -> Any:
        with self._api_lock:
            if self._api is None:
                self._api = self._client("auto", 60)
            return self._api

    def _warm_up(self) -> None:
        try:
            self.api()
        except Exception as err:
            log.debug("the docker client could not be made yet", extra={"error": str(err)})

    # --- fingerprint -------------------------------------------------------------------------

    def _engine_reader(self) -> Any:
        """What fingerprints and the health watcher read the engine through: a probe of its unix
        socket when it is local (no SDK needed, see probe.py), else the SDK client."""
        if self._tls is None:
            path = engine_socket(self.config.endpoint, os.environ)
            if path is not None:
                return EngineProbe(path)
        return self.api()

    def fingerprint(self) -> Fingerprint:
        try:
            engine = self._engine_reader()
        except Exception:
            self._healthy = False
            return Fingerprint(HealthState.UNDETECTED, "Failed to initialize docker client")
        fp = read_fingerprint(engine, self.config, self._detected)
        self._detected = self._detected or fp.health is HealthState.HEALTHY
        self._healthy = fp.health is HealthState.HEALTHY
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch_engine, daemon=True, name="docker-watch")
            self._watcher.start()
        return fp

    def _watch_engine(self) -> None:
        # Between the 30 s re-sends, notice an engine that stops or comes back within seconds.
        while not self._shut_down.wait(2.0):
            try:
                self._engine_reader().ping()
                healthy = True
            except Exception:
                healthy = False
            if healthy != self._healthy:
                self._healthy = healthy
                self.notify_fingerprint_changed()

    # --- start -------------------------------------------------------------------------------

    def _logging_enabled(self, task: TaskConfig) -> bool:
        if self.config.disable_log_collection:
            return False
        return not (task.stdout_path == os.devnull and task.stderr_path == os.devnull)

    def _event(self, task: TaskConfig, message: str, **annotations: str) -> None:
        self.emit_event(TaskEvent(task.id, task.alloc_id, task.name, message, datetime.now(UTC), annotations))

    def start_task(self, task: TaskConfig) -> TaskHandle:
        with self._lock:
            if task.id in self._tasks:
                raise DriverError(f"task with ID {task.id!r} already started")
        cfg = TaskDockerConfig.from_decoded(task.driver_config, task.name)
        # Everything knowable on this host is checked before anything is created.
        ensure_mounts_usable(task.mounts, task=task.name)
        spec = sdk.containers.build(task, cfg, self.config)
        # Who made the container, so a reconciler of any plugin sharing this engine can tell
        # whether its owner still lives (reconcile.py); ours, whatever the job's labels say.
        spec.kwargs["labels"][reconcile.LABEL_OWNER] = reconcile.identity()
        spec.kwargs["labels"][reconcile.LABEL_TASK_DIR] = task.task_dir
        pins: sdk.containers.Pins | None = None
        try:
            try:
                api = self.api()
                image_id = ensure_image(
                    api,
                    task,
                    cfg,
                    self.config,
                    self._pulls,
                    lambda timeout: self._fresh_client(math.ceil(timeout)),
                    lambda message, **annotations: self._event(task, message, **annotations),
                )
                # Bind sources a task can change are pinned now, after the pull: the engine
                # resolves only our pins, and they go once the container holds its own mounts.
                pins = sdk.containers.pin_sources(task, spec)
                container_id, adopted = self._create(api, task, spec)
            except (sdk.requests.exceptions.ConnectionError, sdk.docker.errors.DockerException) as err:
                raise DriverError(
                    f"task {task.name!r}: cannot reach the docker daemon ({err}); check that dockerd is running",
                    recoverable=True,
                ) from None
            logs: LogCollector | None = None
            try:
                reconcile.claim(task.task_dir, container_id)
                log_state_dir = os.path.join(task.task_dir, "private", "docker-logs")
                if self._logging_enabled(task):
                    # Attached before it starts, so the copy begins at the task's first byte (logs.py).
                    logs = LogCollector(
                        api, container_id, task.stdout_path, task.stderr_path, log_state_dir, cfg.tty, not adopted
                    )
                if not adopted:
                    api.start(container_id)
                started = datetime.now(UTC)
                network = self._network_override(api, container_id, cfg)
                state = DriverState(
                    container_id=container_id,
                    image=cfg.image,
                    image_id=image_id,
                    tty=cfg.tty,
                    log_state_dir=log_state_dir,
                    logs=logs is not None,
                )
                handle = ContainerHandle(task, state, started)
                if logs is not None:
                    handle.logs = logs
                    logs.start()
            except BaseException as err:
                if logs is not None:
                    logs.stop()
                self._remove_quietly(api, container_id)
                if isinstance(err, sdk.APIError):
                    raise DriverError(
                        f"task {task.name!r}: failed to start container: {err.explanation or err}"
                        + _privileged_hint(cfg.privileged, str(err.explanation or err)),
                        recoverable=True,
                    ) from None
                if _unreachable(err):
                    raise DriverError(
                        f"task {task.name!r}: the docker daemon went away while the container was started ({err}); "
                        "check that dockerd is running",
                        recoverable=True,
                    ) from None
                raise
        finally:
            if pins is not None:
                pins.release()
        if self.config.gc_image:
            self._images.acquire(image_id, cfg.image, task.id)
        self._track(handle)
        self._event(task, f"Started container {container_id[:12]}", image=cfg.image)
        return TaskHandle(
            config=task,
            driver_state=state.encode(),
            version=STATE_VERSION,
            state=TaskState.RUNNING,
            network_override=network,
        )

    @staticmethod
    def _network_override(api: Any, container_id: str, cfg: TaskDockerConfig) -> NetworkOverride | None:
        """The address the task is reached at: the first network's IP (global IPv6 when asked).

        Read from the engine's container list, not an inspect: the list answers from the engine's
        snapshot of its containers, while an inspect takes the container's lock, which the engine
        holds while it handles an exit. A task that exits at once (a batch job's ``echo``) would
        have its StartTask wait ~0.1 s for that cleanup, only to find its address already gone.
        """
        listed = api.containers(all=True, filters={"id": container_id})
        mine = [c for c in listed if c.get("Id") == container_id]
        networks = (mine[0].get("NetworkSettings") or {}).get("Networks") or {} if mine else {}
        for name, net in networks.items():
            addr = net.get("GlobalIPv6Address") if cfg.advertise_ipv6_address else net.get("IPAddress")
            if addr:
                return NetworkOverride(addr=str(addr), auto_advertise=name not in ("bridge", "nat"))
        return None

    def _create(self, api: Any, task: TaskConfig, spec: sdk.containers.ContainerSpec) -> tuple[str, bool]:
        """Create the container; (id, True) when a running container of this task was adopted."""
        host_config = api.create_host_config(**spec.host_config)
        networking = None
        if spec.endpoint:
            mode = spec.host_config["network_mode"]
            networking = api.create_networking_config({mode: api.create_endpoint_config(**spec.endpoint)})
        last_error: Exception | None = None
        for attempt in range(spec.create_attempts):
            try:
                created = api.create_container(
                    spec.image, name=spec.name, host_config=host_config, networking_config=networking, **spec.kwargs
                )
                return str(created["Id"]), False
            except sdk.APIError as err:
                last_error = err
                if err.status_code != 409:
                    raise DriverError(
                        f"task {task.name!r}: failed to create container: {err.explanation or err}",
                        recoverable=True,
                    ) from None
                # A container with our name exists: adopt it if it runs, otherwise replace it.
                try:
                    existing = api.inspect_container(spec.name)
                except sdk.NotFound:
                    continue
                if existing["State"]["Running"] and existing["Config"]["Labels"].get(LABEL_TASK_ID) == task.id:
                    return str(existing["Id"]), True
                self._remove_quietly(api, existing["Id"])
                time.sleep(min(60.0, 0.05 * 2**attempt))
        raise DriverError(
            f"task {task.name!r}: failed to create container {spec.name!r}: {last_error}", recoverable=True
        )

    def _remove_quietly(self, api: Any, container_id: str) -> None:
        try:
            api.remove_container(container_id, force=True)
        except (sdk.APIError, sdk.NotFound):
            pass
        except Exception as err:
            if not _unreachable(err):
                raise
            # gc.dangling_containers removes it once the engine is back and we are gone.
            log.warning(
                "cannot remove container: the docker daemon does not answer", extra={"container_id": container_id}
            )

    def _track(self, handle: ContainerHandle) -> None:
        with self._lock:
            self._tasks[handle.task.id] = handle
        threading.Thread(target=self._wait_container, args=(handle,), daemon=True).start()

    def _fresh_client(self, timeout: int) -> Any:
        """A client on a new connection: a kept-alive one may still be served by an engine that
        already refuses new connections (dockerd closes its listener before stopping containers)."""
        version = getattr(self._api, "api_version", None) or "auto"
        return self._client(version, timeout)

    def _engine_answers(self) -> bool:
        try:
            client = self._fresh_client(5)
        except Exception:
            return False
        try:
            return bool(client.ping())
        except Exception:
            return False
        finally:
            client.close()

    def _wait_container(self, handle: ContainerHandle) -> None:
        try:
            self._follow_container(handle)
        except Exception as err:  # never a traceback from a background thread; always an end for WaitTask
            log.error(
                "waiting for the container failed",
                extra={"container_id": handle.state.container_id, "error": str(err)},
            )
            if not handle.done.is_set():
                handle.finish(ExitResult(exit_code=1), err=f"the docker driver lost track of the container: {err}")

    def _follow_container(self, handle: ContainerHandle) -> None:
        cid = handle.state.container_id
        lost = False  # the engine went away while the container ran and may have ended it
        while not handle.done.is_set():
            try:
                status = self.api().wait(cid, timeout=None)
            except sdk.NotFound:
                self._finish_gone(handle, lost)
                return
            except Exception as err:
                if not _unreachable(err):
                    raise
                lost = True
                if not self._await_engine(handle):
                    return
                continue
            if not self._engine_answers():
                # The wait answered on its old connection while new ones are refused: dockerd is
                # shutting down and stopped the container. Report now; the engine may stay away.
                code = int(status.get("StatusCode", 0))
                self._end(handle, ExitResult(exit_code=code), None, self._engine_sentence(f"exit code {code}"))
                return
            try:
                state = self.api().inspect_container(cid)["State"]
            except sdk.NotFound:
                self._finish_gone(handle, lost)
                return
            except Exception as err:
                if not _unreachable(err):
                    raise
                lost = True
                continue
            if state.get("Running"):
                continue  # a wait that returned early (e.g. the engine restarted with live-restore)
            code = int(state.get("ExitCode", 0))
            result = ExitResult(exit_code=code, signal=0, oom_killed=bool(state.get("OOMKilled")))
            finished = _docker_time(state.get("FinishedAt"))
            # A container that outlived the outage (live-restore) and ended later ended on its own.
            away = lost and (finished is None or handle.engine_back_at is None or finished <= handle.engine_back_at)
            self._end(handle, result, finished, self._engine_sentence(f"exit code {code}") if away else None)
            return

    def _await_engine(self, handle: ContainerHandle) -> bool:
        """Block until the engine answers again (True), or the task was finished meanwhile."""
        if handle.engine_lost_at is None:
            handle.engine_lost_at = datetime.now(UTC)
            log.warning(
                "the docker daemon does not answer; waiting for it to come back",
                extra={"container_id": handle.state.container_id, "task_id": handle.task.id},
            )
            self._event(handle.task, "Docker engine is unreachable; waiting for it to come back")
        while not self._engine_answers():
            if handle.done.wait(1.0):
                return False
        handle.engine_back_at = datetime.now(UTC)
        handle.engine_lost_at = None
        log.info("the docker daemon answers again", extra={"container_id": handle.state.container_id})
        # The log copiers stopped when the engine went away; new ones resume from their
        # position files, for a container that still runs or for the last lines of one that ended.
        if handle.logs is not None:
            handle.logs.stop()
            handle.logs = LogCollector(
                self.api(),
                handle.state.container_id,
                handle.task.stdout_path,
                handle.task.stderr_path,
                handle.state.log_state_dir,
                handle.state.tty,
            )
            handle.logs.start()
        return True

    @staticmethod
    def _engine_sentence(outcome: str) -> str:
        return f"the Docker engine stopped while the task ran; the container ended with {outcome}"

    def _finish_gone(self, handle: ContainerHandle, lost: bool) -> None:
        if lost:
            self._end(
                handle,
                ExitResult(exit_code=1),
                None,
                "the Docker engine stopped while the task ran; when it came back the container was gone, "
                "so its exit code is unknown",
            )
        else:
            handle.finish(ExitResult(exit_code=0))

    def _end(self, handle: ContainerHandle, result: ExitResult, finished: datetime | None, err: str | None) -> None:
        if handle.logs is not None:
            handle.logs.drain(10.0)
        handle.finish(result, finished, err)
        if err:
            log.warning(err, extra={"container_id": handle.state.container_id, "task_id": handle.task.id})
            self._event(handle.task, err[:1].upper() + err[1:])
        else:
            self._event(handle.task, f"Container exited with code {result.exit_code}")

    # --- recover -----------------------------------------------------------------------------

    def recover_task(self, handle: TaskHandle) -> None:
        task = handle.config
        with self._lock:
            if task.id in self._tasks:
                return
        state = DriverState.decode(handle.driver_state, handle.version)
        with _engine_call(f"failed to recover task {task.name!r}"):
            api = self.api()
            try:
                info = api.inspect_container(state.container_id)
            except (sdk.APIError, sdk.NotFound) as err:
                raise DriverError(f"failed to inspect container for id {state.container_id!r}: {err}") from None
        # The recovering plugin is the owner now; the creator named in the label is gone.
        reconcile.claim(task.task_dir, state.container_id)
        started = _docker_time(info["State"].get("StartedAt")) or datetime.now(UTC)
        recovered = ContainerHandle(task, state, started)
        if state.logs and info["State"]["Running"]:
            recovered.logs = LogCollector(
                api, state.container_id, task.stdout_path, task.stderr_path, state.log_state_dir, state.tty
            )
            recovered.logs.start()
        if self.config.gc_image:
            self._images.acquire(state.image_id, state.image, task.id)
        self._track(recovered)

    # --- lifecycle ---------------------------------------------------------------------------

    def _get(self, task_id: str) -> ContainerHandle:
        with self._lock:
            handle = self._tasks.get(task_id)
        if handle is None:
            raise TaskNotFoundError(task_id)
        return handle

    def wait_task(self, task_id: str) -> ExitResult:
        handle = self._get(task_id)
        handle.done.wait()
        assert handle.result is not None
        if handle.err:
            # WaitTaskResponse.err in Nomad's protocol; our SDK carries a driver's sentence as the
            # call's error status (the exit code is in the sentence).
            raise DriverError(handle.err)
        return handle.result

    def stop_task(self, task_id: str, timeout: float, signal: str) -> None:
        handle = self._get(task_id)
        if handle.done.is_set():
            return
        cid = handle.state.container_id
        try:
            api = self.api()
            if not signal:
                # The image's STOPSIGNAL (or SIGTERM), then SIGKILL after the timeout.
                api.stop(cid, timeout=math.ceil(timeout))
            else:
                api.kill(cid, signal=signal_name(signal))
                if not handle.done.wait(timeout):
                    api.stop(cid, timeout=0)
        except sdk.NotFound:
            return
        except sdk.APIError as err:
            if err.status_code in (304, 409):
                return
            raise DriverError(f"Failed to stop container {cid[:12]}: {err.explanation or err}") from None
        except Exception as err:
            if not _unreachable(err):
                raise
            if handle.done.is_set():
                return  # the engine's going away ended it already
            raise DriverError(
                f"Failed to stop container {cid[:12]}: cannot reach the docker daemon ({err}); "
                "check that dockerd is running",
                recoverable=True,
            ) from None
        handle.done.wait(30)

    def destroy_task(self, task_id: str, force: bool) -> None:
        handle = self._get(task_id)
        cid = handle.state.container_id
        if not handle.done.is_set() and not force:
            raise DriverError("must call StopTask for the given task before Destroy or set force to true")
        # The task stays tracked (and so safe from gc.dangling_containers) until this succeeds.
        with _engine_call(f"failed to destroy task {handle.task.name!r} (container {cid[:12]})"):
            api = self.api()
            if not handle.done.is_set():
                try:
                    api.stop(cid, timeout=0)
                except (sdk.APIError, sdk.NotFound):
                    pass
                handle.done.wait(30)
            if self.config.gc_container:
                try:
                    api.remove_container(cid, force=True)
                except (sdk.APIError, sdk.NotFound):
                    pass
        if handle.logs is not None:
            handle.logs.stop()
        if self.config.gc_image:
            self._images.release(api, handle.state.image_id, task_id, self.config.gc_image_delay)
        with self._lock:
            self._tasks.pop(task_id, None)

    def inspect_task(self, task_id: str) -> TaskStatus:
        handle = self._get(task_id)
        state = TaskState.EXITED if handle.done.is_set() else TaskState.RUNNING
        return TaskStatus(
            id=task_id,
            name=handle.task.name,
            state=state,
            started_at=handle.started_at,
            completed_at=handle.completed_at,
            result=handle.result,
            driver_attributes={"container_id": handle.state.container_id},
        )

    def signal_task(self, task_id: str, signal: str) -> None:
        handle = self._get(task_id)
        try:
            with _engine_call(f"failed to signal task {handle.task.name!r}"):
                self.api().kill(handle.state.container_id, signal=signal_name(signal))
        except sdk.APIError as err:
            raise DriverError(f"failed to signal task {handle.task.name!r}: {err.explanation or err}") from None

    def task_stats(self, task_id: str) -> TaskStats | None:
        handle = self._get(task_id)
        deadline = time.monotonic() + STATS_ENGINE_WAIT
        while not handle.done.is_set():
            try:
                return sample_stats(self.api(), handle)
            except sdk.NotFound:
                return None
            except sdk.APIError as err:
                raise DriverError(
                    f"failed to read stats of task {handle.task.name!r}: {err.explanation or err}"
                ) from None
            except Exception as err:
                if not _unreachable(err):
                    raise
                # Keep the stream: the engine may come back, or the task ends (and so does the stream).
                if time.monotonic() >= deadline:
                    raise DriverError(
                        f"failed to read stats of task {handle.task.name!r}: the docker daemon has not answered "
                        f"for {STATS_ENGINE_WAIT:.0f}s; check that dockerd is running",
                        recoverable=True,
                    ) from None
                handle.done.wait(1.0)
        return None

    # --- exec --------------------------------------------------------------------------------

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        handle = self._get(task_id)
        with _engine_call(f"exec in task {handle.task.name!r} failed"):
            api = self.api()
            exec_id = api.exec_create(handle.state.container_id, command, stdout=True, stderr=True)["Id"]
        output: dict[str, Any] = {}

        def run() -> None:
            try:
                output["streams"] = api.exec_start(exec_id, demux=True)
            except Exception as err:
                output["error"] = err

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        runner.join(timeout)
        if runner.is_alive():
            raise DriverError(f"exec in task {handle.task.name!r} did not finish within {timeout}s")
        with _engine_call(f"exec in task {handle.task.name!r} failed"):
            if "error" in output:
                raise output["error"]
            code = api.exec_inspect(exec_id).get("ExitCode") or 0
        out, err = output.get("streams") or (b"", b"")
        return ExecResult(out or b"", err or b"", ExitResult(exit_code=int(code)))

    def exec_task_streaming(self, session: ExecSession) -> ExitResult:
        handle = self._get(session.task_id)
        with _engine_call(f"exec in task {handle.task.name!r} failed"):
            api = self.api()
            exec_id = api.exec_create(
                handle.state.container_id, session.command, stdin=True, stdout=True, stderr=True, tty=session.tty
            )["Id"]
            raw = api.exec_start(exec_id, tty=session.tty, socket=True)
        sock: socket.socket = getattr(raw, "_sock", raw)
        size = session.terminal_size()
        if session.tty:

            def resize(new: Any) -> None:
                try:
                    api.exec_resize(exec_id, height=new.height, width=new.width)
                except sdk.APIError:
                    pass

            session.on_resize(resize)
            if size is not None:
                resize(size)

        def feed() -> None:
            while (chunk := session.read_stdin()) is not None:
                if chunk:
                    sock.sendall(chunk)
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        threading.Thread(target=feed, daemon=True).start()
        try:
            if session.tty:
                while data := sock.recv(65536):
                    session.send_stdout(data)
            else:
                self._demux(sock, session)
        finally:
            sock.close()
        for _ in range(100):
            with _engine_call(f"exec in task {handle.task.name!r} failed"):
                info = api.exec_inspect(exec_id)
            if not info.get("Running"):
                return ExitResult(exit_code=int(info.get("ExitCode") or 0))
            time.sleep(0.1)
        raise DriverError(f"exec in task {handle.task.name!r} did not report an exit code")

    @staticmethod
    def _demux(sock: socket.socket, session: ExecSession) -> None:
        def read_exact(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = sock.recv(n - len(buf))
                if not chunk:
                    return b""
                buf += chunk
            return buf

        while header := read_exact(8):
            stream, size = header[0], struct.unpack(">I", header[4:])[0]
            payload = read_exact(size)
            (session.send_stderr if stream == 2 else session.send_stdout)(payload)

    # --- networking --------------------------------------------------------------------------

    def create_network(self, alloc_id: str, hostname: str) -> tuple[NetworkIsolationSpec, bool]:
        with _engine_call(f"failed to create the network of allocation {alloc_id}"):
            return self._create_network(alloc_id, hostname)

    def _create_network(self, alloc_id: str, hostname: str) -> tuple[NetworkIsolationSpec, bool]:
        api = self.api()
        name = f"{PAUSE_PREFIX}{alloc_id}"
        created = False
        try:
            info = api.inspect_container(name)
            if not info["State"]["Running"]:
                api.start(name)
                info = api.inspect_container(name)
        except sdk.NotFound:
            image_id = self._infra_image(api)
            if self.config.gc_image:
                self._images.acquire(image_id, self.config.infra_image, alloc_id)
            host_config = api.create_host_config(network_mode="none", restart_policy={"Name": "unless-stopped"})
            cid = api.create_container(
                self.config.infra_image,
                name=name,
                hostname=hostname or None,
                labels={LABEL_ALLOC_ID: alloc_id},
                host_config=host_config,
            )["Id"]
            try:
                api.start(cid)
                info = api.inspect_container(cid)
            except sdk.APIError:
                self._remove_quietly(api, cid)
                raise
            created = True
        spec = NetworkIsolationSpec(
            mode=NetworkIsolationMode.GROUP,
            path=str(info["NetworkSettings"].get("SandboxKey") or ""),
            labels={"docker_sandbox_container_id": info["Id"], "docker_sandbox_hostname": hostname},
        )
        return spec, created

    def _infra_image(self, api: Any) -> str:
        """The pause image's id, pulled (plugin credentials, infra_image_pull_timeout) when missing."""
        image = self.config.infra_image
        repo, tag = split_reference(image)
        reference = f"{repo}:{tag}" if tag else repo
        if tag != "latest":
            try:
                return str(api.inspect_image(reference)["Id"])
            except sdk.NotFound:
                pass
        bare = repo.split("@", 1)[0]
        try:
            credentials = sdk.auth.resolve(bare, None, self.config)
        except sdk.auth.AuthLookupError as err:
            raise DriverError(f"infra_image: Failed to find docker auth for repo {bare!r}: {err}") from None
        pull_image(
            self._pulls,
            lambda timeout: self._fresh_client(math.ceil(timeout)),
            "infra_image",
            repo,
            tag,
            reference,
            credentials,
            self.config.infra_image_pull_timeout,
            self.config,
            timeout_name="infra_image_pull_timeout",
        )
        return str(api.inspect_image(reference)["Id"])

    def destroy_network(self, alloc_id: str, spec: NetworkIsolationSpec) -> None:
        with _engine_call(f"failed to destroy the network of allocation {alloc_id}"):
            self._destroy_network(alloc_id, spec)

    def _destroy_network(self, alloc_id: str, spec: NetworkIsolationSpec) -> None:
        api = self.api()
        target = spec.labels.get("docker_sandbox_container_id") or f"{PAUSE_PREFIX}{alloc_id}"
        image_id = ""
        try:
            image_id = str(api.inspect_container(target).get("Image") or "")
            api.stop(target, timeout=1)
        except (sdk.APIError, sdk.NotFound):
            pass
        self._remove_quietly(api, target)
        if self.config.gc_image and image_id:
            self._images.release(api, image_id, alloc_id, self.config.gc_image_delay)
