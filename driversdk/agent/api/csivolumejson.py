"""A CSI volume as Nomad's api.CSIVolume JSON and back: the body the CLI sends to
``PUT /v1/volume/csi/:id`` (and ``/create``) and what the agent turns into the
:class:`~driversdk.csi.model.Volume` its stores take. Both directions live here so they cannot
drift: ``volume_from_api(volume_to_api(v)) == v`` for every volume a volume file can describe.

The request carries the volume's secrets and mount flags (the agent needs them for the plugin);
no answer of the agent carries them (see ``driversdk.agent.api.csiroutes``).

Stdlib and the model only: the CLI imports this module to send a volume, and must not load the
state store with it.
"""

from __future__ import annotations

from typing import Any

from driversdk.agent.csi.volumes import FieldNames, capability_of, volume_problems
from driversdk.csi.model import (
    MountOptions,
    Secrets,
    TopologyRequest,
    Volume,
    VolumeCapability,
)
from driversdk.errors import ConfigError, DriverSDKError


class VolumeJSONError(DriverSDKError):
    """A CSIVolume body the agent cannot take (answered 400 with this sentence)."""


def _segments(topologies: list[dict[str, str]] | tuple[dict[str, str], ...]) -> list[dict[str, Any]]:
    return [{"Segments": dict(t)} for t in topologies]


def volume_to_api(volume: Volume) -> dict[str, Any]:
    """The volume as Nomad's api.CSIVolume, secrets and mount flags included (a request body)."""
    requested = volume.requested_topologies
    return {
        "ID": volume.id,
        "Namespace": volume.namespace,
        "Name": volume.name,
        "ExternalID": volume.external_id,
        "PluginID": volume.plugin_id,
        "RequestedCapabilities": [
            {"AccessMode": c.access_mode.value, "AttachmentMode": c.attachment_mode.value} for c in volume.capabilities
        ],
        "MountOptions": None
        if volume.mount_options is None
        else {"FSType": volume.mount_options.fs_type, "MountFlags": list(volume.mount_options.mount_flags)},
        "Secrets": dict(volume.secrets),
        "Parameters": dict(volume.parameters),
        "Context": dict(volume.context),
        "RequestedCapacityMin": volume.capacity_min,
        "RequestedCapacityMax": volume.capacity_max,
        "SnapshotID": volume.snapshot_id,
        "CloneID": volume.clone_id,
        "RequestedTopologies": None
        if not (requested.required or requested.preferred)
        else {"Required": _segments(requested.required), "Preferred": _segments(requested.preferred)},
        "Capacity": volume.capacity,
        "Topologies": _segments(volume.topologies),
    }


def _problem(problems: list[str], what: str, value: object, kind: str) -> None:
    problems.append(f"{what} must be {kind}, not {type(value).__name__}")


def _str(data: dict[str, Any], key: str, problems: list[str]) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        _problem(problems, key, value, "a string")
        return ""
    return value


def _int(data: dict[str, Any], key: str, problems: list[str]) -> int:
    value = data.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.append(f"{key} must be a number of bytes (0 or more), not {value!r}")
        return 0
    return value


def _str_map(data: dict[str, Any], key: str, problems: list[str]) -> dict[str, str]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        problems.append(f"{key} must be an object of strings")
        return {}
    return dict(value)


def _topologies(value: object, what: str, problems: list[str]) -> list[dict[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        _problem(problems, what, value, "a list of {Segments}")
        return []
    out = []
    for i, item in enumerate(value):
        segments = item.get("Segments") if isinstance(item, dict) else None
        if not isinstance(segments, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in segments.items()
        ):
            problems.append(f'{what}[{i}] must be {{"Segments": {{…strings}}}}')
            continue
        out.append(dict(segments))
    return out


def _capabilities(value: object, problems: list[str]) -> list[VolumeCapability]:
    if value is None:
        return []
    if not isinstance(value, list):
        _problem(problems, "RequestedCapabilities", value, "a list")
        return []
    caps = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            _problem(problems, f"RequestedCapabilities[{i}]", item, "an object")
            continue
        try:
            caps.append(capability_of(item.get("AccessMode", ""), item.get("AttachmentMode", "")))
        except ConfigError as err:
            problems.append(f"RequestedCapabilities[{i}]: {err}")
    return caps


def _mount_options(value: object, problems: list[str]) -> MountOptions | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        _problem(problems, "MountOptions", value, "an object")
        return None
    fs_type = value.get("FSType") or ""
    flags = value.get("MountFlags") or []
    if not isinstance(fs_type, str):
        _problem(problems, "MountOptions.FSType", fs_type, "a string")
        fs_type = ""
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        problems.append("MountOptions.MountFlags must be a list of strings")
        flags = []
    return MountOptions(fs_type, tuple(flags))


API_NAMES = FieldNames("ID", "PluginID", "Namespace", "SnapshotID", "CloneID", "RequestedCapacityMin",
                       "RequestedCapacityMax",
                       "at least one RequestedCapabilities entry {AccessMode, AttachmentMode} is required")  # fmt: skip


def volume_from_api(data: object) -> Volume:
    """A CSIVolume object of a request as the stores' Volume; VolumeJSONError names every field
    that is wrong (the same rules a volume file is held to: an id, a plugin id and a namespace
    that are safe directory names, at least one capability, sizes that fit)."""
    if not isinstance(data, dict):
        raise VolumeJSONError(f"a volume must be a CSIVolume object, not {type(data).__name__}")
    problems: list[str] = []
    requested = data.get("RequestedTopologies")
    if requested is not None and not isinstance(requested, dict):
        _problem(problems, "RequestedTopologies", requested, "an object")
        requested = None
    volume = Volume(
        id=_str(data, "ID", problems),
        plugin_id=_str(data, "PluginID", problems),
        namespace=_str(data, "Namespace", problems) or "default",
        name=_str(data, "Name", problems),
        external_id=_str(data, "ExternalID", problems),
        capabilities=_capabilities(data.get("RequestedCapabilities"), problems),
        mount_options=_mount_options(data.get("MountOptions"), problems),
        secrets=Secrets(_str_map(data, "Secrets", problems)),
        parameters=_str_map(data, "Parameters", problems),
        context=_str_map(data, "Context", problems),
        capacity_min=_int(data, "RequestedCapacityMin", problems),
        capacity_max=_int(data, "RequestedCapacityMax", problems),
        snapshot_id=_str(data, "SnapshotID", problems),
        clone_id=_str(data, "CloneID", problems),
        requested_topologies=TopologyRequest(
            tuple(_topologies((requested or {}).get("Required"), "RequestedTopologies.Required", problems)),
            tuple(_topologies((requested or {}).get("Preferred"), "RequestedTopologies.Preferred", problems)),
        ),
        capacity=_int(data, "Capacity", problems),
        topologies=_topologies(data.get("Topologies"), "Topologies", problems),
    )
    capability_refused = any(p.startswith("RequestedCapabilities") for p in problems)
    problems += volume_problems(volume, API_NAMES, capability_refused=capability_refused)
    if problems:
        shown = volume.id if volume.id else "(no ID)"
        raise VolumeJSONError(f'volume "{shown}": ' + "; ".join(problems) + "; fix the volume and send it again")
    return volume
