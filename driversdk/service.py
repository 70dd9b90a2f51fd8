"""The gRPC servicers that expose a DriverPlugin as Nomad's BasePlugin and Driver services.

Every RPC is a thin adapter: convert the request, call the driver, convert the answer. Errors
become a gRPC status whose first detail is ``RecoverableError`` so a Nomad client (or our own
runner) knows whether its restart policy may retry.
"""

from __future__ import annotations

import functools
import importlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import grpc

from driversdk.driver import ExecSession, TerminalSize
from driversdk.errors import (
    ConfigError,
    DriverError,
    NotSupportedError,
    TaskNotFoundError,
)
from driversdk.pb import base_pb2, base_pb2_grpc, driver_pb2, driver_pb2_grpc
from driversdk.plugin.handshake import DRIVER_API_VERSION


class _OnFirstUse:
    """A module imported when one of its names is first read, not when this module loads.

    Only what PluginInfo needs is loaded before the first RPC: the model <-> protobuf conversions
    come through this; the config decoder and the error-status messages are imported inside the
    functions that use them.
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        # import_module returns only a fully executed module, even when gRPC threads race here.
        value = getattr(importlib.import_module(self._name), attr)
        setattr(self, attr, value)  # later reads skip __getattr__
        return value


if TYPE_CHECKING:
    from driversdk import convert
    from driversdk.driver import DriverPlugin
    from driversdk.hclspec import Spec
    from driversdk.model import ExitResult, TaskConfig
else:
    convert = _OnFirstUse("driversdk.convert")

log = logging.getLogger("driversdk.service")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class DriverSource:
    """The driver behind the servicers: given, or built by a factory on the first call needing it.

    A factory lets a plugin answer the handshake and PluginInfo (name and version are declared
    up front) before it imports a heavy module such as the docker SDK. The driver is built once;
    a failure is kept and answers every later call with the same sentence.
    """

    def __init__(
        self, driver: DriverPlugin | Callable[[], DriverPlugin], *, name: str | None = None, version: str | None = None
    ) -> None:
        from driversdk.driver import DriverPlugin

        self._lock = threading.Lock()
        self._failure: Exception | None = None
        if isinstance(driver, DriverPlugin):
            self._driver: DriverPlugin | None = driver
            self._factory: Callable[[], DriverPlugin] | None = None
            self.name: str = driver.name
            self.version: str = driver.version
        else:
            if not name or not version:
                raise TypeError("serve(factory) needs the driver's name= and version= for PluginInfo")
            self._driver, self._factory = None, driver
            self.name, self.version = name, version

    @property
    def built(self) -> DriverPlugin | None:
        """The driver if it exists yet; never builds it."""
        return self._driver

    def get(self) -> DriverPlugin:
        driver = self._driver
        if driver is not None:
            return driver
        with self._lock:
            if self._driver is None:
                if self._failure is None:
                    self._failure = self._build()
                if self._failure is not None:
                    raise DriverError(f"the {self.name} driver could not be loaded: {self._failure}")
            assert self._driver is not None
            return self._driver

    def _build(self) -> Exception | None:
        assert self._factory is not None
        try:
            driver = self._factory()
        except Exception as err:
            log.error("building the driver failed", exc_info=err)
            return err
        if (driver.name, driver.version) != (self.name, self.version):
            return DriverError(
                f"it calls itself {driver.name} {driver.version}, but serve() declared {self.name} {self.version} "
                "in PluginInfo; make them agree"
            )
        self._driver = driver
        return None


def _loads_driver(method: F) -> F:
    """Build a deferred driver before ``method`` runs, or end the call with why it cannot be."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            self._source.get()
        except DriverError as err:
            abort_with(context, err, method.__name__)
        return method(self, request, context)

    return cast(F, wrapper)


_CODE_BY_ERROR: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (TaskNotFoundError, grpc.StatusCode.NOT_FOUND),
    (NotSupportedError, grpc.StatusCode.UNIMPLEMENTED),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
]


def abort_with(context: grpc.ServicerContext, err: BaseException, call: str) -> NoReturn:
    """End the RPC with a status that carries the error's sentence and recoverability."""
    recoverable = isinstance(err, DriverError) and err.recoverable
    code = grpc.StatusCode.INTERNAL
    for kind, mapped in _CODE_BY_ERROR:
        if isinstance(err, kind):
            code = mapped
            break
    else:
        if recoverable:
            # Nomad's Go drivers use FAILED_PRECONDITION for retryable failures.
            code = grpc.StatusCode.FAILED_PRECONDITION
    message = str(err) if isinstance(err, (DriverError, ValueError)) else f"{call} failed: {err}"
    if not isinstance(err, (DriverError, ValueError)):
        log.error("unexpected error in driver call", exc_info=err, extra={"call": call})
    from google.protobuf import any_pb2
    from google.rpc import status_pb2
    from grpc_status import rpc_status

    from driversdk.pb import recoverable_error_pb2

    detail = any_pb2.Any()
    detail.Pack(recoverable_error_pb2.RecoverableError(recoverable=recoverable))
    status = status_pb2.Status(code=_code_number(code), message=message, details=[detail])
    context.abort_with_status(rpc_status.to_status(status))
    raise AssertionError("abort_with_status returned")  # pragma: no cover - grpc raises


def _code_number(code: grpc.StatusCode) -> int:
    value: int = code.value[0]
    return value


def _call(context: grpc.ServicerContext, call: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except Exception as err:  # every failure must reach the host as a status, never a trace
        abort_with(context, err, call)


class BasePluginServicer(base_pb2_grpc.BasePluginServicer):
    def __init__(self, driver: DriverPlugin | DriverSource) -> None:
        self._source = driver if isinstance(driver, DriverSource) else DriverSource(driver)

    @property
    def _driver(self) -> DriverPlugin:
        return self._source.get()

    def PluginInfo(
        self, request: base_pb2.PluginInfoRequest, context: grpc.ServicerContext
    ) -> base_pb2.PluginInfoResponse:
        return base_pb2.PluginInfoResponse(
            type=base_pb2.DRIVER,
            plugin_api_versions=[DRIVER_API_VERSION],
            plugin_version=self._source.version,
            name=self._source.name,
        )

    def ConfigSchema(
        self, request: base_pb2.ConfigSchemaRequest, context: grpc.ServicerContext
    ) -> base_pb2.ConfigSchemaResponse:
        spec = _call(context, "ConfigSchema", self._driver.config_schema)
        if spec is None:
            return base_pb2.ConfigSchemaResponse()
        return base_pb2.ConfigSchemaResponse(spec=spec.to_proto())

    def SetConfig(
        self, request: base_pb2.SetConfigRequest, context: grpc.ServicerContext
    ) -> base_pb2.SetConfigResponse:
        def apply() -> None:
            from driversdk.hclspec import decode
            from driversdk.model import AgentConfig

            spec = self._driver.config_schema()
            config: dict[str, Any] = {}
            if spec is not None:
                config = decode(spec, bytes(request.msgpack_config), what=f"{self._driver.name} plugin config")
            elif request.msgpack_config:
                raise ConfigError(
                    f"the {self._driver.name} plugin takes no config block; remove config {{}} "
                    f'from plugin "{self._driver.name}"'
                )
            agent = None
            if request.HasField("nomad_config"):
                drv = request.nomad_config.driver
                agent = AgentConfig(client_min_port=drv.ClientMinPort, client_max_port=drv.ClientMaxPort)
            self._driver.set_config(config, agent)

        _call(context, "SetConfig", apply)
        return base_pb2.SetConfigResponse()


class _GrpcExecSession(ExecSession):
    """Bridges ExecTaskStreaming's request iterator and response queue to the driver."""

    def __init__(
        self,
        setup: driver_pb2.ExecTaskStreamingRequest.Setup,
        requests: Iterator[driver_pb2.ExecTaskStreamingRequest],
        out: queue.Queue[driver_pb2.ExecTaskStreamingResponse | None],
        context: grpc.ServicerContext,
    ) -> None:
        self.task_id = setup.task_id
        self.command = list(setup.command)
        self.tty = setup.tty
        self._out = out
        self._stdin: queue.Queue[bytes | None] = queue.Queue()
        self._size: TerminalSize | None = None
        self._resize_callbacks: list[Callable[[TerminalSize], None]] = []
        self._cancelled = threading.Event()
        # Only the RPC ending early is a cancel; the client closing its input is not.
        context.add_callback(self._cancelled.set)
        self._reader = threading.Thread(target=self._pump, args=(requests,), daemon=True)
        self._reader.start()

    def _pump(self, requests: Iterator[driver_pb2.ExecTaskStreamingRequest]) -> None:
        try:
            for req in requests:
                if req.HasField("stdin"):
                    if req.stdin.data:
                        self._stdin.put(bytes(req.stdin.data))
                    if req.stdin.close:
                        self._stdin.put(None)
                elif req.HasField("tty_size"):
                    self._size = TerminalSize(req.tty_size.height, req.tty_size.width)
                    for cb in list(self._resize_callbacks):
                        cb(self._size)
                # anything else is a heartbeat
        except grpc.RpcError:
            self._cancelled.set()
        finally:
            self._stdin.put(None)

    def read_stdin(self, timeout: float | None = None) -> bytes | None:
        try:
            return self._stdin.get(timeout=timeout)
        except queue.Empty:
            return b""

    def send_stdout(self, data: bytes) -> None:
        if data:
            self._out.put(
                driver_pb2.ExecTaskStreamingResponse(stdout=driver_pb2.ExecTaskStreamingIOOperation(data=data))
            )

    def send_stderr(self, data: bytes) -> None:
        if data:
            self._out.put(
                driver_pb2.ExecTaskStreamingResponse(stderr=driver_pb2.ExecTaskStreamingIOOperation(data=data))
            )

    def terminal_size(self) -> TerminalSize | None:
        return self._size

    def on_resize(self, callback: Callable[[TerminalSize], None]) -> None:
        self._resize_callbacks.append(callback)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class DriverServicer(driver_pb2_grpc.DriverServicer):
    def __init__(self, driver: DriverPlugin | DriverSource) -> None:
        self._source = driver if isinstance(driver, DriverSource) else DriverSource(driver)
        self._task_spec: Spec | None = None

    @property
    def _driver(self) -> DriverPlugin:
        return self._source.get()

    # --- helpers ---------------------------------------------------------------------------

    def _task_schema(self) -> Spec:
        if self._task_spec is None:
            self._task_spec = self._driver.task_config_schema()
        return self._task_spec

    def _decode_task(self, pb: driver_pb2.TaskConfig) -> TaskConfig:
        from driversdk.hclspec import decode

        task = convert.task_config_from_proto(pb)
        if task.msgpack_driver_config:
            task.driver_config = decode(
                self._task_schema(), task.msgpack_driver_config, what=f"task {task.name!r} config"
            )
        return task

    # --- unary calls -----------------------------------------------------------------------

    def Init(self, request: driver_pb2.InitRequest, context: grpc.ServicerContext) -> driver_pb2.InitResponse:
        _call(context, "Init", self._driver.init)
        return driver_pb2.InitResponse()

    def Shutdown(
        self, request: driver_pb2.ShutdownRequest, context: grpc.ServicerContext
    ) -> driver_pb2.ShutdownResponse:
        _call(context, "Shutdown", self._driver.shutdown)
        return driver_pb2.ShutdownResponse()

    def TaskConfigSchema(
        self, request: driver_pb2.TaskConfigSchemaRequest, context: grpc.ServicerContext
    ) -> driver_pb2.TaskConfigSchemaResponse:
        spec = _call(context, "TaskConfigSchema", self._task_schema)
        return driver_pb2.TaskConfigSchemaResponse(spec=spec.to_proto())

    def Capabilities(
        self, request: driver_pb2.CapabilitiesRequest, context: grpc.ServicerContext
    ) -> driver_pb2.CapabilitiesResponse:
        caps = _call(context, "Capabilities", self._driver.capabilities)
        return driver_pb2.CapabilitiesResponse(capabilities=convert.capabilities_to_proto(caps))

    def StartTask(
        self, request: driver_pb2.StartTaskRequest, context: grpc.ServicerContext
    ) -> driver_pb2.StartTaskResponse:
        def start() -> driver_pb2.StartTaskResponse:
            task = self._decode_task(request.task)
            handle = self._driver.start_task(task)
            # Always echo the TaskConfig Nomad sent: it is what gets persisted for recovery.
            handle.config = task
            resp = driver_pb2.StartTaskResponse(handle=convert.task_handle_to_proto(handle))
            if handle.network_override is not None:
                resp.network_override.CopyFrom(convert.network_override_to_proto(handle.network_override))
            return resp

        return _call(context, "StartTask", start)

    def RecoverTask(
        self, request: driver_pb2.RecoverTaskRequest, context: grpc.ServicerContext
    ) -> driver_pb2.RecoverTaskResponse:
        def recover() -> None:
            from driversdk.hclspec import decode

            handle = convert.task_handle_from_proto(request.handle)
            if handle.config.msgpack_driver_config:
                handle.config.driver_config = decode(
                    self._task_schema(),
                    handle.config.msgpack_driver_config,
                    what=f"task {handle.config.name!r} config",
                )
            if not handle.config.id:
                raise DriverError("RecoverTask got a handle without a task config id; the task cannot be recovered")
            self._driver.recover_task(handle)

        _call(context, "RecoverTask", recover)
        return driver_pb2.RecoverTaskResponse()

    def WaitTask(
        self, request: driver_pb2.WaitTaskRequest, context: grpc.ServicerContext
    ) -> driver_pb2.WaitTaskResponse:
        result = _call(context, "WaitTask", lambda: self._driver.wait_task(request.task_id))
        return driver_pb2.WaitTaskResponse(result=convert.exit_result_to_proto(result))

    def StopTask(
        self, request: driver_pb2.StopTaskRequest, context: grpc.ServicerContext
    ) -> driver_pb2.StopTaskResponse:
        timeout = convert.duration_from_proto(request.timeout)
        _call(context, "StopTask", lambda: self._driver.stop_task(request.task_id, timeout, request.signal))
        return driver_pb2.StopTaskResponse()

    def DestroyTask(
        self, request: driver_pb2.DestroyTaskRequest, context: grpc.ServicerContext
    ) -> driver_pb2.DestroyTaskResponse:
        _call(context, "DestroyTask", lambda: self._driver.destroy_task(request.task_id, request.force))
        return driver_pb2.DestroyTaskResponse()

    def InspectTask(
        self, request: driver_pb2.InspectTaskRequest, context: grpc.ServicerContext
    ) -> driver_pb2.InspectTaskResponse:
        status = _call(context, "InspectTask", lambda: self._driver.inspect_task(request.task_id))
        resp = driver_pb2.InspectTaskResponse(
            task=convert.task_status_to_proto(status),
            driver=driver_pb2.TaskDriverStatus(attributes=dict(status.driver_attributes)),
        )
        if status.network_override is not None:
            resp.network_override.CopyFrom(convert.network_override_to_proto(status.network_override))
        return resp

    def SignalTask(
        self, request: driver_pb2.SignalTaskRequest, context: grpc.ServicerContext
    ) -> driver_pb2.SignalTaskResponse:
        _call(context, "SignalTask", lambda: self._driver.signal_task(request.task_id, request.signal))
        return driver_pb2.SignalTaskResponse()

    def ExecTask(
        self, request: driver_pb2.ExecTaskRequest, context: grpc.ServicerContext
    ) -> driver_pb2.ExecTaskResponse:
        timeout = convert.duration_from_proto(request.timeout) or None
        result = _call(
            context,
            "ExecTask",
            lambda: self._driver.exec_task(request.task_id, list(request.command), timeout),
        )
        return convert.exec_result_to_proto(result)

    def CreateNetwork(
        self, request: driver_pb2.CreateNetworkRequest, context: grpc.ServicerContext
    ) -> driver_pb2.CreateNetworkResponse:
        spec, created = _call(
            context, "CreateNetwork", lambda: self._driver.create_network(request.alloc_id, request.hostname)
        )
        return driver_pb2.CreateNetworkResponse(isolation_spec=convert.network_spec_to_proto(spec), created=created)

    def DestroyNetwork(
        self, request: driver_pb2.DestroyNetworkRequest, context: grpc.ServicerContext
    ) -> driver_pb2.DestroyNetworkResponse:
        spec = convert.network_spec_from_proto(request.isolation_spec)
        _call(context, "DestroyNetwork", lambda: self._driver.destroy_network(request.alloc_id, spec))
        return driver_pb2.DestroyNetworkResponse()

    # --- streams ---------------------------------------------------------------------------

    def Fingerprint(
        self, request: driver_pb2.FingerprintRequest, context: grpc.ServicerContext
    ) -> Iterator[driver_pb2.FingerprintResponse]:
        # wait_fingerprint_change with an impossible generation returns the current one at once.
        generation = self._driver.wait_fingerprint_change(-1, 0)
        while context.is_active():
            fp = _call(context, "Fingerprint", self._driver.fingerprint)
            yield convert.fingerprint_to_proto(fp)
            # Re-send after the interval, earlier on notify_fingerprint_changed; poll the
            # context each second so a departed host frees this thread.
            waited = 0.0
            while context.is_active() and waited < self._driver.fingerprint_interval:
                step = min(1.0, self._driver.fingerprint_interval - waited)
                current = self._driver.wait_fingerprint_change(generation, step)
                if current != generation:
                    generation = current
                    break
                waited += step

    def TaskStats(
        self, request: driver_pb2.TaskStatsRequest, context: grpc.ServicerContext
    ) -> Iterator[driver_pb2.TaskStatsResponse]:
        interval = convert.duration_from_proto(request.collection_interval) or 1.0
        stop = threading.Event()
        context.add_callback(stop.set)
        while context.is_active():
            stats = _call(context, "TaskStats", lambda: self._driver.task_stats(request.task_id))
            if stats is None:
                return
            yield driver_pb2.TaskStatsResponse(stats=convert.task_stats_to_proto(stats))
            if stop.wait(interval):
                return

    def TaskEvents(
        self, request: driver_pb2.TaskEventsRequest, context: grpc.ServicerContext
    ) -> Iterator[driver_pb2.DriverTaskEvent]:
        subscriber = self._driver.subscribe_events()
        stop = threading.Event()
        context.add_callback(stop.set)
        try:
            while not stop.is_set():
                try:
                    event = subscriber.get(timeout=1.0)
                except queue.Empty:
                    continue
                yield convert.task_event_to_proto(event)
        finally:
            self._driver.unsubscribe_events(subscriber)

    def ExecTaskStreaming(
        self, request_iterator: Iterator[driver_pb2.ExecTaskStreamingRequest], context: grpc.ServicerContext
    ) -> Iterator[driver_pb2.ExecTaskStreamingResponse]:
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if not first.HasField("setup"):
            abort_with(context, ConfigError("the first ExecTaskStreaming message must carry setup"), "ExecTask")
        # None marks the end of the driver's output.
        out: queue.Queue[driver_pb2.ExecTaskStreamingResponse | None] = queue.Queue()
        session = _GrpcExecSession(first.setup, request_iterator, out, context)
        result: ExitResult | None = None
        error: Exception | None = None

        def run() -> None:
            nonlocal result, error
            try:
                result = self._driver.exec_task_streaming(session)
            except Exception as err:
                error = err
            finally:
                out.put(None)

        worker = threading.Thread(target=run, daemon=True, name=f"exec-{session.task_id}")
        worker.start()
        while (item := out.get()) is not None:
            yield item
        if error is not None:
            abort_with(context, error, "ExecTaskStreaming")
        assert result is not None  # run() set one or the other before putting None
        closed = driver_pb2.ExecTaskStreamingIOOperation(close=True)
        yield driver_pb2.ExecTaskStreamingResponse(stdout=closed)
        yield driver_pb2.ExecTaskStreamingResponse(stderr=closed)
        yield driver_pb2.ExecTaskStreamingResponse(exited=True, result=convert.exit_result_to_proto(result))


# Every call but PluginInfo needs the driver itself: a deferred one is built (or its failure
# reported as a status) before the servicer method runs.
for _servicer, _answered_without in ((BasePluginServicer, {"PluginInfo"}), (DriverServicer, set())):
    for _name, _method in list(vars(_servicer).items()):
        if _name[:1].isupper() and callable(_method) and _name not in _answered_without:
            setattr(_servicer, _name, _loads_driver(_method))


def register_driver(server: grpc.Server, driver: DriverPlugin | DriverSource) -> None:
    source = driver if isinstance(driver, DriverSource) else DriverSource(driver)
    base_pb2_grpc.add_BasePluginServicer_to_server(BasePluginServicer(source), server)
    driver_pb2_grpc.add_DriverServicer_to_server(DriverServicer(source), server)


__all__ = ["BasePluginServicer", "DriverServicer", "DriverSource", "abort_with", "register_driver"]
