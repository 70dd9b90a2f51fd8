"""hclspec: builders, the proto form, type expressions, literals, and the msgpack codec."""

from __future__ import annotations

import msgpack
import pytest
from hcl2.api import loads
from hcl2.utils import SerializationOptions
from hypothesis import given
from hypothesis import strategies as st

from driversdk import hclspec as hs
from driversdk.errors import ConfigError

DOCKERISH = hs.obj(
    {
        "image": hs.attr("string", required=True),
        "args": hs.attr("list(string)"),
        "labels": hs.attr("map(string)"),
        "cpu": hs.attr("number"),
        "privileged": hs.default(hs.attr("bool"), hs.literal("false")),
        "pull_timeout": hs.default(hs.attr("string"), hs.literal('"5m"')),
        "mounts": hs.block_list(
            hs.obj(
                {
                    "type": hs.default(hs.attr("string"), hs.literal('"bind"')),
                    "target": hs.attr("string", required=True),
                    "readonly": hs.default(hs.attr("bool"), hs.literal("false")),
                }
            )
        ),
        "volumes": hs.block(hs.obj({"enabled": hs.default(hs.attr("bool"), hs.literal("true"))})),
        "auth": hs.block_attrs("string"),
        "port": hs.block_map(hs.obj({"to": hs.attr("number")}), labels=["name"]),
        "pair": hs.array([hs.attr("string", name="first"), hs.attr("number", name="second")]),
    }
)


def parse_hcl(text: str) -> dict[str, object]:
    return loads(text, serialization_options=SerializationOptions(strip_string_quotes=True, with_comments=False))


def test_type_expressions() -> None:
    assert str(hs.parse_type("list(string)")) == "list(string)"
    assert str(hs.parse_type("object({a=string, b=list(number)})")) == "object({a=string, b=list(number)})"
    assert str(hs.parse_type(" tuple([string, bool]) ")) == "tuple([string, bool])"
    with pytest.raises(hs.TypeExprError, match="unknown type 'strng'"):
        hs.parse_type("strng")
    with pytest.raises(hs.TypeExprError):
        hs.parse_type("list(string")
    with pytest.raises(hs.SpecError):
        hs.attr("map(")


def test_literals_are_hcl_expressions() -> None:
    assert hs.evaluate_literal('"5s"') == "5s"
    assert hs.evaluate_literal("true") is True
    assert hs.evaluate_literal("5") == 5
    assert hs.evaluate_literal("[]") == []
    assert hs.evaluate_literal('{a = 1, "b": ["x"]}') == {"a": 1, "b": ["x"]}
    with pytest.raises(hs.SpecError, match="strings need quotes"):
        hs.literal("bind")
    with pytest.raises(hs.SpecError, match="calls function upper"):
        hs.literal('upper("x")')


def test_block_map_needs_a_label() -> None:
    with pytest.raises(hs.SpecError, match="needs at least one label"):
        hs.block_map(hs.obj({}), labels=[])


def test_proto_round_trip_and_default_gets_explicit_name() -> None:
    pb = DOCKERISH.to_proto()
    assert pb.WhichOneof("block") == "object"
    privileged = pb.object.attributes["privileged"]
    # driver-protocol gotcha 16: an Attr under Default gets no implied name, so we write it.
    assert privileged.default.primary.Attr.name == "privileged"
    assert privileged.default.default.literal.value == "false"
    assert pb.object.attributes["image"].Attr.name == ""  # implied by the Object key
    assert pb.object.attributes["image"].Attr.required is True
    assert list(pb.object.attributes["port"].block_map.labels) == ["name"]
    again = hs.Spec.from_proto(pb)
    assert again.to_proto() == pb


def test_encode_follows_ctys_msgpack_rules() -> None:
    spec = hs.obj({"f": hs.attr("number"), "g": hs.attr("number"), "i": hs.attr("number"), "s": hs.attr("string")})
    data = hs.encode(spec, {"i": 5, "g": 1.5, "f": 0.1}, what="cfg")
    # keys sorted; 0.1 as its decimal text; 1.5 as float64 (0xcb); 5 as a positive fixint; absent -> nil
    assert data == b"\x84\xa1f\xa30.1\xa1g\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00\xa1i\x05\xa1s\xc0"


def test_encode_hcl_body_applies_defaults_and_blocks() -> None:
    body = parse_hcl(
        """
        image = "busybox"
        args = ["-c", "echo hi"]
        cpu = 0.5
        mounts { target = "/a" }
        mounts {
          type = "tmpfs"
          target = "/b"
        }
        auth { username = "u" }
        port "http" { to = 80 }
        """
    )
    value = msgpack.unpackb(hs.encode(DOCKERISH, body, what="task config"), raw=False)
    assert value["image"] == "busybox"
    assert value["privileged"] is False and value["pull_timeout"] == "5m"
    assert value["mounts"] == [
        {"readonly": False, "target": "/a", "type": "bind"},
        {"readonly": False, "target": "/b", "type": "tmpfs"},
    ]
    assert value["volumes"] is None  # an absent block is nil
    assert value["auth"] == {"username": "u"}
    assert value["port"] == {"http": {"to": 80}}
    assert value["labels"] is None


def test_encode_reports_every_problem_with_its_path() -> None:
    body = parse_hcl(
        """
        imagee = "x"
        cpu = "lots"
        mounts { type = "bind" }
        """
    )
    with pytest.raises(ConfigError) as info:
        hs.encode(DOCKERISH, body, what="task 'web' config")
    text = str(info.value)
    assert "task 'web' config: imagee is not a known field; remove it or check its spelling" in text
    assert "task 'web' config: image is required (string); set it" in text
    assert "task 'web' config: cpu is a string, expected number" in text
    assert "task 'web' config: mounts[0].target is required (string)" in text


def test_decode_applies_defaults_and_names_bad_fields() -> None:
    good = hs.decode(DOCKERISH, msgpack.packb({"image": "busybox", "privileged": None}), what="task config")
    assert good["privileged"] is False and good["mounts"] == [] and good["port"] == {}
    data = msgpack.packb({"image": 5, "mounts": [{"target": "/x", "readonly": "yes"}], "bogus": 1})
    with pytest.raises(ConfigError) as info:
        hs.decode(DOCKERISH, data, what="task config")
    text = str(info.value)
    assert "task config: bogus is not a known field" in text
    assert "task config: mounts[0].readonly is a string, expected bool" in text
    # numbers are acceptable as strings in HCL, so image=5 becomes "5" rather than an error
    assert "image" not in text


def test_decode_empty_bytes_means_all_absent() -> None:
    spec = hs.obj({"greeting": hs.default(hs.attr("string"), hs.literal('"hello"')), "n": hs.attr("number")})
    assert hs.decode(spec, b"", what="plugin config") == {"greeting": "hello", "n": None}
    with pytest.raises(ConfigError, match="is not valid msgpack"):
        hs.decode(spec, b"\xc1", what="plugin config")


def test_decode_decimal_text_and_hcl1_list_of_maps() -> None:
    spec = hs.obj({"cpu": hs.attr("number"), "labels": hs.attr("map(string)")})
    out = hs.decode(spec, msgpack.packb({"cpu": "0.1", "labels": [{"a": "b"}, {"c": "d"}]}), what="cfg")
    assert out == {"cpu": 0.1, "labels": {"a": "b", "c": "d"}}


def test_decode_tolerates_cty_dynamic_wrapper() -> None:
    spec = hs.obj({"anything": hs.attr("any")})
    wrapped = msgpack.packb({"anything": [b'"string"', "value"]}, use_bin_type=True)
    assert hs.decode(spec, wrapped, what="cfg") == {"anything": "value"}


_values = st.fixed_dictionaries(
    {"image": st.text(min_size=1, max_size=20)},
    optional={
        "args": st.lists(st.text(max_size=10), max_size=4),
        "labels": st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
        "cpu": st.integers(min_value=-(2**40), max_value=2**40) | st.floats(allow_nan=False, allow_infinity=False),
        "privileged": st.booleans(),
        "mounts": st.lists(st.fixed_dictionaries({"target": st.text(min_size=1, max_size=10)}), max_size=3),
    },
)


@given(_values)
def test_encode_then_decode_round_trips(value: dict[str, object]) -> None:
    decoded = hs.decode(DOCKERISH, hs.encode(DOCKERISH, value, what="cfg"), what="cfg")
    for key, expected in value.items():
        got = decoded[key]
        if key == "mounts":
            assert [m["target"] for m in got] == [m["target"] for m in expected]  # type: ignore[attr-defined]
        elif isinstance(expected, float):
            assert got == pytest.approx(expected, rel=1e-15)
        else:
            assert got == expected
