"""CSI failures as operator sentences that keep the gRPC code, the call, the volume and the
plugin's own words (first line, cleaned), as Nomad's client does."""

from __future__ import annotations

import re
from dataclasses import dataclass

import grpc

from driversdk.errors import DriverSDKError
from driversdk.plugin.host import rpc_call_of

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
IGNORABLE = "CSI client error (ignorable)"


class CSIError(DriverSDKError):
    """A CSI RPC failed. ``code`` is the gRPC code name; ``ignorable`` marks "already gone"."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        call: str,
        volume: str = "",
        plugin_message: str = "",
        ignorable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.call = call
        self.volume = volume
        self.plugin_message = plugin_message
        self.ignorable = ignorable


class CSIConnectError(CSIError):
    """The plugin's socket could not be opened."""


def clean_detail(detail: str, limit: int = 300) -> str:
    """First line of a plugin message, without colour codes, trimmed (stack traces are common)."""
    lines = [line.strip() for line in _ANSI.sub("", detail or "").splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _camel(code: grpc.StatusCode) -> str:
    return "".join(part.capitalize() for part in code.name.split("_"))


# (call, code) -> sentence template; {v} volume (the name for CreateVolume), {n} node, {p} path,
# {s} snapshot, {src} a CreateVolume content source, {t} a paging token.
_MESSAGES: dict[tuple[str, grpc.StatusCode], str] = {
    ("ControllerPublishVolume", grpc.StatusCode.NOT_FOUND): 'volume "{v}" or node "{n}" could not be found',
    ("ControllerPublishVolume", grpc.StatusCode.ALREADY_EXISTS): (
        'volume "{v}" is already published at node "{n}" but with capabilities or a read_only setting '
        "incompatible with this request"
    ),
    ("ControllerPublishVolume", grpc.StatusCode.RESOURCE_EXHAUSTED): (
        'node "{n}" has reached the maximum allowable number of attached volumes'
    ),
    ("ControllerPublishVolume", grpc.StatusCode.FAILED_PRECONDITION): (
        'volume "{v}" is already published on another node and does not have MULTI_NODE volume capability'
    ),
    ("ControllerUnpublishVolume", grpc.StatusCode.NOT_FOUND): (
        IGNORABLE + ': volume "{v}" or node "{n}" could not be found'
    ),
    ("ValidateVolumeCapabilities", grpc.StatusCode.NOT_FOUND): 'volume "{v}" could not be found',
    ("CreateVolume", grpc.StatusCode.INVALID_ARGUMENT): (
        'volume "{v}" snapshot source "{src}" is not compatible with these parameters'
    ),
    ("CreateVolume", grpc.StatusCode.NOT_FOUND): 'volume "{v}" content source "{src}" does not exist',
    (
        "CreateVolume",
        grpc.StatusCode.ALREADY_EXISTS,
    ): 'volume "{v}" already exists but is incompatible with these parameters',
    ("CreateVolume", grpc.StatusCode.RESOURCE_EXHAUSTED): 'unable to provision "{v}" in accessible_topology',
    ("CreateVolume", grpc.StatusCode.OUT_OF_RANGE): 'unsupported capacity_range for volume "{v}"',
    ("DeleteVolume", grpc.StatusCode.FAILED_PRECONDITION): 'volume "{v}" is in use',
    ("ListVolumes", grpc.StatusCode.ABORTED): 'invalid starting token "{t}"',
    ("ListSnapshots", grpc.StatusCode.ABORTED): 'invalid starting token "{t}"',
    ("CreateSnapshot", grpc.StatusCode.ALREADY_EXISTS): (
        'snapshot "{s}" already exists but is incompatible with volume ID "{v}"'
    ),
    ("CreateSnapshot", grpc.StatusCode.ABORTED): 'snapshot "{s}" is already pending',
    ("CreateSnapshot", grpc.StatusCode.RESOURCE_EXHAUSTED): (
        "storage provider does not have enough space for this snapshot"
    ),
    ("DeleteSnapshot", grpc.StatusCode.FAILED_PRECONDITION): (
        'snapshot "{s}" could not be deleted because it is in use'
    ),
    ("DeleteSnapshot", grpc.StatusCode.ABORTED): 'snapshot "{s}" has a pending operation',
    ("NodeStageVolume", grpc.StatusCode.NOT_FOUND): 'volume "{v}" could not be found',
    ("NodeStageVolume", grpc.StatusCode.ALREADY_EXISTS): (
        'volume "{v}" is already staged to "{p}" but with incompatible capabilities for this request'
    ),
    ("NodeStageVolume", grpc.StatusCode.FAILED_PRECONDITION): (
        'volume "{v}" does not have MULTI_NODE volume capability'
    ),
    ("NodePublishVolume", grpc.StatusCode.NOT_FOUND): 'volume "{v}" could not be found',
    ("NodePublishVolume", grpc.StatusCode.ALREADY_EXISTS): (
        'volume "{v}" is already published at target path "{p}" but with capabilities or a read_only setting '
        "incompatible with this request"
    ),
    # The plugin's own reason says which precondition failed (not staged, a missing parent, an
    # access mode allowing one target...): no guess is put before it.
    ("NodePublishVolume", grpc.StatusCode.FAILED_PRECONDITION): (
        'CSI plugin {plugin!r} refused to publish volume "{v}" at "{p}" (a precondition failed)'
    ),
    ("ControllerExpandVolume", grpc.StatusCode.INVALID_ARGUMENT): (
        'requested capabilities not compatible with volume "{v}"'
    ),
    ("ControllerExpandVolume", grpc.StatusCode.NOT_FOUND): 'volume "{v}" could not be found',
    ("ControllerExpandVolume", grpc.StatusCode.FAILED_PRECONDITION): 'volume "{v}" cannot be expanded online',
    ("ControllerExpandVolume", grpc.StatusCode.OUT_OF_RANGE): 'unsupported capacity_range for volume "{v}"',
    ("NodeExpandVolume", grpc.StatusCode.INVALID_ARGUMENT): 'requested capabilities not compatible with volume "{v}"',
    ("NodeExpandVolume", grpc.StatusCode.NOT_FOUND): IGNORABLE + ': volume "{v}" could not be found',
    ("NodeExpandVolume", grpc.StatusCode.FAILED_PRECONDITION): 'volume "{v}" cannot be expanded while in use',
    ("NodeExpandVolume", grpc.StatusCode.OUT_OF_RANGE): 'unsupported capacity_range for volume "{v}"',
    ("NodeUnstageVolume", grpc.StatusCode.NOT_FOUND): IGNORABLE + ': volume "{v}" could not be found',
    ("NodeUnpublishVolume", grpc.StatusCode.NOT_FOUND): IGNORABLE + ': volume "{v}" could not be found',
}

# Teardown calls whose NOT_FOUND means "already gone": the spec makes them idempotent, so the
# client treats the answer as done (Nomad's client does the same). Decided by call and code; the
# sentence's IGNORABLE prefix is for the operator only.
_IGNORABLE: frozenset[tuple[str, grpc.StatusCode]] = frozenset(
    {
        ("ControllerUnpublishVolume", grpc.StatusCode.NOT_FOUND),
        ("NodeUnstageVolume", grpc.StatusCode.NOT_FOUND),
        ("NodeUnpublishVolume", grpc.StatusCode.NOT_FOUND),
        ("NodeExpandVolume", grpc.StatusCode.NOT_FOUND),
    }
)

_CONTROLLER_CALLS = {
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
}


@dataclass(frozen=True)
class CallContext:
    """What one CSI call was about: the names its failure's sentence is made of."""

    call: str
    plugin: str
    volume: str = ""  # the volume's name for CreateVolume, else its ID at the plugin
    node: str = ""
    path: str = ""
    snapshot: str = ""
    source: str = ""  # CreateVolume's content source: a snapshot or a volume to clone
    token: str = ""  # a listing's starting token


def unpack(err: grpc.RpcError, about: CallContext) -> CSIError:
    """The operator's sentence for a failed call: a known (call, code) pair's own words, else
    one naming the plugin and the call; the plugin's raw answer follows."""
    failed = rpc_call_of(err)
    code = failed.code() if failed is not None else grpc.StatusCode.UNKNOWN
    detail = clean_detail(failed.details() if failed is not None else str(err))
    raw = f"rpc error: code = {_camel(code)} desc = {detail}"
    template = _MESSAGES.get((about.call, code))
    if template is not None:
        head = template.format(
            v=about.volume,
            n=about.node,
            p=about.path,
            s=about.snapshot,
            src=about.source,
            t=about.token,
            plugin=about.plugin,
        )
    elif code == grpc.StatusCode.INTERNAL:
        role = "controller" if about.call in _CONTROLLER_CALLS else "node"
        head = f"{role} plugin returned an internal error, check the plugin allocation logs for more information"
    elif code == grpc.StatusCode.UNAVAILABLE:
        head = f"CSI plugin {about.plugin!r} is not answering {about.call}; check that the plugin is running"
    else:
        subject = f' for volume "{about.volume}"' if about.volume else ""
        if not subject and about.snapshot:
            subject = f' for snapshot "{about.snapshot}"'
        head = f"CSI plugin {about.plugin!r} failed {about.call}{subject}"
    return CSIError(
        f"{head}: {raw}",
        code=code.name,
        call=about.call,
        volume=about.volume,
        plugin_message=detail,
        ignorable=(about.call, code) in _IGNORABLE,
    )
