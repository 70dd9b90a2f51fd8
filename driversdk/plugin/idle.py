"""When a plugin has nothing left to do: no task, no network, no call in flight.

A plugin ``driversdk run`` keeps for its next run (:data:`~driversdk.plugin.handshake.ENV_IDLE_EXIT`)
must not outlive its usefulness: once nobody has used it for that long it stops as if told to.
What counts as use is read off the calls themselves, whatever the driver: a task lives from a
StartTask or RecoverTask that succeeded until its DestroyTask; a network from CreateNetwork until
DestroyNetwork; and any call in flight (a host's open WaitTask or TaskEvents stream is one) keeps
the plugin busy for as long as it is open. A plugin whose host was killed while tasks ran is
therefore never idle: it waits, as before, for a run to reattach and recover them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

_DRIVER = "/hashicorp.nomad.plugins.drivers.proto.Driver/"
# How often the watch looks (the idle time is counted exactly; this only bounds the lateness).
_TICK = 0.25


class IdleWatch:
    """Counts what keeps a plugin busy; :meth:`idle` returns once nothing has for ``after`` seconds."""

    def __init__(self, after: float) -> None:
        self.after = after
        self.in_flight = 0
        self.tasks: set[str] = set()
        self.networks: set[str] = set()
        self._since = time.monotonic()

    def busy(self) -> bool:
        return bool(self.in_flight or self.tasks or self.networks)

    def _begin(self) -> None:
        self.in_flight += 1

    def _end(self, method: str, request: Any, ok: bool, code: grpc.StatusCode | None = None) -> None:
        self.in_flight -= 1
        self._since = time.monotonic()
        name = method.removeprefix(_DRIVER) if method.startswith(_DRIVER) else ""
        if name == "StartTask" and ok:
            self.tasks.add(request.task.id)
        elif name == "RecoverTask" and ok:
            self.tasks.add(request.handle.config.id)
        elif name == "DestroyTask" and (ok or code == grpc.StatusCode.NOT_FOUND):
            self.tasks.discard(request.task_id)
        elif name == "CreateNetwork" and ok:
            self.networks.add(request.alloc_id)
        elif name == "DestroyNetwork" and ok:
            self.networks.discard(request.alloc_id)

    async def idle(self) -> None:
        """Return once the plugin has been idle for ``after`` seconds in a row."""
        while True:
            await asyncio.sleep(_TICK)
            if not self.busy() and time.monotonic() - self._since >= self.after:
                return

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _Counting(self)


def _status(context: Any) -> grpc.StatusCode | None:
    code = context.code()
    return code if isinstance(code, grpc.StatusCode) else None


class _Counting(grpc.aio.ServerInterceptor):
    """Wraps every method's behaviour so the watch sees it begin and end."""

    def __init__(self, watch: IdleWatch) -> None:
        self._watch = watch

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler  # an unknown method: grpc answers UNIMPLEMENTED itself
        method = handler_call_details.method
        watch = self._watch
        kinds = {
            "unary_unary": grpc.unary_unary_rpc_method_handler,
            "unary_stream": grpc.unary_stream_rpc_method_handler,
            "stream_unary": grpc.stream_unary_rpc_method_handler,
            "stream_stream": grpc.stream_stream_rpc_method_handler,
        }
        for kind, make in kinds.items():
            behaviour = getattr(handler, kind)
            if behaviour is not None:
                wrapped = _counted(watch, method, behaviour)
                return make(
                    wrapped,
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler


def _counted(watch: IdleWatch, method: str, behaviour: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behaviour):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            watch._begin()
            ok = False
            try:
                async for response in behaviour(request, context):
                    yield response
                ok = True
            finally:
                watch._end(method, request, ok, _status(context))

        return stream

    async def call(request: Any, context: Any) -> Any:
        watch._begin()
        ok = False
        try:
            result = behaviour(request, context)
            if inspect.isawaitable(result):
                result = await result
            ok = _status(context) in (None, grpc.StatusCode.OK)
            return result
        finally:
            watch._end(method, request, ok, _status(context))

    return call
