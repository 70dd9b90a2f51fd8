"""Fault injection for tests: make the next N calls of an RPC fail with a code, be slow, or hang.

Spec syntax (``--fault`` flag or CSI_HOSTPATH_FAULTS, comma separated):
``NodeStageVolume=UNAVAILABLE:2`` fails the next two NodeStageVolume calls with UNAVAILABLE;
``Probe=delay:3`` makes every Probe take three seconds;
``NodePublishVolume=hang`` makes every NodePublishVolume never answer (``hang:2``: the next two),
until the caller cancels it or its deadline passes; the volume is left untouched.

A call log (``--call-log`` or CSI_HOSTPATH_CALL_LOG) gets one line per call, the RPC's name (with
``=CODE`` when a fault failed it), in the order they came: a test reads the order of calls across
restarts of the plugin. With ``--call-times`` (CSI_HOSTPATH_CALL_TIMES=1) each line also carries
the wall-clock time of the call after a tab, and a ``listening`` line marks when the socket began
to accept: a bench reads how long after that the first Probe came.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import grpc

HANG = float("inf")  # what before() returns for a call that must never answer


@dataclass
class Fault:
    code: grpc.StatusCode | None
    remaining: int  # -1: every call
    delay: float = 0.0


class Faults:
    def __init__(self, spec: str = "", call_log: str = "", call_times: bool = False) -> None:
        self._faults: dict[str, Fault] = {}
        self._call_log = call_log
        self._call_times = call_times
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            rpc, _, action = item.partition("=")
            kind, _, arg = action.partition(":")
            if kind == "delay":
                self._faults[rpc] = Fault(None, -1, float(arg or 1))
            elif kind == "hang":
                self._faults[rpc] = Fault(None, int(arg) if arg else -1, HANG)
            else:
                self._faults[rpc] = Fault(grpc.StatusCode[kind], int(arg or 1))

    def _log(self, line: str) -> None:
        if self._call_log:
            stamp = f"\t{time.time():.6f}" if self._call_times else ""
            with open(self._call_log, "a", encoding="utf-8") as log:
                log.write(line + stamp + "\n")

    def listening(self) -> None:
        """Mark in a timed call log that the socket accepts connections now."""
        if self._call_times:
            self._log("listening")

    def before(self, rpc: str, context: grpc.ServicerContext) -> float:
        """Count the call; returns a delay to apply (HANG: never answer), or aborts the call with
        the injected code."""
        with self._lock:
            self.calls[rpc] = self.calls.get(rpc, 0) + 1
            fault = self._faults.get(rpc)
            if fault is None or fault.remaining == 0 or fault.code is None:
                self._log(rpc)
                if fault is None or fault.remaining == 0:
                    return 0.0
                if fault.remaining > 0:
                    fault.remaining -= 1
                return fault.delay
            fault.remaining -= 1
            code = fault.code
            self._log(f"{rpc}={code.name}")
        context.abort(code, f"injected fault: {rpc} fails with {code.name}")
        return 0.0  # pragma: no cover - abort raises


def hang(rpc: str, context: grpc.ServicerContext) -> None:
    """Hold the call until the caller gives up on it (cancel, deadline, closed channel)."""
    gone = threading.Event()
    if context.add_callback(gone.set):
        gone.wait()
    context.abort(grpc.StatusCode.CANCELLED, f"injected fault: {rpc} hung until the caller gave up")
