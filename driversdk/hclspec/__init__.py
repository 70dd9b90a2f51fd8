"""hclspec: describe a plugin's HCL config blocks, and encode/decode their msgpack values.

from driversdk import hclspec as hs
spec = hs.obj({"image": hs.attr("string", required=True),
               "volumes": hs.block(hs.obj({"enabled": hs.default(hs.attr("bool"), hs.literal("false"))}))})

Imports are lazy (PEP 562): ``from driversdk import hclspec as hs`` costs nothing until a name
is used, so a plugin answers its first RPC before paying for schemas, msgpack or descriptors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from driversdk.hclspec.codec import decode, encode
    from driversdk.hclspec.literals import LiteralError, evaluate_literal
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

_LAZY = {
    "decode": "driversdk.hclspec.codec",
    "encode": "driversdk.hclspec.codec",
    "LiteralError": "driversdk.hclspec.literals",
    "evaluate_literal": "driversdk.hclspec.literals",
    "Array": "driversdk.hclspec.spec",
    "Attr": "driversdk.hclspec.spec",
    "Block": "driversdk.hclspec.spec",
    "BlockAttrs": "driversdk.hclspec.spec",
    "BlockList": "driversdk.hclspec.spec",
    "BlockMap": "driversdk.hclspec.spec",
    "BlockSet": "driversdk.hclspec.spec",
    "Default": "driversdk.hclspec.spec",
    "Literal": "driversdk.hclspec.spec",
    "Object": "driversdk.hclspec.spec",
    "Spec": "driversdk.hclspec.spec",
    "SpecError": "driversdk.hclspec.spec",
    "array": "driversdk.hclspec.spec",
    "attr": "driversdk.hclspec.spec",
    "block": "driversdk.hclspec.spec",
    "block_attrs": "driversdk.hclspec.spec",
    "block_list": "driversdk.hclspec.spec",
    "block_map": "driversdk.hclspec.spec",
    "block_set": "driversdk.hclspec.spec",
    "default": "driversdk.hclspec.spec",
    "literal": "driversdk.hclspec.spec",
    "obj": "driversdk.hclspec.spec",
    "HclType": "driversdk.hclspec.types",
    "TypeExprError": "driversdk.hclspec.types",
    "parse_type": "driversdk.hclspec.types",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'driversdk.hclspec' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
