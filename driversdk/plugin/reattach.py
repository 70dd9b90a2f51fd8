"""The record a host keeps of a plugin it launched, to find that plugin again after the host restarts.

It is plain data: ``host`` writes it when it launches a plugin and reads it to reattach, and
``verify`` checks a recorded plugin against it before anything is sent, so both depend on this
module and neither on the other.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from driversdk.plugin.handshake import APP_PROTOCOL_VERSION


@dataclass(frozen=True)
class ReattachConfig:
    """What a host saves to find a running plugin again after it restarts. ``start_time`` is when
    the launched process started (field 22 of /proc/<pid>/stat): with the pid, it names that one
    process, and no later one that is given the same pid. 0 means unknown (a record without the
    field): the process is then told apart by its uid and its socket alone."""

    pid: int
    network: str
    address: str
    protocol: str = "grpc"
    app_version: int = APP_PROTOCOL_VERSION
    start_time: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReattachConfig:
        data = json.loads(text)
        return cls(
            pid=int(data["pid"]),
            network=str(data["network"]),
            address=str(data["address"]),
            protocol=str(data.get("protocol", "grpc")),
            app_version=int(data.get("app_version", APP_PROTOCOL_VERSION)),
            start_time=int(data.get("start_time", 0)),
        )


__all__ = ["ReattachConfig"]
