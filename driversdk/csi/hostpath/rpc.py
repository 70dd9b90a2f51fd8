"""The one preamble of every hostpath RPC, as a decorator: ``@rpc(required=("volume_id",))``.

In this order, the first that applies being the answer: UNIMPLEMENTED for an RPC whose capability is
not advertised; then the injected fault (fail, delay, hang); then the required arguments, each
INVALID_ARGUMENT naming the first one missing; then the method's own logic, whose OSError
becomes INTERNAL with its text. Argument checks all run before the method looks anything up.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from driversdk.csi.hostpath.faults import HANG, hang
from driversdk.csi.hostpath.plugin import (
    GATED_RPCS,
    HostPathState,
    check_capability,
    fail,
    invalid,
    require_path,
)
from driversdk.pb import csi_pb2


class Service(Protocol):
    """A servicer of this plugin: it holds the shared state."""

    @property
    def state(self) -> HostPathState: ...


S = TypeVar("S", bound=Service)
Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp")
Method = Callable[[S, Req, grpc.ServicerContext], Resp]

_CTRL = csi_pb2.ControllerServiceCapability.RPC
_NODE = csi_pb2.NodeServiceCapability.RPC


def _check_served(state: HostPathState, name: str, context: grpc.ServicerContext) -> None:
    if state.advertised.serves(name):
        return
    role, capability = GATED_RPCS[name]
    enum = _CTRL.Type if role == "controller" else _NODE.Type
    fail(
        context,
        grpc.StatusCode.UNIMPLEMENTED,
        f"{name} is not served: this plugin does not advertise the {role} capability {enum.Name(capability)}",  # type: ignore[arg-type]
    )


def _apply_fault(state: HostPathState, name: str, context: grpc.ServicerContext) -> None:
    delay = state.faults.before(name, context)
    if delay == HANG:
        hang(name, context)
    elif delay:
        time.sleep(delay)


def _check_required(request: Message, fields: tuple[str, ...], context: grpc.ServicerContext) -> None:
    """INVALID_ARGUMENT naming the first field that is unset: an empty scalar, an empty list
    ("are required") or an absent message."""
    descriptors = request.DESCRIPTOR.fields_by_name
    for name in fields:
        field = descriptors[name]
        if field.is_repeated:
            if not getattr(request, name):
                invalid(context, f"{name} are required")
        elif field.message_type is not None:
            if not request.HasField(name):
                invalid(context, f"{name} is required")
        elif not getattr(request, name):
            invalid(context, f"{name} is required")


def rpc(
    *, required: tuple[str, ...] = (), paths: tuple[str, ...] = (), capability: str = ""
) -> Callable[[Method[S, Req, Resp]], Method[S, Req, Resp]]:
    """Wrap a servicer method (named as the RPC) in the shared preamble.

    ``required``: fields that must be set, checked in order; ``paths``: then fields that must be
    absolute paths; ``capability``: then a VolumeCapability field that must be set and servable.
    """

    def wrap(method: Method[S, Req, Resp]) -> Method[S, Req, Resp]:
        name = method.__name__

        @functools.wraps(method)
        def serve(self: S, request: Req, context: grpc.ServicerContext) -> Resp:
            _check_served(self.state, name, context)
            _apply_fault(self.state, name, context)
            try:
                _check_required(request, required, context)
                for field in paths:
                    require_path(context, field, getattr(request, field))
                if capability:
                    _check_required(request, (capability,), context)
                    check_capability(context, getattr(request, capability), capability)
                return method(self, request, context)
            except OSError as err:
                fail(context, grpc.StatusCode.INTERNAL, f"{name}: {err}")

        return serve

    return wrap
