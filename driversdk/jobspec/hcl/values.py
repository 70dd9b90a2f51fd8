"""HCL values as plain Python, type constraints, and the conversions cty applies.

Values (:data:`Value`) are ``None``, ``bool``, ``int``/``float`` (HCL numbers), ``str``, ``list``
(tuples, lists and sets) and ``dict`` with string keys (objects and maps). A type constraint
(:data:`Type`) is a small tuple: ``("string",)``, ``("number",)``, ``("bool",)``, ``("any",)``,
``("list", T)``, ``("set", T)``, ``("map", T)``, ``("tuple", [T, …])`` or ``("object", {name: T})``.
"""

from __future__ import annotations

import math
import re
from typing import TypeAlias

from driversdk.errors import DriverSDKError

# An evaluated HCL value, as the evaluator, the functions and the job body hold it. Nothing else:
# the decoders make these only (yamldecode's timestamps and !!binary are strings, as in cty).
Value: TypeAlias = bool | int | float | str | list["Value"] | dict[str, "Value"] | None

# A type constraint: its kind, then for list/set/map the element type, for tuple the element
# types, for object the attribute types.
Type: TypeAlias = tuple[str] | tuple[str, "Type | list[Type] | dict[str, Type]"]

STRING: Type = ("string",)
NUMBER: Type = ("number",)
BOOL: Type = ("bool",)
ANY: Type = ("any",)

_NUMBER_TEXT = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


class ConvertError(DriverSDKError, ValueError):
    """A value that cannot become the wanted type; the message says why, in a few words."""


def type_name(value: Value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "tuple"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def show_type(t: Type) -> str:
    kind = t[0]
    inner = t[1] if len(t) == 2 else None
    if kind in ("list", "set", "map") and isinstance(inner, tuple):
        return f"{kind}({show_type(inner)})"
    if kind == "tuple" and isinstance(inner, list):
        return "tuple([" + ", ".join(show_type(e) for e in inner) + "])"
    if kind == "object" and isinstance(inner, dict):
        return "object({" + ", ".join(f"{k} = {show_type(v)}" for k, v in inner.items()) + "})"
    return str(kind)


def type_of(value: Value) -> Type:
    """The type a variable's default gives it when no ``type`` is declared."""
    if value is None:
        return ANY
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int | float):
        return NUMBER
    if isinstance(value, str):
        return STRING
    if isinstance(value, list):
        return ("tuple", [type_of(v) for v in value])
    if isinstance(value, dict):
        return ("object", {k: type_of(v) for k, v in value.items()})
    return ANY


def number_text(value: int | float) -> str:
    """A number as cty writes it into a string: whole numbers without a fraction."""
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e21:
            return str(int(value))
        return repr(value)
    return str(value)


def parse_number(text: str) -> int | float:
    text = text.strip()
    if not _NUMBER_TEXT.match(text):
        raise ConvertError(f"a number is required, not the string {text!r}")
    if re.match(r"^[+-]?\d+$", text):
        return int(text)
    number = float(text)
    return int(number) if number.is_integer() and abs(number) < 2**63 else number


def to_string(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return number_text(value)
    if isinstance(value, str):
        return value
    raise ConvertError(f"a string is required, not {type_name(value)}")


def to_bool(value: Value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in ("true", "1"):
            return True
        if value in ("false", "0"):
            return False
        raise ConvertError(f"a bool is required, not the string {value!r}")
    raise ConvertError(f"a bool is required, not {type_name(value)}")


def to_number(value: Value) -> int | float:
    if isinstance(value, bool):
        raise ConvertError("a number is required, not bool")
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        return parse_number(value)
    raise ConvertError(f"a number is required, not {type_name(value)}")


def convert(value: Value, t: Type) -> Value:
    """``value`` as type ``t``, converted as cty converts (``"3"`` → 3, ``5`` → ``"5"``)."""
    kind = t[0]
    inner = t[1] if len(t) == 2 else None  # what the kind is of (see Type); None for the primitives
    if value is None or kind == "any":
        return value
    if kind == "string":
        return to_string(value)
    if kind == "number":
        return to_number(value)
    if kind == "bool":
        return to_bool(value)
    if kind in ("list", "set") and isinstance(inner, tuple):
        if not isinstance(value, list):
            raise ConvertError(f"a {kind} is required, not {type_name(value)}")
        element = _one_type(value, kind) if inner == ANY else inner
        items = [convert(v, element) for v in value]
        if kind == "set":
            unique: list[Value] = []
            for item in items:
                if item not in unique:
                    unique.append(item)
            items = unique
        return items
    if kind == "tuple" and isinstance(inner, list):
        if not isinstance(value, list) or len(value) != len(inner):
            raise ConvertError(f"a tuple of {len(inner)} elements is required")
        return [convert(v, e) for v, e in zip(value, inner, strict=True)]
    if kind == "map" and isinstance(inner, tuple):
        if not isinstance(value, dict):
            raise ConvertError(f"a map is required, not {type_name(value)}")
        element = _one_type(list(value.values()), kind) if inner == ANY else inner
        return {str(k): convert(v, element) for k, v in value.items()}
    if kind == "object" and isinstance(inner, dict):
        if not isinstance(value, dict):
            raise ConvertError(f"an object is required, not {type_name(value)}")
        out: dict[str, Value] = {}
        for name, attr_type in inner.items():
            if name not in value:
                raise ConvertError(f'attribute "{name}" is required')
            out[name] = convert(value[name], attr_type)
        return out
    raise ConvertError(f"unknown type {show_type(t)}")


def _one_type(items: list[Value], kind: str) -> Type:
    """The one element type a list, set or map of ``any`` takes, as cty unifies its elements'
    types: strings, numbers and bools mixed become strings; numbers and bools alone cannot be one
    type. Elements that are collections are kept as they are (ANY)."""
    kinds = {type_name(v) for v in items if v is not None}
    if len(kinds) < 2 or not kinds <= {"string", "number", "bool"}:
        return ANY
    if "string" in kinds:
        return STRING
    raise ConvertError(f"the elements of a {kind} must have one type, and number and bool cannot be one")


def truthy(value: Value) -> bool:
    """A condition's value: a bool, or a string cty converts to one."""
    if value is None:
        raise ConvertError("a condition cannot be null")
    return to_bool(value)
