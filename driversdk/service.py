"""The gRPC servicers that expose a DriverPlugin as Nomad's BasePlugin and Driver services.

Every RPC is a thin adapter: convert the request, call the driver, convert the answer. Errors
become a gRPC status whose first detail is ``RecoverableError`` so a Nomad client (or our own
runner) knows whether its restart policy may retry.

The servicers are ``grpc.aio`` coroutines on the plugin's event loop; the driver's methods are
synchronous and run on one bounded thread pool, one call at a time per worker. A stream that
waits (WaitTask, TaskStats between samples, TaskEvents, Fingerprint) holds no thread: it awaits
a timer, or a future or queue that the driver's thread fills through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias, TypeVar, cast

import grpc

from driversdk.authorcheck import checked
from driversdk.driver import ExecSession, TerminalSize
from driversdk.errors import (
    ConfigError,
    DriverError,
    NotSupportedError,
    TaskNotFoundError,
)
from driversdk.longcalls import LongCallThreads
from driversdk.pb import base_pb2, base_pb2_grpc, driver_pb2, driver_pb2_grpc
from driversdk.plugin.handshake import DRIVER_API_VERSION
from driversdk.statssampler import StatsSampler


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
    from driversdk.model import ExitResult, TaskConfig, TaskEvent

    Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
else:
    convert = _OnFirstUse("driversdk.convert")

log = logging.getLogger("driversdk.service")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# The one pool quick synchronous driver calls run on (InspectTask, SignalTask, Capabilities, ...).
# 32 workers keep the plugin, with grpc's own threads and the sample pool below, within its budget
# of 64 threads. Calls that may take
# long (an image pull, a stop waiting out its kill timeout) run on threads of their own (see
# _Servicer._call), and WaitTask takes a worker only for a watch_exit call (see _ExitWaits).
DRIVER_CALL_WORKERS = 32
# The streams' periodic samples (a TaskStats sample a second per running task, in batches of the
# streams due together, see driversdk.statssampler; fingerprints) run on a small pool of their
# own: with a thousand tasks there are always samples waiting, and a unary call queued behind
# them would wait for all of them. When the driver cannot sample as fast as asked, the streams'
# samples come late; the unary calls do not.
STREAM_SAMPLE_WORKERS = 4


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

    def preload(self) -> None:
        """Build the driver now (see ``serve(preload=True)``); a failure is kept for the first call."""
        try:
            self.get()
        except DriverError:
            pass  # the first call that needs the driver answers with the kept sentence

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
    call = method.__name__
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: Context) -> AsyncIterator[Any]:
            await self._load_driver(context, call)
            responses = method(self, request, context)
            try:
                async for response in responses:
                    yield response
            finally:
                # Close the inner stream now, not at garbage collection: its cleanup (a listener
                # to remove, a session to cancel) must run when the call ends.
                await responses.aclose()

        return cast(F, stream)

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Context) -> Any:
        await self._load_driver(context, call)
        return await method(self, request, context)

    return cast(F, unary)


_CODE_BY_ERROR: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (TaskNotFoundError, grpc.StatusCode.NOT_FOUND),
    (NotSupportedError, grpc.StatusCode.UNIMPLEMENTED),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
]


async def abort_with(context: Context, err: BaseException, call: str) -> NoReturn:
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
    await context.abort_with_status(rpc_status.to_status(status))
    raise AssertionError("abort_with_status returned")  # pragma: no cover - grpc raises


def _code_number(code: grpc.StatusCode) -> int:
    value: int = code.value[0]
    return value


class _ExitWaits:
    """WaitTask calls in flight: one wait on the driver's side per task, however many callers.

    The driver's ``watch_exit`` is asked on a pool worker, which it leaves at once; when it
    cannot watch, ``wait_task`` blocks on a daemon thread of its own, never on a pool worker, so
    tasks that run for days cannot take the workers unary calls need.
    """

    def __init__(self, source: DriverSource, pool: ThreadPoolExecutor) -> None:
        self._source = source
        self._pool = pool
        # Used on the event loop only. An entry lives from the first WaitTask of a task until its
        # exit is known, even once every caller left: the driver (or the waiting thread) still
        # holds our callback, and a later caller joins it rather than adding another.
        self._waiters: dict[str, list[asyncio.Future[ExitResult]]] = {}

    async def wait(self, task_id: str) -> ExitResult:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ExitResult] = loop.create_future()
        waiters = self._waiters.get(task_id)
        if waiters is None:
            waiters = self._waiters[task_id] = []
            self._pool.submit(self._watch, task_id, loop)
        waiters.append(future)
        try:
            return await future
        finally:
            # A caller that left (the host cancelled) is forgotten at once; the watch stays.
            if future.cancelled() and future in waiters:
                waiters.remove(future)

    def _watch(self, task_id: str, loop: asyncio.AbstractEventLoop) -> None:
        def exited(result: ExitResult) -> None:
            self._post(loop, task_id, result, None)

        try:
            if checked(self._source.get()).watch_exit(task_id, exited):
                return
        except Exception as err:
            self._post(loop, task_id, None, err)
            return
        threading.Thread(target=self._block, args=(task_id, loop), daemon=True, name="wait-task").start()

    def _block(self, task_id: str, loop: asyncio.AbstractEventLoop) -> None:
        try:
            result = checked(self._source.get()).wait_task(task_id)
        except Exception as err:
            self._post(loop, task_id, None, err)
        else:
            self._post(loop, task_id, result, None)

    def _post(
        self, loop: asyncio.AbstractEventLoop, task_id: str, result: ExitResult | None, error: Exception | None
    ) -> None:
        # A closed loop means the plugin is exiting: nobody is left to answer.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._settle, task_id, result, error)

    def _settle(self, task_id: str, result: ExitResult | None, error: Exception | None) -> None:
        for future in self._waiters.pop(task_id, []):
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                assert result is not None
                future.set_result(result)


class _DriverCalls:
    """What both servicers share: the driver, the pool its calls run on, the tasks waited on."""

    def __init__(self, source: DriverSource, pool: ThreadPoolExecutor | None = None) -> None:
        self.source = source
        self.pool = pool or ThreadPoolExecutor(DRIVER_CALL_WORKERS, thread_name_prefix="driver-call")
        self.samples = ThreadPoolExecutor(STREAM_SAMPLE_WORKERS, thread_name_prefix="stream-sample")
        self.long = LongCallThreads("long-call")
        self.exits = _ExitWaits(source, self.pool)
        self.stats = StatsSampler(lambda: checked(source.get()), self.samples, STREAM_SAMPLE_WORKERS)


class _Servicer:
    _calls: _DriverCalls

    @property
    def _source(self) -> DriverSource:
        return self._calls.source

    @property
    def _driver(self) -> DriverPlugin:
        # Every call the SDK makes goes through the check: a wrong return type or a stray
        # exception reaches the host as a sentence naming the method (driversdk.authorcheck).
        return checked(self._calls.source.get())

    async def _load_driver(self, context: Context, call: str) -> None:
        if self._calls.source.built is not None:
            return
        # Building may import a heavy module: off the event loop, like every driver call.
        try:
            await asyncio.get_running_loop().run_in_executor(self._calls.pool, self._calls.source.get)
        except DriverError as err:
            await abort_with(context, err, call)

    async def _call(
        self, context: Context, call: str, fn: Callable[[], T], *, long: bool = False, sample: bool = False
    ) -> T:
        """Run ``fn`` (which calls the driver) on the pool; its failure ends the RPC as a status.

        ``long`` calls (starting, stopping, destroying a task, exec) may take as long as an image
        pull or a kill timeout, and a client may issue dozens at once (a job of many tasks
        stopping): they run on a thread of their own for their duration, so they can never hold
        every pool worker while InspectTask or a stats sample waits behind them. A stream's
        periodic ``sample`` runs on the sample pool (STREAM_SAMPLE_WORKERS)."""
        try:
            if long:
                return await _on_own_thread(fn, self._calls.long)
            pool = self._calls.samples if sample else self._calls.pool
            return await asyncio.get_running_loop().run_in_executor(pool, fn)
        except Exception as err:  # every failure must reach the host as a status, never a trace
            await abort_with(context, err, call)


def _on_own_thread(fn: Callable[[], T], threads: LongCallThreads) -> asyncio.Future[T]:
    """``fn`` run on a thread of its own (see driversdk.longcalls); the future settles on the
    calling loop, which never waits for the thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # the caller left (cancelled) meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]  # T when error is None

    def run() -> None:
        try:
            result = fn()
        except BaseException as err:
            outcome: tuple[T | None, BaseException | None] = (None, err)
        else:
            outcome = (result, None)
        # A closed loop means the plugin is exiting: nobody is left to answer.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    threads.submit(run)
    return future


def _calls_for(driver: DriverPlugin | DriverSource | _DriverCalls) -> _DriverCalls:
    if isinstance(driver, _DriverCalls):
        return driver
    return _DriverCalls(driver if isinstance(driver, DriverSource) else DriverSource(driver))


class BasePluginServicer(_Servicer, base_pb2_grpc.BasePluginServicer):
    def __init__(self, driver: DriverPlugin | DriverSource | _DriverCalls) -> None:
        self._calls = _calls_for(driver)

    async def PluginInfo(self, request: base_pb2.PluginInfoRequest, context: Context) -> base_pb2.PluginInfoResponse:
        return base_pb2.PluginInfoResponse(
            type=base_pb2.DRIVER,
            plugin_api_versions=[DRIVER_API_VERSION],
            plugin_version=self._source.version,
            name=self._source.name,
        )

    async def ConfigSchema(
        self, request: base_pb2.ConfigSchemaRequest, context: Context
    ) -> base_pb2.ConfigSchemaResponse:
        def schema() -> base_pb2.ConfigSchemaResponse:
            spec = self._driver.config_schema()
            if spec is None:
                return base_pb2.ConfigSchemaResponse()
            return base_pb2.ConfigSchemaResponse(spec=spec.to_proto())

        return await self._call(context, "ConfigSchema", schema)

    async def SetConfig(self, request: base_pb2.SetConfigRequest, context: Context) -> base_pb2.SetConfigResponse:
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

        await self._call(context, "SetConfig", apply)
        return base_pb2.SetConfigResponse()


ExecResponse: TypeAlias = driver_pb2.ExecTaskStreamingResponse


class _GrpcExecSession(ExecSession):
    """Bridges ExecTaskStreaming to a driver running on a thread of its own.

    Requests are read on the event loop into a thread-safe stdin queue; the driver's output goes
    back to the loop through ``call_soon_threadsafe`` into an asyncio queue the RPC drains.
    """

    def __init__(
        self,
        setup: driver_pb2.ExecTaskStreamingRequest.Setup,
        loop: asyncio.AbstractEventLoop,
        out: asyncio.Queue[ExecResponse | None],
    ) -> None:
        self.task_id = setup.task_id
        self.command = list(setup.command)
        self.tty = setup.tty
        self._loop = loop
        self._out = out
        self._stdin: queue.Queue[bytes | None] = queue.Queue()
        self._size: TerminalSize | None = None
        self._resize_callbacks: list[Callable[[TerminalSize], None]] = []
        self._cancelled = threading.Event()

    async def read_requests(self, requests: AsyncIterator[driver_pb2.ExecTaskStreamingRequest]) -> None:
        """Feed stdin and resizes to the driver until the client's input ends."""
        try:
            async for req in requests:
                if req.HasField("stdin"):
                    if req.stdin.data:
                        self._stdin.put(bytes(req.stdin.data))
                    if req.stdin.close:
                        self._stdin.put(None)
                elif req.HasField("tty_size"):
                    self._size = TerminalSize(req.tty_size.height, req.tty_size.width)
                    for cb in list(self._resize_callbacks):
                        try:
                            cb(self._size)
                        except Exception:
                            log.exception("exec resize callback failed", extra={"task_id": self.task_id})
                # anything else is a heartbeat
        except Exception as err:
            # Reading failed: the stream broke or ended under us, so the client is gone (its
            # closing its input is not a cancel). Kept here: nobody awaits this task's result.
            log.debug("exec stream input ended", extra={"task_id": self.task_id, "error": str(err)})
            self._cancelled.set()
        finally:
            self._stdin.put(None)

    def cancel(self) -> None:
        self._cancelled.set()
        self._stdin.put(None)

    def finish(self) -> None:
        """Called by the driver's thread once it returned: no more output."""
        self._send(None)

    def _send(self, item: ExecResponse | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the plugin is exiting
            self._loop.call_soon_threadsafe(self._out.put_nowait, item)

    def read_stdin(self, timeout: float | None = None) -> bytes | None:
        try:
            return self._stdin.get(timeout=timeout)
        except queue.Empty:
            return b""

    def send_stdout(self, data: bytes) -> None:
        if data:
            self._send(ExecResponse(stdout=driver_pb2.ExecTaskStreamingIOOperation(data=data)))

    def send_stderr(self, data: bytes) -> None:
        if data:
            self._send(ExecResponse(stderr=driver_pb2.ExecTaskStreamingIOOperation(data=data)))

    def terminal_size(self) -> TerminalSize | None:
        return self._size

    def on_resize(self, callback: Callable[[TerminalSize], None]) -> None:
        self._resize_callbacks.append(callback)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class DriverServicer(_Servicer, driver_pb2_grpc.DriverServicer):
    def __init__(self, driver: DriverPlugin | DriverSource | _DriverCalls) -> None:
        self._calls = _calls_for(driver)
        self._task_spec: Spec | None = None

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

    async def Init(self, request: driver_pb2.InitRequest, context: Context) -> driver_pb2.InitResponse:
        await self._call(context, "Init", self._driver.init)
        return driver_pb2.InitResponse()

    async def Shutdown(self, request: driver_pb2.ShutdownRequest, context: Context) -> driver_pb2.ShutdownResponse:
        await self._call(context, "Shutdown", self._driver.shutdown)
        return driver_pb2.ShutdownResponse()

    async def TaskConfigSchema(
        self, request: driver_pb2.TaskConfigSchemaRequest, context: Context
    ) -> driver_pb2.TaskConfigSchemaResponse:
        spec = await self._call(context, "TaskConfigSchema", self._task_schema)
        return driver_pb2.TaskConfigSchemaResponse(spec=spec.to_proto())

    async def Capabilities(
        self, request: driver_pb2.CapabilitiesRequest, context: Context
    ) -> driver_pb2.CapabilitiesResponse:
        caps = await self._call(context, "Capabilities", self._driver.capabilities)
        return driver_pb2.CapabilitiesResponse(capabilities=convert.capabilities_to_proto(caps))

    async def StartTask(self, request: driver_pb2.StartTaskRequest, context: Context) -> driver_pb2.StartTaskResponse:
        def start() -> driver_pb2.StartTaskResponse:
            task = self._decode_task(request.task)
            handle = self._driver.start_task(task)
            # Always echo the TaskConfig Nomad sent: it is what gets persisted for recovery.
            handle.config = task
            resp = driver_pb2.StartTaskResponse(handle=convert.task_handle_to_proto(handle))
            if handle.network_override is not None:
                resp.network_override.CopyFrom(convert.network_override_to_proto(handle.network_override))
            return resp

        return await self._call(context, "StartTask", start, long=True)

    async def RecoverTask(
        self, request: driver_pb2.RecoverTaskRequest, context: Context
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

        await self._call(context, "RecoverTask", recover)
        return driver_pb2.RecoverTaskResponse()

    async def WaitTask(self, request: driver_pb2.WaitTaskRequest, context: Context) -> driver_pb2.WaitTaskResponse:
        try:
            result = await self._calls.exits.wait(request.task_id)
        except Exception as err:
            await abort_with(context, err, "WaitTask")
        return driver_pb2.WaitTaskResponse(result=convert.exit_result_to_proto(result))

    async def StopTask(self, request: driver_pb2.StopTaskRequest, context: Context) -> driver_pb2.StopTaskResponse:
        timeout = convert.duration_from_proto(request.timeout)
        driver = self._driver
        await self._call(
            context, "StopTask", lambda: driver.stop_task(request.task_id, timeout, request.signal), long=True
        )
        return driver_pb2.StopTaskResponse()

    async def DestroyTask(
        self, request: driver_pb2.DestroyTaskRequest, context: Context
    ) -> driver_pb2.DestroyTaskResponse:
        driver = self._driver
        await self._call(context, "DestroyTask", lambda: driver.destroy_task(request.task_id, request.force), long=True)
        return driver_pb2.DestroyTaskResponse()

    async def InspectTask(
        self, request: driver_pb2.InspectTaskRequest, context: Context
    ) -> driver_pb2.InspectTaskResponse:
        driver = self._driver
        status = await self._call(context, "InspectTask", lambda: driver.inspect_task(request.task_id))
        resp = driver_pb2.InspectTaskResponse(
            task=convert.task_status_to_proto(status),
            driver=driver_pb2.TaskDriverStatus(attributes=dict(status.driver_attributes)),
        )
        if status.network_override is not None:
            resp.network_override.CopyFrom(convert.network_override_to_proto(status.network_override))
        return resp

    async def SignalTask(
        self, request: driver_pb2.SignalTaskRequest, context: Context
    ) -> driver_pb2.SignalTaskResponse:
        driver = self._driver
        await self._call(context, "SignalTask", lambda: driver.signal_task(request.task_id, request.signal))
        return driver_pb2.SignalTaskResponse()

    async def ExecTask(self, request: driver_pb2.ExecTaskRequest, context: Context) -> driver_pb2.ExecTaskResponse:
        timeout = convert.duration_from_proto(request.timeout) or None
        driver = self._driver
        result = await self._call(
            context, "ExecTask", lambda: driver.exec_task(request.task_id, list(request.command), timeout), long=True
        )
        return convert.exec_result_to_proto(result)

    async def CreateNetwork(
        self, request: driver_pb2.CreateNetworkRequest, context: Context
    ) -> driver_pb2.CreateNetworkResponse:
        driver = self._driver
        spec, created = await self._call(
            context, "CreateNetwork", lambda: driver.create_network(request.alloc_id, request.hostname)
        )
        return driver_pb2.CreateNetworkResponse(isolation_spec=convert.network_spec_to_proto(spec), created=created)

    async def DestroyNetwork(
        self, request: driver_pb2.DestroyNetworkRequest, context: Context
    ) -> driver_pb2.DestroyNetworkResponse:
        spec = convert.network_spec_from_proto(request.isolation_spec)
        driver = self._driver
        await self._call(context, "DestroyNetwork", lambda: driver.destroy_network(request.alloc_id, spec))
        return driver_pb2.DestroyNetworkResponse()

    # --- streams ---------------------------------------------------------------------------
    # Each ends when the host cancels it: grpc cancels the coroutine at the await it waits on.

    async def Fingerprint(
        self, request: driver_pb2.FingerprintRequest, context: Context
    ) -> AsyncIterator[driver_pb2.FingerprintResponse]:
        driver = self._driver
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def notified() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the plugin is exiting
                loop.call_soon_threadsafe(changed.set)

        driver.add_fingerprint_listener(notified)
        try:
            while True:
                # Cleared before reading: a change while fingerprint() runs sends another one.
                changed.clear()
                fp = await self._call(context, "Fingerprint", driver.fingerprint, sample=True)
                yield convert.fingerprint_to_proto(fp)
                # Re-send after the interval, earlier on notify_fingerprint_changed.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(driver.fingerprint_interval):
                        await changed.wait()
        finally:
            driver.remove_fingerprint_listener(notified)

    async def TaskStats(
        self, request: driver_pb2.TaskStatsRequest, context: Context
    ) -> AsyncIterator[driver_pb2.TaskStatsResponse]:
        interval = convert.duration_from_proto(request.collection_interval) or 1.0
        # Sampled with the other streams of the same interval whose samples fall due together:
        # one pool job and one loop wake-up for many (see driversdk.statssampler).
        samples = self._calls.stats.open(request.task_id, interval)
        try:
            while True:
                try:
                    response = await samples.next()
                except Exception as err:  # every failure must reach the host as a status
                    await abort_with(context, err, "TaskStats")
                if response is None:
                    return
                yield response
        finally:
            samples.close()

    async def TaskEvents(
        self, request: driver_pb2.TaskEventsRequest, context: Context
    ) -> AsyncIterator[driver_pb2.DriverTaskEvent]:
        driver = self._driver
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TaskEvent] = asyncio.Queue()

        def emitted(event: TaskEvent) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the plugin is exiting
                loop.call_soon_threadsafe(events.put_nowait, event)

        driver.add_event_listener(emitted)
        try:
            while True:
                yield convert.task_event_to_proto(await events.get())
        finally:
            driver.remove_event_listener(emitted)

    async def ExecTaskStreaming(
        self, request_iterator: AsyncIterator[driver_pb2.ExecTaskStreamingRequest], context: Context
    ) -> AsyncIterator[ExecResponse]:
        requests = aiter(request_iterator)
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            return
        if not first.HasField("setup"):
            await abort_with(context, ConfigError("the first ExecTaskStreaming message must carry setup"), "ExecTask")
        loop = asyncio.get_running_loop()
        # None marks the end of the driver's output.
        out: asyncio.Queue[ExecResponse | None] = asyncio.Queue()
        session = _GrpcExecSession(first.setup, loop, out)
        driver = self._driver
        outcome: list[ExitResult] = []
        failure: list[Exception] = []

        def run() -> None:
            try:
                outcome.append(driver.exec_task_streaming(session))
            except Exception as err:
                failure.append(err)
            finally:
                session.finish()

        reader = asyncio.create_task(session.read_requests(requests))
        # An interactive session may last hours: a thread of its own, not a pool worker.
        threading.Thread(target=run, daemon=True, name=f"exec-{session.task_id}").start()
        finished = False
        try:
            while (item := await out.get()) is not None:
                yield item
            finished = True
        finally:
            if not finished:
                session.cancel()  # the client left before the driver was done: it must see that
            reader.cancel()
        if failure:
            await abort_with(context, failure[0], "ExecTaskStreaming")
        closed = driver_pb2.ExecTaskStreamingIOOperation(close=True)
        yield ExecResponse(stdout=closed)
        yield ExecResponse(stderr=closed)
        yield ExecResponse(exited=True, result=convert.exit_result_to_proto(outcome[0]))


# Every call but PluginInfo needs the driver itself: a deferred one is built (or its failure
# reported as a status) before the servicer method runs.
for _servicer, _answered_without in ((BasePluginServicer, {"PluginInfo"}), (DriverServicer, set())):
    for _name, _method in list(vars(_servicer).items()):
        if _name[:1].isupper() and callable(_method) and _name not in _answered_without:
            setattr(_servicer, _name, _loads_driver(_method))


def register_driver(
    server: grpc.aio.Server, driver: DriverPlugin | DriverSource, *, pool: ThreadPoolExecutor | None = None
) -> None:
    """Add the BasePlugin and Driver services to ``server``; driver calls run on ``pool``.

    Without ``pool``, one of DRIVER_CALL_WORKERS threads is made, shared by both services.
    """
    source = driver if isinstance(driver, DriverSource) else DriverSource(driver)
    calls = _DriverCalls(source, pool)
    base_pb2_grpc.add_BasePluginServicer_to_server(BasePluginServicer(calls), server)
    driver_pb2_grpc.add_DriverServicer_to_server(DriverServicer(calls), server)


__all__ = [
    "DRIVER_CALL_WORKERS",
    "STREAM_SAMPLE_WORKERS",
    "BasePluginServicer",
    "DriverServicer",
    "DriverSource",
    "abort_with",
    "register_driver",
]
