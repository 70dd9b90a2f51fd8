"""The host side of a driver plugin: a typed client mirroring every driver RPC.

``DriverClient`` is what our runner, our CLI and the test harness use to drive any plugin
that speaks Nomad's protocol, ours or not. It speaks Python types only; protobuf stays inside.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import grpc

from driversdk import convert
from driversdk.errors import ConfigError, DriverSDKError, PluginCallError
from driversdk.hclspec import Spec, encode
from driversdk.model import (
    AgentConfig,
    Capabilities,
    ExecResult,
    ExitResult,
    Fingerprint,
    NetworkIsolationSpec,
    TaskConfig,
    TaskEvent,
    TaskHandle,
    TaskStats,
    TaskStatus,
)
from driversdk.pb import base_pb2, base_pb2_grpc, driver_pb2, driver_pb2_grpc, recoverable_error_pb2
from driversdk.plugin.host import (
    PluginProcess,
    StartingPlugin,
    reattach_plugin,
    rpc_call_of,
    spawn_plugin,
)
from driversdk.plugin.reattach import ReattachConfig

T = TypeVar("T")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Resp_co = TypeVar("Resp_co", covariant=True)


class _ServerStream(Protocol[Resp_co]):
    """What a server-streaming stub call returns: its messages, and a way to cancel the call."""

    def __iter__(self) -> Iterator[Resp_co]: ...

    def cancel(self) -> bool: ...


@dataclass(frozen=True)
class PluginInfo:
    name: str
    type: int
    plugin_version: str
    plugin_api_versions: tuple[str, ...]


def _recoverable(err: grpc.RpcError) -> bool:
    # Only a failed call reads the status details: its module (and google.rpc's descriptors) is
    # not worth importing into every command that never sees one.
    from grpc_status import rpc_status

    call = rpc_call_of(err)
    status = rpc_status.from_call(call) if call is not None else None
    if status is None:
        return False
    for detail in status.details:
        if detail.Is(recoverable_error_pb2.RecoverableError.DESCRIPTOR):
            rec = recoverable_error_pb2.RecoverableError()
            detail.Unpack(rec)
            return rec.recoverable
    return False


def call_error(err: grpc.RpcError, call: str, plugin: str) -> PluginCallError:
    """Turn an RpcError into one operator sentence that keeps the driver's own words."""
    failed = rpc_call_of(err)
    code = failed.code() if failed is not None else grpc.StatusCode.UNKNOWN
    details = failed.details() if failed is not None else str(err)
    name = code.name if code is not None else "UNKNOWN"
    if code == grpc.StatusCode.UNAVAILABLE:
        message = f"{plugin} plugin is not answering ({call}): {details}; check that the plugin process is running"
    else:
        message = details or f"{plugin} plugin: {call} failed with {name}"
    return PluginCallError(message, code=name, call=call, recoverable=_recoverable(err))


class ExecStream:
    """Output of a streaming exec: iterate ``(stream, data)`` pairs; ``result`` once finished."""

    def __init__(
        self,
        responses: Iterator[driver_pb2.ExecTaskStreamingResponse],
        on_error: Callable[[grpc.RpcError], Exception],
    ) -> None:
        self._responses = responses
        self._on_error = on_error
        self.result: ExitResult | None = None

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        try:
            for resp in self._responses:
                if resp.exited:
                    self.result = convert.exit_result_from_proto(resp.result)
                    continue
                if resp.HasField("stdout") and resp.stdout.data:
                    yield "stdout", bytes(resp.stdout.data)
                if resp.HasField("stderr") and resp.stderr.data:
                    yield "stderr", bytes(resp.stderr.data)
        except grpc.RpcError as err:
            raise self._on_error(err) from None

    def collect(self) -> tuple[bytes, bytes, ExitResult]:
        out, errb = bytearray(), bytearray()
        for stream, data in self:
            (out if stream == "stdout" else errb).extend(data)
        if self.result is None:
            raise PluginCallError(
                "streaming exec ended without an exit result", code="UNKNOWN", call="ExecTaskStreaming"
            )
        return bytes(out), bytes(errb), self.result


class DriverClient:
    """Typed client of one driver plugin process."""

    def __init__(self, process: PluginProcess, name: str = "driver") -> None:
        self.process = process
        self.name = name
        self._base = base_pb2_grpc.BasePluginStub(process.channel)
        self._driver = driver_pb2_grpc.DriverStub(process.channel)
        self._task_spec: Spec | None = None
        self._config_schema: Future[Spec | None] | None = None
        self._lock = threading.Lock()
        # Server streams still open (TaskEvents, Fingerprint, TaskStats): cancelled before the
        # plugin is asked to shut down, so that its server stops with no call in flight instead
        # of waiting out its grace period for streams nobody reads any more.
        self._open_streams: set[_ServerStream[Any]] = set()
        self._streams_lock = threading.Lock()

    # --- plumbing ----------------------------------------------------------------------------

    def _unary(
        self, call: str, fn: grpc.UnaryUnaryMultiCallable[Req, Resp], request: Req, timeout: float | None = None
    ) -> Resp:
        try:
            return fn(request, timeout=timeout)
        except grpc.RpcError as err:
            raise call_error(err, call, self.name) from None

    def _err(self, call: str) -> Callable[[grpc.RpcError], Exception]:
        return lambda err: call_error(err, call, self.name)

    # --- base plugin -------------------------------------------------------------------------

    def plugin_info(self) -> PluginInfo:
        resp = self._unary("PluginInfo", self._base.PluginInfo, base_pb2.PluginInfoRequest(), 30)
        info = PluginInfo(resp.name, resp.type, resp.plugin_version, tuple(resp.plugin_api_versions))
        self.name = info.name or self.name
        return info

    def config_schema(self) -> Spec | None:
        """The plugin's config schema, asked for once per client (as the task schema is)."""
        with self._lock:
            pending = self._config_schema
            ask = pending is None
            if pending is None:
                pending = self._config_schema = Future()
        if ask:
            self._ask_config_schema(pending)
        try:
            return pending.result()
        except DriverSDKError:
            with self._lock:
                if self._config_schema is pending:
                    self._config_schema = None  # a failed call is not kept: the next one asks again
            raise

    def prefetch_config_schema(self) -> None:
        """Ask for the config schema now, in the background; :meth:`config_schema` then waits for
        that answer. A plugin may load much on that first call (the docker plugin loads the docker
        SDK): the host does its own work meanwhile."""
        with self._lock:
            if self._config_schema is not None:
                return
            pending = self._config_schema = Future()
        threading.Thread(
            target=self._ask_config_schema, args=(pending,), daemon=True, name=f"config-schema-{self.name}"
        ).start()

    def _ask_config_schema(self, pending: Future[Spec | None]) -> None:
        try:
            resp = self._unary("ConfigSchema", self._base.ConfigSchema, base_pb2.ConfigSchemaRequest(), 30)
            pending.set_result(Spec.from_proto(resp.spec) if resp.HasField("spec") else None)
        except BaseException as err:  # handed to whoever waits for the answer
            pending.set_exception(err)

    def set_config(self, config: Mapping[str, Any] | None = None, agent: AgentConfig | None = None) -> None:
        """Encode ``config`` with the plugin's own schema (as Nomad does) and send SetConfig."""
        spec = self.config_schema()
        data = b""
        if spec is not None:
            data = encode(spec, dict(config or {}), what=f"{self.name} plugin config")
        elif config:
            raise ConfigError(f"the {self.name} plugin takes no config block; remove its config {{}}")
        req = base_pb2.SetConfigRequest(msgpack_config=data, plugin_api_version="v0.1.0")
        if agent is not None:
            req.nomad_config.driver.ClientMinPort = agent.client_min_port
            req.nomad_config.driver.ClientMaxPort = agent.client_max_port
        self._unary("SetConfig", self._base.SetConfig, req, 60)

    # --- driver ------------------------------------------------------------------------------

    def init(self) -> None:
        self._unary("Init", self._driver.Init, driver_pb2.InitRequest(), 30)

    def shutdown(self) -> None:
        self._unary("Shutdown", self._driver.Shutdown, driver_pb2.ShutdownRequest(), 2)

    def task_config_schema(self) -> Spec:
        with self._lock:
            if self._task_spec is None:
                resp = self._unary(
                    "TaskConfigSchema",
                    self._driver.TaskConfigSchema,
                    driver_pb2.TaskConfigSchemaRequest(),
                    30,
                )
                self._task_spec = Spec.from_proto(resp.spec)
            return self._task_spec

    def capabilities(self) -> Capabilities:
        resp = self._unary("Capabilities", self._driver.Capabilities, driver_pb2.CapabilitiesRequest(), 30)
        return convert.capabilities_from_proto(resp.capabilities)

    def _stream(self, call: str, stream: _ServerStream[Resp], convert_one: Callable[[Resp], T]) -> Iterator[T]:
        """Converted messages of a server stream; closing the iterator cancels the call, and so
        does :meth:`kill` for a stream still open then."""
        with self._streams_lock:
            self._open_streams.add(stream)
        return self._read_stream(call, stream, convert_one)

    def _read_stream(self, call: str, stream: _ServerStream[Resp], convert_one: Callable[[Resp], T]) -> Iterator[T]:
        try:
            for resp in stream:
                yield convert_one(resp)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                raise call_error(err, call, self.name) from None
        finally:
            stream.cancel()
            with self._streams_lock:
                self._open_streams.discard(stream)

    def _cancel_streams(self) -> None:
        with self._streams_lock:
            streams = list(self._open_streams)
            self._open_streams.clear()
        for stream in streams:
            stream.cancel()

    def fingerprint(self) -> Iterator[Fingerprint]:
        stream = self._driver.Fingerprint(driver_pb2.FingerprintRequest())
        return self._stream("Fingerprint", stream, convert.fingerprint_from_proto)

    def encode_task_config(self, task: TaskConfig) -> TaskConfig:
        """Return ``task`` with msgpack_driver_config filled from driver_config, as Nomad does."""
        if task.msgpack_driver_config:
            return task
        data = encode(self.task_config_schema(), task.driver_config, what=f"task {task.name!r} config")
        return replace(task, msgpack_driver_config=data)

    def start_task(self, task: TaskConfig) -> TaskHandle:
        task = self.encode_task_config(task)
        resp = self._unary(
            "StartTask",
            self._driver.StartTask,
            driver_pb2.StartTaskRequest(task=convert.task_config_to_proto(task)),
        )
        handle = convert.task_handle_from_proto(resp.handle)
        handle.config.driver_config = task.driver_config
        if resp.HasField("network_override"):
            handle.network_override = convert.network_override_from_proto(resp.network_override)
        return handle

    def recover_task(self, handle: TaskHandle) -> None:
        req = driver_pb2.RecoverTaskRequest(handle=convert.task_handle_to_proto(handle))
        self._unary("RecoverTask", self._driver.RecoverTask, req)

    def wait_task(self, task_id: str, timeout: float | None = None) -> ExitResult:
        resp = self._unary("WaitTask", self._driver.WaitTask, driver_pb2.WaitTaskRequest(task_id=task_id), timeout)
        if resp.err:
            raise PluginCallError(resp.err, code="OK", call="WaitTask")
        return convert.exit_result_from_proto(resp.result)

    def watch_task(self, task_id: str, on_done: Callable[[ExitResult | DriverSDKError], None]) -> None:
        """WaitTask without a thread blocked on it: a host following a thousand tasks holds a
        thousand pending calls, not a thousand threads. ``on_done`` gets the exit or the call's
        failure exactly once, on gRPC's own callback thread: it must hand any slow work on."""
        call = self._driver.WaitTask.future(driver_pb2.WaitTaskRequest(task_id=task_id))

        def settled(finished: grpc.Future[driver_pb2.WaitTaskResponse]) -> None:
            if finished.cancelled():  # the channel was closed under the call (the plugin was let go)
                on_done(PluginCallError("WaitTask was cancelled: the plugin connection closed", code="CANCELLED",
                                        call="WaitTask"))  # fmt: skip
                return
            try:
                resp = finished.result()
            except grpc.RpcError as err:
                on_done(call_error(err, "WaitTask", self.name))
                return
            if resp.err:
                on_done(PluginCallError(resp.err, code="OK", call="WaitTask"))
                return
            on_done(convert.exit_result_from_proto(resp.result))

        call.add_done_callback(settled)

    def stop_task(self, task_id: str, timeout: float = 5.0, signal: str = "") -> None:
        req = driver_pb2.StopTaskRequest(task_id=task_id, timeout=convert.duration_to_proto(timeout), signal=signal)
        self._unary("StopTask", self._driver.StopTask, req)

    def destroy_task(self, task_id: str, force: bool = True) -> None:
        req = driver_pb2.DestroyTaskRequest(task_id=task_id, force=force)
        self._unary("DestroyTask", self._driver.DestroyTask, req)

    def inspect_task(self, task_id: str) -> TaskStatus:
        resp = self._unary("InspectTask", self._driver.InspectTask, driver_pb2.InspectTaskRequest(task_id=task_id), 30)
        return convert.task_status_from_proto(resp.task, resp.driver)

    def task_stats(self, task_id: str, interval: float = 1.0) -> Iterator[TaskStats]:
        req = driver_pb2.TaskStatsRequest(task_id=task_id, collection_interval=convert.duration_to_proto(interval))
        stream = self._driver.TaskStats(req)
        return self._stream("TaskStats", stream, lambda resp: convert.task_stats_from_proto(resp.stats))

    def task_events(self) -> Iterator[TaskEvent]:
        stream = self._driver.TaskEvents(driver_pb2.TaskEventsRequest())
        return self._stream("TaskEvents", stream, convert.task_event_from_proto)

    def signal_task(self, task_id: str, signal: str) -> None:
        req = driver_pb2.SignalTaskRequest(task_id=task_id, signal=signal)
        self._unary("SignalTask", self._driver.SignalTask, req, 30)

    def exec_task(self, task_id: str, command: Sequence[str], timeout: float | None = None) -> ExecResult:
        req = driver_pb2.ExecTaskRequest(
            task_id=task_id, command=list(command), timeout=convert.duration_to_proto(timeout)
        )
        resp = self._unary("ExecTask", self._driver.ExecTask, req)
        return convert.exec_result_from_proto(resp)

    def exec_task_streaming(
        self,
        task_id: str,
        command: Sequence[str],
        tty: bool = False,
        stdin: Iterable[bytes] = (),
        tty_size: tuple[int, int] | None = None,
    ) -> ExecStream:
        def requests() -> Iterator[driver_pb2.ExecTaskStreamingRequest]:
            yield driver_pb2.ExecTaskStreamingRequest(
                setup=driver_pb2.ExecTaskStreamingRequest.Setup(task_id=task_id, command=list(command), tty=tty)
            )
            if tty_size is not None:
                yield driver_pb2.ExecTaskStreamingRequest(
                    tty_size=driver_pb2.ExecTaskStreamingRequest.TerminalSize(height=tty_size[0], width=tty_size[1])
                )
            for chunk in stdin:
                yield driver_pb2.ExecTaskStreamingRequest(stdin=driver_pb2.ExecTaskStreamingIOOperation(data=chunk))
            yield driver_pb2.ExecTaskStreamingRequest(stdin=driver_pb2.ExecTaskStreamingIOOperation(close=True))

        return ExecStream(self._driver.ExecTaskStreaming(requests()), self._err("ExecTaskStreaming"))

    def create_network(self, alloc_id: str, hostname: str = "") -> tuple[NetworkIsolationSpec, bool]:
        req = driver_pb2.CreateNetworkRequest(alloc_id=alloc_id, hostname=hostname)
        resp = self._unary("CreateNetwork", self._driver.CreateNetwork, req)
        return convert.network_spec_from_proto(resp.isolation_spec), resp.created

    def destroy_network(self, alloc_id: str, spec: NetworkIsolationSpec) -> None:
        req = driver_pb2.DestroyNetworkRequest(alloc_id=alloc_id, isolation_spec=convert.network_spec_to_proto(spec))
        self._unary("DestroyNetwork", self._driver.DestroyNetwork, req)

    # --- process -----------------------------------------------------------------------------

    def kill(self) -> None:
        """Shut the plugin process down the way go-plugin's host does (Shutdown, then SIGKILL),
        once this client's own streams are cancelled (a reader of one sees it end)."""
        self._cancel_streams()
        self.process.kill()

    def close(self) -> None:
        self.kill()

    def disconnect(self) -> None:
        """Let go of the plugin without stopping it (a later host reattaches): this client's
        streams are cancelled and its channel closed; the process runs on."""
        self._cancel_streams()
        self.process.disconnect()

    def __enter__(self) -> DriverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def launch(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    name: str | None = None,
) -> DriverClient:
    """Launch a driver plugin through the go-plugin handshake and return a client for it."""
    starting = spawn_plugin(cmd, env=env, name=name)
    return connect_driver(starting, cmd, timeout=timeout, name=name)


def connect_driver(
    starting: StartingPlugin, cmd: Sequence[str], *, timeout: float = 60.0, name: str | None = None
) -> DriverClient:
    """Finish :func:`launch` of a plugin :func:`~driversdk.plugin.host.spawn_plugin` started:
    the handshake, the connection, and the check that it is a task driver."""
    process = starting.connect(timeout)
    try:
        client = DriverClient(process, name=name or "driver")
        info = client.plugin_info()
        if info.type != base_pb2.DRIVER:
            raise PluginCallError(
                f"{' '.join(cmd)} is a plugin of type {info.type}, not a task driver",
                code="OK",
                call="PluginInfo",
            )
        return client
    except BaseException:
        process.kill()
        raise


def reattach(config: ReattachConfig, *, name: str = "driver", timeout: float = 10.0) -> DriverClient:
    """Connect to a driver plugin an earlier host process launched (saved ``reattach_config``).

    As Nomad does after an agent crash: the plugin kept running and keeps its configuration,
    so SetConfig is not sent again.
    """
    process = reattach_plugin(config, name=name, timeout=timeout)
    client = DriverClient(process, name=name)
    try:
        client.plugin_info()
    except BaseException:
        process.disconnect()
        raise
    return client
