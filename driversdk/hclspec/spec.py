"""The hclspec schema tree and its builders, mirroring hcl_spec.proto's ten kinds.

A driver describes its plugin ``config {}`` and task ``config {}`` blocks with these; the SDK
sends them to the host as protobuf and uses them to encode (host side) and decode (plugin
side) the msgpack config values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from driversdk.errors import DriverSDKError
from driversdk.hclspec.literals import evaluate_literal
from driversdk.hclspec.types import HclType, parse_type

if TYPE_CHECKING:
    # The descriptors are loaded by to_proto, when a host first asks for a schema.
    from driversdk.pb import hcl_spec_pb2


class SpecError(DriverSDKError, ValueError):
    """A schema that can never work (a driver author's mistake, caught at construction).

    Not a ConfigError: no operator config is wrong. Also a ValueError, so a caller that catches
    ValueError for a bad argument catches it.
    """


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
        from driversdk.pb import hcl_spec_pb2

        return hcl_spec_pb2.Spec(Attr=hcl_spec_pb2.Attr(name=self.name, type=self.type, required=self.required))


@dataclass(frozen=True)
class Block(Spec):
    nested: Spec
    required: bool = False
    name: str = ""

    def to_proto(self) -> hcl_spec_pb2.Spec:
        from driversdk.pb import hcl_spec_pb2

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
        from driversdk.pb import hcl_spec_pb2

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
        _check_items("block list", self.name, self.min_items, self.max_items)

    def to_proto(self) -> hcl_spec_pb2.Spec:
        from driversdk.pb import hcl_spec_pb2

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

    def __post_init__(self) -> None:
        _check_items("block set", self.name, self.min_items, self.max_items)

    def to_proto(self) -> hcl_spec_pb2.Spec:
        from driversdk.pb import hcl_spec_pb2

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
        from driversdk.pb import hcl_spec_pb2

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
        from driversdk.pb import hcl_spec_pb2

        return hcl_spec_pb2.Spec(literal=hcl_spec_pb2.Literal(value=self.value))


@dataclass(frozen=True)
class Default(Spec):
    primary: Spec
    default: Spec

    def to_proto(self) -> hcl_spec_pb2.Spec:
        from driversdk.pb import hcl_spec_pb2

        return hcl_spec_pb2.Spec(
            default=hcl_spec_pb2.Default(primary=self.primary.to_proto(), default=self.default.to_proto())
        )


@dataclass(frozen=True)
class Object(Spec):
    attributes: Mapping[str, Spec]

    def __post_init__(self) -> None:
        for key, child in self.attributes.items():
            _check_array_names(child, key)

    def to_proto(self) -> hcl_spec_pb2.Spec:
        from driversdk.pb import hcl_spec_pb2

        out = hcl_spec_pb2.Object()
        for key, child in self.attributes.items():
            out.attributes[key].CopyFrom(_with_implied_name(child, key).to_proto())
        return hcl_spec_pb2.Spec(object=out)


@dataclass(frozen=True)
class Array(Spec):
    values: tuple[Spec, ...]

    def to_proto(self) -> hcl_spec_pb2.Spec:
        from driversdk.pb import hcl_spec_pb2

        return hcl_spec_pb2.Spec(array=hcl_spec_pb2.Array(values=[v.to_proto() for v in self.values]))


def _check_items(kind: str, name: str, min_items: int, max_items: int) -> None:
    # min_items/max_items are uint64 on the wire; 0 means "no limit".
    if min_items < 0 or max_items < 0:
        raise SpecError(f"{kind} {name!r}: min_items and max_items cannot be negative (0 means no limit)")
    if max_items and min_items > max_items:
        raise SpecError(f"{kind} {name!r}: min_items {min_items} exceeds max_items {max_items}")


_NAMED = (Attr, Block, BlockAttrs, BlockList, BlockSet, BlockMap)


def _with_implied_name(child: Spec, key: str) -> Spec:
    """Nomad only implies a name for an Object's direct child; a Default's primary gets none.

    To spare authors that gotcha (driver-protocol gotcha 16) we write the key as an explicit
    name on the primary of a Default, however many Defaults are stacked under the key.
    """
    if isinstance(child, Default):
        primary = child.primary
        if isinstance(primary, _NAMED) and not primary.name:
            primary = _rename(primary, key)
        elif isinstance(primary, Default):
            primary = _with_implied_name(primary, key)
        return Default(primary, child.default)
    return child


def _check_array_names(child: Spec, key: str) -> None:
    """An Array's elements get no implied name in Nomad, so each must carry its own."""
    if not isinstance(child, Array):
        return
    for i, element in enumerate(child.values):
        while isinstance(element, Default):
            element = element.primary
        if isinstance(element, _NAMED) and not element.name:
            raise SpecError(
                f"array under key {key!r}: element {i} ({type(element).__name__}) has no name, and Nomad "
                "implies none inside an array; give it name=..."
            )


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


def _name(name: str | None) -> str:
    # The builders take None for "implied from the Object key"; the proto spells that "".
    return name or ""


# --- builders ---------------------------------------------------------------------------------


def attr(type: str, required: bool = False, name: str | None = None) -> Attr:
    return Attr(type, required, _name(name))


def block(nested: Spec, required: bool = False, name: str | None = None) -> Block:
    return Block(nested, required, _name(name))


def block_attrs(type: str, required: bool = False, name: str | None = None) -> BlockAttrs:
    return BlockAttrs(type, required, _name(name))


def block_list(nested: Spec, min_items: int = 0, max_items: int = 0, name: str | None = None) -> BlockList:
    return BlockList(nested, min_items, max_items, _name(name))


def block_set(nested: Spec, min_items: int = 0, max_items: int = 0, name: str | None = None) -> BlockSet:
    return BlockSet(nested, min_items, max_items, _name(name))


def block_map(nested: Spec, labels: Sequence[str], name: str | None = None) -> BlockMap:
    return BlockMap(nested, tuple(labels), _name(name))


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
