"""The hclspec schema tree and its builders, mirroring hcl_spec.proto's ten kinds.

A driver describes its plugin ``config {}`` and task ``config {}`` blocks with these; the SDK
sends them to the host as protobuf and uses them to encode (host side) and decode (plugin
side) the msgpack config values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driversdk.hclspec.literal import evaluate_literal
from driversdk.hclspec.types import HclType, parse_type
from driversdk.pb import hcl_spec_pb2


class SpecError(ValueError):
    """A schema that can never work (a driver author's mistake, caught at construction)."""


class Spec:
    """Base of every schema node."""

    def to_proto(self) -> hcl_spec_pb2.Spec:
        raise NotImplementedError

    @staticmethod
    def from_proto(pb: hcl_spec_pb2.Spec) -> Spec:
        return _from_proto(pb)


@dataclass(frozen=True)
class Attr(Spec):
    type: str
    required: bool = False
    name: str = ""
    parsed: HclType = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "parsed", parse_type(self.type))
        except ValueError as err:
            raise SpecError(str(err)) from None

    def to_proto(self) -> hcl_spec_pb2.Spec:
        return hcl_spec_pb2.Spec(Attr=hcl_spec_pb2.Attr(name=self.name, type=self.type, required=self.required))


@dataclass(frozen=True)
class Block(Spec):
    nested: Spec
    required: bool = False
    name: str = ""

    def to_proto(self) -> hcl_spec_pb2.Spec:
        return hcl_spec_pb2.Spec(
            block_value=hcl_spec_pb2.Block(name=self.name, required=self.required, nested=self.nested.to_proto())
        )


@dataclass(frozen=True)
class BlockAttrs(Spec):
    type: str
    required: bool = False
    name: str = ""
    parsed: HclType = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "parsed", parse_type(self.type))
        except ValueError as err:
            raise SpecError(str(err)) from None

    def to_proto(self) -> hcl_spec_pb2.Spec:
        return hcl_spec_pb2.Spec(
            block_attrs=hcl_spec_pb2.BlockAttrs(name=self.name, type=self.type, required=self.required)
        )


@dataclass(frozen=True)
class BlockList(Spec):
    nested: Spec
    min_items: int = 0
    max_items: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        if self.max_items and self.min_items > self.max_items:
            raise SpecError(f"block list {self.name!r}: min_items {self.min_items} exceeds max_items {self.max_items}")

    def to_proto(self) -> hcl_spec_pb2.Spec:
        return hcl_spec_pb2.Spec(
            block_list=hcl_spec_pb2.BlockList(
                name=self.name,
                min_items=self.min_items,
                max_items=self.max_items,
                nested=self.nested.to_proto(),
            )
        )


@dataclass(frozen=True)
class BlockSet(Spec):
    nested: Spec
    min_items: int = 0
    max_items: int = 0
    name: str = ""

    def to_proto(self) -> hcl_spec_pb2.Spec:
        return hcl_spec_pb2.Spec(
            block_set=hcl_spec_pb2.BlockSet(
                name=self.name,
                min_items=self.min_items,
                max_items=self.max_items,
                nested=self.nested.to_proto(),
            )
        )


@dataclass(frozen=True)
class BlockMap(Spec):
    nested: Spec
    labels: tuple[str, ...]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.labels:
            raise SpecError(f"block map {self.name!r} needs at least one label name")

    def to_proto(self) -> hcl_spec_pb2.Spec:
        return hcl_spec_pb2.Spec(
            block_map=hcl_spec_pb2.BlockMap(name=self.name, labels=list(self.labels), nested=self.nested.to_proto())
        )


@dataclass(frozen=True)
class Literal(Spec):
    value: str
    evaluated: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "evaluated", evaluate_literal(self.value))
        except ValueError as err:
            raise SpecError(str(err)) from None

    def to_proto(self) -> hcl_spec_pb2.Spec:
        return hcl_spec_pb2.Spec(literal=hcl_spec_pb2.Literal(value=self.value))


@dataclass(frozen=True)
class Default(Spec):
    primary: Spec
    default: Spec

    def to_proto(self) -> hcl_spec_pb2.Spec:
        return hcl_spec_pb2.Spec(
            default=hcl_spec_pb2.Default(primary=self.primary.to_proto(), default=self.default.to_proto())
        )


@dataclass(frozen=True)
class Object(Spec):
    attributes: Mapping[str, Spec]

    def to_proto(self) -> hcl_spec_pb2.Spec:
        out = hcl_spec_pb2.Object()
        for key, child in self.attributes.items():
            out.attributes[key].CopyFrom(_with_implied_name(child, key).to_proto())
        return hcl_spec_pb2.Spec(object=out)


@dataclass(frozen=True)
class Array(Spec):
    values: tuple[Spec, ...]

    def to_proto(self) -> hcl_spec_pb2.Spec:
        return hcl_spec_pb2.Spec(array=hcl_spec_pb2.Array(values=[v.to_proto() for v in self.values]))


_NAMED = (Attr, Block, BlockAttrs, BlockList, BlockSet, BlockMap)


def _with_implied_name(child: Spec, key: str) -> Spec:
    """Nomad only implies a name for an Object's direct child; a Default's primary gets none.

    To spare authors that gotcha we write the key as an explicit name under a Default.
    """
    if isinstance(child, Default) and isinstance(child.primary, _NAMED) and not child.primary.name:
        return Default(_rename(child.primary, key), child.default)
    return child


def _rename(spec: Spec, name: str) -> Spec:
    from dataclasses import replace

    return replace(spec, name=name)  # type: ignore[type-var]


def input_name(spec: Spec, key: str) -> str | None:
    """The HCL name a spec reads under Object key ``key``; None for literals."""
    if isinstance(spec, _NAMED):
        return spec.name or key
    if isinstance(spec, Default):
        return input_name(spec.primary, key)
    return None


# --- builders ---------------------------------------------------------------------------------


def attr(type: str, required: bool = False, name: str = "") -> Attr:
    return Attr(type, required, name)


def block(nested: Spec, required: bool = False, name: str = "") -> Block:
    return Block(nested, required, name)


def block_attrs(type: str, required: bool = False, name: str = "") -> BlockAttrs:
    return BlockAttrs(type, required, name)


def block_list(nested: Spec, min_items: int = 0, max_items: int = 0, name: str = "") -> BlockList:
    return BlockList(nested, min_items, max_items, name)


def block_set(nested: Spec, min_items: int = 0, max_items: int = 0, name: str = "") -> BlockSet:
    return BlockSet(nested, min_items, max_items, name)


def block_map(nested: Spec, labels: Sequence[str], name: str = "") -> BlockMap:
    return BlockMap(nested, tuple(labels), name)


def default(primary: Spec, default: Spec) -> Default:
    return Default(primary, default)


def literal(expr: str) -> Literal:
    return Literal(expr)


def array(values: Sequence[Spec]) -> Array:
    return Array(tuple(values))


def obj(attributes: Mapping[str, Spec]) -> Object:
    return Object(dict(attributes))


# --- from protobuf ----------------------------------------------------------------------------


def _from_proto(pb: hcl_spec_pb2.Spec) -> Spec:
    kind = pb.WhichOneof("block")
    if kind == "object":
        return Object({k: _from_proto(v) for k, v in pb.object.attributes.items()})
    if kind == "array":
        return Array(tuple(_from_proto(v) for v in pb.array.values))
    if kind == "Attr":
        return Attr(pb.Attr.type, pb.Attr.required, pb.Attr.name)
    if kind == "block_value":
        return Block(_from_proto(pb.block_value.nested), pb.block_value.required, pb.block_value.name)
    if kind == "block_attrs":
        return BlockAttrs(pb.block_attrs.type, pb.block_attrs.required, pb.block_attrs.name)
    if kind == "block_list":
        b = pb.block_list
        return BlockList(_from_proto(b.nested), b.min_items, b.max_items, b.name)
    if kind == "block_set":
        s = pb.block_set
        return BlockSet(_from_proto(s.nested), s.min_items, s.max_items, s.name)
    if kind == "block_map":
        return BlockMap(_from_proto(pb.block_map.nested), tuple(pb.block_map.labels), pb.block_map.name)
    if kind == "default":
        return Default(_from_proto(pb.default.primary), _from_proto(pb.default.default))
    if kind == "literal":
        return Literal(pb.literal.value)
    raise SpecError("an hclspec Spec with no member set is invalid")
