"""Fault injection for tests: make the next N calls of an RPC fail with a code, or be slow.

Spec syntax (``--fault`` flag or CSI_HOSTPATH_FAULTS, comma separated):
``NodeStageVolume=UNAVAILABLE:2`` fails the next two NodeStageVolume calls with UNAVAILABLE;
``Probe=delay:3`` makes every Probe take three seconds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc


@dataclass
class Fault:
    code: grpc.StatusCode | None
    remaining: int
    delay: float = 0.0


class Faults:
    def __init__(self, spec: str = "") -> None:
        self._faults: dict[str, Fault] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            rpc, _, action = item.partition("=")
            kind, _, arg = action.partition(":")
            if kind == "delay":
                self._faults[rpc] = Fault(None, -1, float(arg or 1))
            else:
                self._faults[rpc] = Fault(grpc.StatusCode[kind], int(arg or 1))

    def before(self, rpc: str, context: grpc.ServicerContext) -> float:
        """Count the call; returns a delay to apply, or aborts the call with the injected code."""
        with self._lock:
            self.calls[rpc] = self.calls.get(rpc, 0) + 1
            fault = self._faults.get(rpc)
            if fault is None:
                return 0.0
            if fault.code is None:
                return fault.delay
            if fault.remaining == 0:
                return 0.0
            fault.remaining -= 1
            code = fault.code
        context.abort(code, f"injected fault: {rpc} fails with {code.name}")
        return 0.0  # pragma: no cover - abort raises
