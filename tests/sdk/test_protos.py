"""Our .proto files against the wire facts of the reference, and generated code freshness."""

from __future__ import annotations

import filecmp
import re
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from driversdk.pb import (  # noqa: F401 - imported to register every file in the pool
    attribute_pb2,
    base_pb2,
    driver_pb2,
    grpc_broker_pb2,
    grpc_controller_pb2,
    grpc_stdio_pb2,
    hcl_spec_pb2,
    recoverable_error_pb2,
    stats_pb2,
)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT.parent / "shared" / "reference" / "driver-protocol.md"
POOL = descriptor_pool.Default()

SECTION_PACKAGES = {
    "3.1": "plugin",
    "3.2": "hashicorp.nomad.plugins.base.proto",
    "3.3": "hashicorp.nomad.plugins.drivers.proto",
    "3.4": "hashicorp.nomad.plugins.shared.hclspec",
    "3.5": "hashicorp.nomad.plugins.shared.structs",
}
SCALARS = {
    "string": FieldDescriptor.TYPE_STRING,
    "bytes": FieldDescriptor.TYPE_BYTES,
    "bool": FieldDescriptor.TYPE_BOOL,
    "int32": FieldDescriptor.TYPE_INT32,
    "int64": FieldDescriptor.TYPE_INT64,
    "uint32": FieldDescriptor.TYPE_UINT32,
    "uint64": FieldDescriptor.TYPE_UINT64,
    "double": FieldDescriptor.TYPE_DOUBLE,
}


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "hack" / "gen-protos.sh"), str(tmp_path)], check=True, capture_output=True)
    fresh = tmp_path / "driversdk" / "pb"
    committed = ROOT / "driversdk" / "pb"
    names = sorted(p.name for p in fresh.iterdir() if p.suffix in (".py", ".pyi") and p.name != "__init__.py")
    assert names, "hack/gen-protos.sh generated nothing"
    _match, mismatch, errors = filecmp.cmpfiles(fresh, committed, names, shallow=False)
    assert not mismatch and not errors, (
        f"generated protobuf code is stale ({mismatch + errors}); run hack/gen-protos.sh and commit the result"
    )
    extra = sorted(
        p.name for p in committed.iterdir() if p.suffix in (".py", ".pyi") and p.name not in [*names, "__init__.py"]
    )
    assert not extra, f"driversdk/pb has generated files with no .proto source: {extra}"


def _reference_rows() -> list[tuple[str, str, int, str, str]]:
    rows = []
    section = ""
    for line in REFERENCE.read_text().splitlines():
        m = re.match(r"^### (3\.\d)", line)
        if m:
            section = m.group(1)
            continue
        if line.startswith("## 4"):
            break
        if section not in SECTION_PACKAGES or not line.startswith("| "):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 4 or not re.fullmatch(r"[A-Z][A-Za-z.]*", cells[0]):
            continue
        num = re.search(r"(\d+)$", cells[1])
        if num is None or ".." in cells[1]:
            continue
        rows.append((section, cells[0], int(num.group(1)), cells[2], cells[3]))
    return rows


@pytest.mark.skipif(not REFERENCE.exists(), reason="the shared reference is not beside this checkout")
def test_every_field_of_the_reference_is_on_our_wire() -> None:
    rows = _reference_rows()
    assert len(rows) > 200, "the reference table parser found too few rows"
    problems = []
    for section, message, number, name, typ in rows:
        full = f"{SECTION_PACKAGES[section]}.{message}"
        try:
            desc: Descriptor = POOL.FindMessageTypeByName(full)
        except KeyError:
            problems.append(f"message {full} is missing")
            continue
        field = desc.fields_by_number.get(number)
        if name.startswith("*reserved*"):
            from google.protobuf import descriptor_pb2

            proto = descriptor_pb2.DescriptorProto()
            desc.CopyToProto(proto)
            if field is not None or not any(r.start <= number < r.end for r in proto.reserved_range):
                problems.append(f"{full} must reserve field {number}")
            continue
        if field is None:
            problems.append(f"{full} has no field {number} ({name})")
            continue
        if field.name != name:
            problems.append(f"{full} field {number} is {field.name!r}, reference says {name!r}")
        base = typ.removeprefix("rep ").split(" ")[0].strip("`")
        repeated = typ.startswith("rep ") or typ.startswith("map<")
        if repeated != field.is_repeated:
            problems.append(f"{full}.{name}: repeated is {field.is_repeated}, reference says {typ!r}")
        if base in SCALARS and field.type != SCALARS[base]:
            problems.append(f"{full}.{name}: wire type {field.type} but reference says {base}")
    assert not problems, "\n".join(problems)


def test_services_and_methods() -> None:
    expected = {
        "hashicorp.nomad.plugins.drivers.proto.Driver": {
            "TaskConfigSchema": (False, False),
            "Capabilities": (False, False),
            "Fingerprint": (False, True),
            "RecoverTask": (False, False),
            "StartTask": (False, False),
            "WaitTask": (False, False),
            "StopTask": (False, False),
            "DestroyTask": (False, False),
            "InspectTask": (False, False),
            "TaskStats": (False, True),
            "TaskEvents": (False, True),
            "SignalTask": (False, False),
            "ExecTask": (False, False),
            "ExecTaskStreaming": (True, True),
            "CreateNetwork": (False, False),
            "DestroyNetwork": (False, False),
            "Init": (False, False),
            "Shutdown": (False, False),
        },
        "hashicorp.nomad.plugins.base.proto.BasePlugin": {
            "PluginInfo": (False, False),
            "ConfigSchema": (False, False),
            "SetConfig": (False, False),
        },
        "plugin.GRPCController": {"Shutdown": (False, False)},
        "plugin.GRPCStdio": {"StreamStdio": (False, True)},
        "plugin.GRPCBroker": {"StartStream": (True, True)},
    }
    for service, methods in expected.items():
        desc = POOL.FindServiceByName(service)
        got = {m.name: (m.client_streaming, m.server_streaming) for m in desc.methods}
        assert got == methods, service


def test_enums_and_reserved_numbers() -> None:
    caps = driver_pb2.DriverCapabilities
    assert caps.UNKNOWN_MOUNTS == caps.ANY_MOUNTS == 0 and caps.NO_MOUNTS == 1
    assert caps.DESCRIPTOR.enum_types_by_name["MountConfigs"].GetOptions().allow_alias
    assert (caps.NONE, caps.CHROOT, caps.IMAGE, caps.UNVEIL) == (0, 1, 2, 3)
    assert 7 not in caps.DESCRIPTOR.fields_by_number
    assert caps.DESCRIPTOR.fields_by_name["disable_log_collection"].number == 8
    assert 7 not in driver_pb2.LinuxResources.DESCRIPTOR.fields_by_number
    assert (base_pb2.UNKNOWN, base_pb2.DRIVER, base_pb2.DEVICE) == (0, 2, 3)
    ns = driver_pb2.NetworkIsolationSpec
    assert (ns.HOST, ns.GROUP, ns.TASK, ns.NONE) == (0, 1, 2, 3)
    assert (driver_pb2.UNKNOWN, driver_pb2.RUNNING, driver_pb2.EXITED) == (0, 1, 2)
    fp = driver_pb2.FingerprintResponse
    assert (fp.UNDETECTED, fp.UNHEALTHY, fp.HEALTHY) == (0, 1, 2)
    st = driver_pb2.StartTaskResponse
    assert (st.SUCCESS, st.RETRY, st.FATAL) == (0, 1, 2)
    assert driver_pb2.MemoryUsage.DESCRIPTOR.fields_by_name["measured_fields"].number == 6
    assert driver_pb2.MemoryUsage.SWAP == 6 and driver_pb2.CPUUsage.PERCENT == 5
    assert grpc_stdio_pb2.StdioData.STDERR == 2
    spec_oneof = hcl_spec_pb2.Spec.DESCRIPTOR.oneofs_by_name["block"]
    assert [f.number for f in spec_oneof.fields] == list(range(1, 11))
    assert hcl_spec_pb2.Spec.DESCRIPTOR.fields_by_number[3].name == "Attr"
    attr_oneof = attribute_pb2.Attribute.DESCRIPTOR.oneofs_by_name["value"]
    assert [f.name for f in attr_oneof.fields] == ["float_val", "int_val", "string_val", "bool_val"]
    assert recoverable_error_pb2.RecoverableError.DESCRIPTOR.full_name == (
        "hashicorp.nomad.plugins.shared.structs.RecoverableError"
    )
    driver_cfg = base_pb2.NomadDriverConfig.DESCRIPTOR.fields_by_number
    assert (driver_cfg[1].name, driver_cfg[2].name) == ("ClientMaxPort", "ClientMinPort")
    assert driver_pb2.NetworkIsolationSpec.DESCRIPTOR.fields_by_number[4].name == "hostsConfig"
    assert driver_pb2.LinuxResources.DESCRIPTOR.fields_by_number[8].name == "PercentTicks"
