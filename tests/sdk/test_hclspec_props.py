"""hclspec property test: generated specs, generated values, encode then decode gives them back."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from driversdk import hclspec as hs

_names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
_strings = st.text(max_size=8)
_numbers = st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)


def _type_and_values(depth: int) -> st.SearchStrategy[tuple[str, st.SearchStrategy[Any]]]:
    leaves = st.sampled_from(
        [("string", _strings), ("number", _numbers), ("bool", st.booleans())],
    )
    if depth == 0:
        return leaves

    def wrap(inner: tuple[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[tuple[str, st.SearchStrategy[Any]]]:
        typ, values = inner
        return st.sampled_from(
            [
                (f"list({typ})", st.lists(values, max_size=3)),
                (f"map({typ})", st.dictionaries(_names, values, max_size=3)),
            ]
        )

    return leaves | _type_and_values(depth - 1).flatmap(wrap)


@st.composite
def _spec_and_value(draw: st.DrawFn) -> tuple[hs.Object, dict[str, Any]]:
    keys = draw(st.lists(_names, min_size=1, max_size=5, unique=True))
    fields: dict[str, hs.Spec] = {}
    value: dict[str, Any] = {}
    for key in keys:
        typ, values = draw(_type_and_values(2))
        kind = draw(st.sampled_from(["attr", "block_attrs_leaf", "block_list"]))
        if kind == "attr" or ("(" in typ and kind == "block_attrs_leaf"):
            fields[key] = hs.attr(typ)
            if draw(st.booleans()):
                value[key] = draw(values)
        elif kind == "block_attrs_leaf":
            fields[key] = hs.block_attrs(typ)
            if draw(st.booleans()):
                value[key] = draw(st.dictionaries(_names, values, min_size=1, max_size=3))
        else:
            fields[key] = hs.block_list(hs.obj({"v": hs.attr(typ, required=True)}))
            value[key] = draw(st.lists(st.fixed_dictionaries({"v": values}), max_size=3))
    return hs.obj(fields), value


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_same, got, want))
    if isinstance(want, float):
        # A float stands for its shortest decimal text (what HCL would have parsed): that text may be
        # an integer (5.566175921177237e16 -> 55661759211772370, an int64) or not an exact float64
        # (0.1 travels as "0.1"); either way it reads back as the same float.
        return type(got) in (int, float) and float(got) == want
    return bool(got == want) and type(got) is type(want)


@settings(max_examples=150, deadline=None)
@given(_spec_and_value())
def test_generated_specs_round_trip(case: tuple[hs.Object, dict[str, Any]]) -> None:
    spec, value = case
    decoded = hs.decode(spec, hs.encode(spec, value, what="cfg"), what="cfg")
    for key, child in spec.attributes.items():
        if key in value:
            assert _same(decoded[key], value[key]), (key, decoded[key], value[key])
        elif isinstance(child, hs.BlockList):
            assert decoded[key] == []
        else:
            assert decoded[key] is None
    # the spec itself survives the proto
    assert hs.Spec.from_proto(spec.to_proto()) == spec
