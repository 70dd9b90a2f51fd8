"""HCL type expressions (``string``, ``list(number)``, ``object({a=string})`` …) and value checks.

One parser for the ``Attr.type`` / ``BlockAttrs.type`` strings of an hclspec, and one function
that checks and converts a value against a parsed type, used by both encode and decode.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from driversdk.errors import ConfigError, DriverSDKError


class TypeExprError(DriverSDKError, ValueError):
    """An hclspec type expression that does not parse (also a ValueError, so a caller that catches
    ValueError for a bad value catches it)."""


@dataclass(frozen=True)
class HclType:
    kind: str  # string | number | bool | any | list | set | map | object | tuple
    elem: HclType | None = None
    attrs: tuple[tuple[str, HclType], ...] = ()
    elems: tuple[HclType, ...] = ()

    def __str__(self) -> str:
        if self.kind in ("list", "set", "map"):
            return f"{self.kind}({self.elem})"
        if self.kind == "object":
            return "object({" + ", ".join(f"{k}={t}" for k, t in self.attrs) + "})"
        if self.kind == "tuple":
            return "tuple([" + ", ".join(str(t) for t in self.elems) + "])"
        return self.kind


_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_-]*|[(){}\[\]=,])")


def parse_type(text: str) -> HclType:
    tokens: list[str] = []
    pos = 0
    stripped = text.strip()
    while pos < len(stripped):
        m = _TOKEN.match(stripped, pos)
        if not m:
            raise TypeExprError(f"invalid type expression {text!r} near {stripped[pos:]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    parser = _TypeParser(tokens, text)
    result = parser.parse()
    if parser.i != len(tokens):
        raise TypeExprError(f"invalid type expression {text!r}: unexpected {tokens[parser.i]!r}")
    return result


class _TypeParser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens = tokens
        self.text = text
        self.i = 0

    def _take(self, expected: str | None = None) -> str:
        if self.i >= len(self.tokens):
            raise TypeExprError(f"invalid type expression {self.text!r}: it ends too early")
        tok = self.tokens[self.i]
        if expected is not None and tok != expected:
            raise TypeExprError(f"invalid type expression {self.text!r}: expected {expected!r}, found {tok!r}")
        self.i += 1
        return tok

    def parse(self) -> HclType:
        name = self._take()
        if name in ("string", "number", "bool", "any"):
            return HclType(name)
        if name in ("list", "set", "map"):
            self._take("(")
            elem = self.parse()
            self._take(")")
            return HclType(name, elem=elem)
        if name == "object":
            self._take("(")
            self._take("{")
            attrs: list[tuple[str, HclType]] = []
            while self.tokens[self.i] != "}":
                key = self._take()
                self._take("=")
                attrs.append((key, self.parse()))
                if self.tokens[self.i] == ",":
                    self._take(",")
            self._take("}")
            self._take(")")
            return HclType("object", attrs=tuple(attrs))
        if name == "tuple":
            self._take("(")
            self._take("[")
            elems: list[HclType] = []
            while self.tokens[self.i] != "]":
                elems.append(self.parse())
                if self.tokens[self.i] == ",":
                    self._take(",")
            self._take("]")
            self._take(")")
            return HclType("tuple", elems=tuple(elems))
        raise TypeExprError(
            f"invalid type expression {self.text!r}: unknown type {name!r} (use string, number, bool, any, "
            "list(T), set(T), map(T), object({...}) or tuple([...]))"
        )


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int | float | Decimal):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, bytes):
        return "bytes"
    return type(value).__name__


def _mismatch(where: str, value: Any, typ: HclType) -> ConfigError:
    return ConfigError(f"{where} is {_describe(value)}, expected {_expected(typ)}")


def _expected(typ: HclType) -> str:
    if typ.kind == "any":
        return "any value"
    return f"{'an' if typ.kind == 'object' else 'a'} {typ}"


_WRAPPED = re.compile(r"\$\{\s*([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)\s*\}")


def to_number(value: Any) -> int | float | Decimal | None:
    """HCL's number conversion; None when the value is not a number or a numeric string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float | Decimal):
        return value
    if isinstance(value, str):
        # python-hcl2 hands back a literal it cannot represent (e.g. 1e-7) as "${1e-7}".
        wrapped = _WRAPPED.fullmatch(value)
        if wrapped:
            value = wrapped.group(1)
        try:
            dec = Decimal(value.strip())
        except InvalidOperation:
            return None
        if not dec.is_finite():
            return float(dec)
        if dec == dec.to_integral_value() and "e" not in value.lower() and "." not in value:
            return int(dec)
        as_float = float(dec)
        return as_float if Decimal(as_float) == dec else dec
    return None


def convert(value: Any, typ: HclType, where: str) -> Any:
    """Check ``value`` against ``typ`` with HCL's safe conversions; None passes through."""
    if value is None or typ.kind == "any":
        return value
    if typ.kind == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | Decimal) or (isinstance(value, float) and math.isfinite(value)):
            return format_number(value)
        raise _mismatch(where, value, typ)
    if typ.kind == "number":
        num = to_number(value)
        if num is None:
            raise _mismatch(where, value, typ)
        return num
    if typ.kind == "bool":
        if isinstance(value, bool):
            return value
        # cty's string-to-bool conversion, which Nomad's decoding of plugin and task configs uses:
        # "true" and "1", "false" and "0" (nothing else, and only in lower case).
        if isinstance(value, str) and value in ("true", "false", "1", "0"):
            return value in ("true", "1")
        raise _mismatch(where, value, typ)
    if typ.kind in ("list", "set"):
        if not isinstance(value, list | tuple):
            raise _mismatch(where, value, typ)
        assert typ.elem is not None
        out = [convert(v, typ.elem, f"{where}[{i}]") for i, v in enumerate(value)]
        if typ.kind == "set":
            deduped: list[Any] = []
            for item in out:
                if item not in deduped:
                    deduped.append(item)
            out = deduped
        return out
    if typ.kind == "map":
        value = _single_map(value)
        if not isinstance(value, dict):
            raise _mismatch(where, value, typ)
        assert typ.elem is not None
        return {str(k): convert(v, typ.elem, f"{where}.{k}") for k, v in value.items()}
    if typ.kind == "object":
        value = _single_map(value)
        if not isinstance(value, dict):
            raise _mismatch(where, value, typ)
        known = dict(typ.attrs)
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ConfigError(f"{where} has unknown attribute(s) {', '.join(unknown)}; expected {typ}")
        return {k: convert(value.get(k), t, f"{where}.{k}") for k, t in typ.attrs}
    if typ.kind == "tuple":
        if not isinstance(value, list | tuple) or len(value) != len(typ.elems):
            raise _mismatch(where, value, typ)
        return [convert(v, t, f"{where}[{i}]") for i, (v, t) in enumerate(zip(value, typ.elems, strict=True))]
    raise ConfigError(f"{where}: unsupported type {typ}")  # pragma: no cover - parse_type prevents it


def _single_map(value: Any) -> Any:
    """HCL1-style job files deliver a map written as a block as a list of one map."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        merged: dict[str, Any] = {}
        for item in value:
            merged.update(item)
        return merged
    return value


def format_number(value: int | float | Decimal) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
