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
    assert "task 'web' config: imagee is not a known field; did you mean \"image\"?" in text
    assert "task 'web' config: image is required (string); set it" in text
    assert "task 'web' config: cpu is a string, expected a number" in text
    assert "task 'web' config: mounts[0].target is required (string)" in text


def test_decode_applies_defaults_and_names_bad_fields() -> None:
    good = hs.decode(DOCKERISH, msgpack.packb({"image": "busybox", "privileged": None}), what="task config")
    assert good["privileged"] is False and good["mounts"] == [] and good["port"] == {}
    data = msgpack.packb({"image": 5, "mounts": [{"target": "/x", "readonly": "yes"}], "bogus": 1})
    with pytest.raises(ConfigError) as info:
        hs.decode(DOCKERISH, data, what="task config")
    text = str(info.value)
    assert "task config: bogus is not a known field" in text
    assert "task config: mounts[0].readonly is a string, expected a bool" in text
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


def test_builders_take_none_for_implied_names_and_check_item_limits() -> None:
    assert hs.attr("string", name=None).name == ""
    assert hs.block_list(hs.obj({}), name=None).to_proto().block_list.name == ""
    with pytest.raises(hs.SpecError, match="min_items 3 exceeds max_items 1"):
        hs.block_set(hs.obj({}), min_items=3, max_items=1)
    with pytest.raises(hs.SpecError, match="cannot be negative"):
        hs.block_list(hs.obj({}), min_items=-1)


def test_stacked_defaults_under_an_object_key_get_the_key_as_name() -> None:
    spec = hs.obj({"mode": hs.default(hs.default(hs.attr("string"), hs.literal("null")), hs.literal('"x"'))})
    pb = spec.to_proto().object.attributes["mode"]
    assert pb.default.primary.default.primary.Attr.name == "mode"
    # an explicit name is never overwritten
    named = hs.obj({"k": hs.default(hs.attr("string", name="other"), hs.literal('"x"'))}).to_proto()
    assert named.object.attributes["k"].default.primary.Attr.name == "other"
    assert hs.encode(spec, {}, what="cfg") == msgpack.packb({"mode": "x"})


def test_array_elements_need_their_own_names() -> None:
    with pytest.raises(hs.SpecError) as info:
        hs.obj({"pair": hs.array([hs.attr("string", name="a"), hs.default(hs.attr("number"), hs.literal("1"))])})
    assert str(info.value) == (
        "array under key 'pair': element 1 (Attr) has no name, and Nomad implies none inside an array; give it name=..."
    )


def test_object_nested_in_object_reads_the_same_body() -> None:
    spec = hs.obj({"a": hs.attr("string"), "inner": hs.obj({"b": hs.attr("number")})})
    assert msgpack.unpackb(hs.encode(spec, {"a": "x", "b": "2"}, what="cfg")) == {"a": "x", "inner": {"b": 2}}
    with pytest.raises(ConfigError, match=r"^cfg: c is not a known field; remove it or check its spelling$"):
        hs.encode(spec, {"c": 1}, what="cfg")


@pytest.mark.parametrize(
    ("value", "packed"),
    [
        (5, b"\x05"),  # positive fixint
        (-1, b"\xff"),  # negative fixint
        (200, b"\xcc\xc8"),  # uint8
        (2**63 - 1, b"\xcf\x7f\xff\xff\xff\xff\xff\xff\xff"),  # largest int64 stays an int
        (2**64, b"\xcb\x43\xf0\x00\x00\x00\x00\x00\x00"),  # past int64 but an exact float64
        (2**64 + 1, b"\xb4" + b"18446744073709551617"),  # neither: its decimal text
        (2.0, b"\x02"),  # an integral number is an int whatever its Python type
        (1.5, b"\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"),  # float64, never float32
        (0.1, b"\xa30.1"),
        ("0.1", b"\xa30.1"),  # a numeric string converts, then follows the same rule
        (1e-7, b"\xa90.0000001"),  # decimal text is plain notation, like Go's Text('f', -1)
        (float("inf"), b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00"),
        (None, b"\xc0"),
    ],
)
def test_number_encoding_table(value: object, packed: bytes) -> None:
    spec = hs.obj({"n": hs.attr("number")})
    assert hs.encode(spec, {"n": value}, what="cfg") == b"\x81\xa1n" + packed


def test_absent_blocks_encode_as_nil_empty_array_and_empty_map() -> None:
    spec = hs.obj(
        {
            "b": hs.block(hs.obj({})),
            "ba": hs.block_attrs("string"),
            "bl": hs.block_list(hs.obj({})),
            "bm": hs.block_map(hs.obj({}), labels=["name"]),
            "bs": hs.block_set(hs.obj({})),
        }
    )
    assert hs.encode(spec, {}, what="cfg") == b"\x85\xa1b\xc0\xa2ba\xc0\xa2bl\x90\xa2bm\x80\xa2bs\x90"


def test_conversions_like_hcl() -> None:
    spec = hs.obj({"s": hs.attr("string"), "n": hs.attr("number"), "b": hs.attr("bool"), "l": hs.attr("list(string)")})
    value = msgpack.unpackb(hs.encode(spec, {"s": True, "n": "5", "b": "false", "l": [1, 2.5]}, what="cfg"))
    assert value == {"s": "true", "n": 5, "b": False, "l": ["1", "2.5"]}
    # As cty converts a string to a bool: "1" and "0" too, but not "TRUE" or "yes".
    assert msgpack.unpackb(hs.encode(spec, {"b": "1"}, what="cfg"))["b"] is True
    assert msgpack.unpackb(hs.encode(spec, {"b": "0"}, what="cfg"))["b"] is False
    with pytest.raises(ConfigError, match="b is a string, expected a bool"):
        hs.encode(spec, {"b": "TRUE"}, what="cfg")
    with pytest.raises(ConfigError) as info:
        hs.encode(spec, {"b": "yes", "n": [1], "l": "x"}, what="task 'web' config")
    text = str(info.value)
    assert "task 'web' config: b is a string, expected a bool" in text
    assert "task 'web' config: n is a list, expected a number" in text
    assert "task 'web' config: l is a string, expected a list(string)" in text


def test_block_rules_on_encode() -> None:
    spec = hs.obj(
        {
            "one": hs.block(hs.obj({"x": hs.attr("string")}), required=True),
            "few": hs.block_list(hs.obj({"x": hs.attr("string")}), min_items=1, max_items=2),
            "uniq": hs.block_set(hs.obj({"x": hs.attr("string")})),
        }
    )
    body = parse_hcl('uniq { x = "a" }\nuniq { x = "a" }\nuniq { x = "b" }\nfew { x = "1" }')
    out = msgpack.unpackb(hs.encode(spec, {**body, "one": [{"x": "y"}]}, what="cfg"))
    assert out["uniq"] == [{"x": "a"}, {"x": "b"}]  # a set drops duplicates
    with pytest.raises(ConfigError) as info:
        hs.encode(spec, parse_hcl("few { }\nfew { }\nfew { }\nfew { nope = 1 }"), what="cfg")
    text = str(info.value)
    assert "cfg: one block is required; add a one { … } block" in text
    assert "cfg: few allows at most 2 block(s), found 4" in text
    assert "cfg: few[3].nope is not a known field" in text


def test_block_map_with_two_labels_from_hcl() -> None:
    spec = hs.obj({"port": hs.block_map(hs.obj({"to": hs.attr("number")}), labels=["proto", "name"])})
    body = parse_hcl('port "tcp" "http" { to = 80 }\nport "tcp" "https" { to = "443" }\nport "udp" "dns" {}')
    data = hs.encode(spec, body, what="cfg")
    assert msgpack.unpackb(data) == {
        "port": {"tcp": {"http": {"to": 80}, "https": {"to": 443}}, "udp": {"dns": {"to": None}}}
    }
    assert hs.decode(spec, data, what="cfg") == msgpack.unpackb(data)


def test_real_hcl_snippet_encodes_then_decodes() -> None:
    body = parse_hcl(
        r"""
        image = "busybox"
        args = ["-c", "echo \"hi\"\n"]
        cpu = 1e-7
        labels = { app = "web", tier = 2 }
        mounts { target = "/a" }
        volumes { enabled = false }
        auth {
          username = "u"
          password = "p"
        }
        port "http" { to = 8080 }
        first = "one"
        second = 0.1
        """
    )
    config = hs.decode(DOCKERISH, hs.encode(DOCKERISH, body, what="task config"), what="task config")
    assert config == {
        "image": "busybox",
        "args": ["-c", 'echo "hi"\n'],
        "labels": {"app": "web", "tier": "2"},
        "cpu": 1e-7,
        "privileged": False,
        "pull_timeout": "5m",
        "mounts": [{"type": "bind", "target": "/a", "readonly": False}],
        "volumes": {"enabled": False},
        "auth": {"username": "u", "password": "p"},
        "port": {"http": {"to": 8080}},
        "pair": ["one", 0.1],
    }


def test_decode_error_sentences_name_the_path() -> None:
    spec = hs.obj({"mounts": hs.block_list(hs.obj({"propagation": hs.attr("string")}))})
    data = msgpack.packb({"mounts": [{"propagation": "private"}, {"propagation": [1]}], "extra": 1, "more": 2})
    with pytest.raises(ConfigError) as info:
        hs.decode(spec, data, what="task config")
    assert str(info.value) == (
        "task config: extra is not a known field; remove it or check its spelling; "
        "task config: more is not a known field; remove it or check its spelling; "
        "task config: mounts[1].propagation is a list, expected a string"
    )
    with pytest.raises(ConfigError, match=r"^cfg is a list, expected an object$"):
        hs.decode(spec, msgpack.packb([1, 2]), what="cfg")


def test_a_plain_value_where_a_block_belongs_is_refused_not_read_as_no_block() -> None:
    spec = hs.obj({"gc": hs.block(hs.obj({"image": hs.default(hs.attr("bool"), hs.literal("true"))}))})
    with pytest.raises(ConfigError, match=r"gc must be a block \(gc \{ … \}\), not the value False"):
        hs.encode(spec, {"gc": False}, what="plugin config")
