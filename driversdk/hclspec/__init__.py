"""hclspec: describe a plugin's HCL config blocks, and encode/decode their msgpack values.

from driversdk import hclspec as hs
spec = hs.obj({"image": hs.attr("string", required=True),
               "volumes": hs.block(hs.obj({"enabled": hs.default(hs.attr("bool"), hs.literal("false"))}))})
"""

from driversdk.hclspec.codec import decode, encode
from driversdk.hclspec.literal import LiteralError, evaluate_literal
from driversdk.hclspec.spec import (
    Array,
    Attr,
    Block,
    BlockAttrs,
    BlockList,
    BlockMap,
    BlockSet,
    Default,
    Literal,
    Object,
    Spec,
    SpecError,
    array,
    attr,
    block,
    block_attrs,
    block_list,
    block_map,
    block_set,
    default,
    literal,
    obj,
)
from driversdk.hclspec.types import HclType, TypeExprError, parse_type

__all__ = [
    "Array",
    "Attr",
    "Block",
    "BlockAttrs",
    "BlockList",
    "BlockMap",
    "BlockSet",
    "Default",
    "HclType",
    "Literal",
    "LiteralError",
    "Object",
    "Spec",
    "SpecError",
    "TypeExprError",
    "array",
    "attr",
    "block",
    "block_attrs",
    "block_list",
    "block_map",
    "block_set",
    "decode",
    "default",
    "encode",
    "evaluate_literal",
    "literal",
    "obj",
    "parse_type",
]
