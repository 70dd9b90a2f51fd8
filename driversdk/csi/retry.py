"""Which CSI calls are retried, on which codes, with what backoff: one explicit table.

Nomad declares "up to 3 attempts, 100 ms exponential backoff, on UNAVAILABLE / RESOURCE_EXHAUSTED /
deadline" for controller and node volume calls but never installs the interceptor that would
apply it, so every call is tried once. Ours really retries. Identity, capability and info calls
never retry (the fingerprint loop calls them again), nor does anything answered UNIMPLEMENTED.
ABORTED ("another operation is pending for this volume") is retried too, as the spec asks.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int
    codes: frozenset[grpc.StatusCode]
    base_backoff: float = 0.1
    attempt_timeout: float = 120.0

    def backoff(self, attempt: int) -> float:
        """Wait before attempt number ``attempt`` (1-based retries): 0.1 s, 0.2 s, …"""
        return float(self.base_backoff * (2 ** (attempt - 1)))


_TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
    }
)
VOLUME_CALL = RetryPolicy(attempts=3, codes=_TRANSIENT)
NEVER = RetryPolicy(attempts=1, codes=frozenset(), attempt_timeout=30.0)
PROBE = RetryPolicy(attempts=1, codes=frozenset(), attempt_timeout=5.0)

RETRY_TABLE: dict[str, RetryPolicy] = {
    # identity and discovery: never retried here; the fingerprint loop asks again
    "GetPluginInfo": RetryPolicy(attempts=1, codes=frozenset(), attempt_timeout=1.0),
    "GetPluginCapabilities": NEVER,
    "Probe": PROBE,
    "ControllerGetCapabilities": NEVER,
    "NodeGetCapabilities": NEVER,
    "NodeGetInfo": NEVER,
    # volume calls: idempotent by the spec, so a retry is safe
    "CreateVolume": VOLUME_CALL,
    "DeleteVolume": VOLUME_CALL,
    "ControllerPublishVolume": VOLUME_CALL,
    "ControllerUnpublishVolume": VOLUME_CALL,
    "ValidateVolumeCapabilities": VOLUME_CALL,
    "ListVolumes": VOLUME_CALL,
    "ControllerExpandVolume": VOLUME_CALL,
    "NodeStageVolume": VOLUME_CALL,
    "NodeUnstageVolume": VOLUME_CALL,
    "NodePublishVolume": VOLUME_CALL,
    "NodeUnpublishVolume": VOLUME_CALL,
    "NodeExpandVolume": VOLUME_CALL,
    # sent by Nomad's client endpoint with the same options as the volume calls (csi reference §2.4)
    "CreateSnapshot": VOLUME_CALL,
    "DeleteSnapshot": VOLUME_CALL,
    "ListSnapshots": VOLUME_CALL,
    "ControllerGetVolume": VOLUME_CALL,
}


def policy_for(call: str) -> RetryPolicy:
    return RETRY_TABLE.get(call, NEVER)
