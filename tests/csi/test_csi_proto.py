"""csi.proto against every message row of the reference's wire tables (csi.md §1.4-§1.8)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor

from driversdk.pb import csi_pb2

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "csi.md"
POOL = descriptor_pool.Default()
FIELD = re.compile(r"`(\w+) #(\d+) (repeated |map)?\s*([\w.<>,]+)?")


def test_services_and_enums() -> None:
    d = csi_pb2.DESCRIPTOR
    assert d.package == "csi.v1"
    assert [m.name for m in d.services_by_name["Identity"].methods] == [
        "GetPluginInfo",
        "GetPluginCapabilities",
        "Probe",
    ]
    node = [m.name for m in d.services_by_name["Node"].methods]
    assert node == [
        "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume",
        "NodeGetVolumeStats", "NodeExpandVolume", "NodeGetCapabilities", "NodeGetInfo",
    ]  # fmt: skip
    assert d.services_by_name["SnapshotMetadata"].methods_by_name["GetMetadataDelta"].server_streaming
    mode = csi_pb2.VolumeCapability.AccessMode
    assert (mode.SINGLE_NODE_WRITER, mode.SINGLE_NODE_READER_ONLY, mode.MULTI_NODE_MULTI_WRITER) == (1, 2, 5)
    assert mode.SINGLE_NODE_MULTI_WRITER == 7
    assert csi_pb2.ControllerServiceCapability.RPC.GET_SNAPSHOT == 15
    assert csi_pb2.NodeServiceCapability.RPC.VOLUME_MOUNT_GROUP == 6
    assert csi_pb2.PluginCapability.Service.SNAPSHOT_METADATA_SERVICE == 4
    secret = csi_pb2.NodeStageVolumeRequest.DESCRIPTOR.fields_by_name["secrets"]
    assert secret.GetOptions().Extensions[csi_pb2.csi_secret]
    assert csi_pb2.csi_secret.number == 1059 and csi_pb2.alpha_field.number == 1060
    assert csi_pb2.ProbeResponse.DESCRIPTOR.fields_by_name["ready"].message_type.full_name == (
        "google.protobuf.BoolValue"
    )


def _all_messages() -> list[Descriptor]:
    out: list[Descriptor] = []

    def walk(desc: Descriptor) -> None:
        out.append(desc)
        for nested in desc.nested_types:
            walk(nested)

    for desc in csi_pb2.DESCRIPTOR.message_types_by_name.values():
        walk(desc)
    return out


@pytest.mark.skipif(not REFERENCE.exists(), reason="the shared reference is not beside this checkout")
def test_every_field_of_the_reference_is_on_our_wire() -> None:
    text = REFERENCE.read_text()
    section = text[text.index("### 1.4") : text.index("### 1.8")]
    messages = _all_messages()
    checked, problems = 0, []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or "#" not in cells[1]:
            continue
        names = re.findall(r"([A-Z][\w]*(?:\.[A-Z][\w]*)*)", cells[0].split("(")[0])
        # A row names one message (or a few, or "…Response.Confirmed"); its cell may also
        # describe nested messages: a field passes when any of them, or their children, has it.
        dot = "" if "…" in cells[0] else "."  # "…Response.Confirmed" abbreviates a longer name
        candidates = [m for m in messages for n in names if m.full_name.endswith(dot + n)]
        candidates += [n for m in candidates for n in m.nested_types]
        if not candidates:
            problems.append(f"no message for row {cells[0]!r}")
            continue
        for m in FIELD.finditer(cells[1]):
            fname, number, rep = m.group(1), int(m.group(2)), m.group(3)
            checked += 1
            fields = [c.fields_by_number.get(number) for c in candidates]
            matching = [f for f in fields if f is not None and f.name == fname]
            if not matching:
                problems.append(f"{cells[0]}: no field {fname} = {number}")
            elif rep and not any(f.is_repeated for f in matching):
                problems.append(f"{cells[0]}: {fname} should be repeated")
    assert checked > 150, "the reference table parser found too few fields"
    assert not problems, "\n".join(problems)
