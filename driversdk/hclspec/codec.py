"""Config values through an hclspec: encode on the host side, decode in the plugin.

``encode`` does what a Nomad client does with an HCL ``config {}`` body (validate against the
schema, apply defaults, msgpack-encode the result as go-cty would); ``decode`` is the plugin's
side: msgpack bytes in, a validated dict keyed by the schema's Object keys out. Both report
every problem at once, each naming the field path, what was expected and what was found.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import msgpack

from driversdk.errors import ConfigError
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
    input_name,
)
from driversdk.hclspec.spelling import did_you_mean
from driversdk.hclspec.types import HclType, convert

_INT64 = (-(2**63), 2**63 - 1)


class _Errors:
    def __init__(self, what: str) -> None:
        self.what = what
        self.items: list[str] = []

    def add(self, message: str) -> None:
        self.items.append(message)

    def where(self, path: str) -> str:
        return f"{self.what}: {path}" if path else self.what

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigErrors(self.items)


class ConfigErrors(ConfigError):
    """Every problem of one config at once; ``items`` holds each, its field path first
    (``config: imgae is not a known field…``), for callers that place each on its own line."""

    def __init__(self, items: list[str]) -> None:
        super().__init__("; ".join(items))
        self.items = list(items)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_meta(key: str) -> bool:
    # python-hcl2 adds __is_block__, __start_line__, __comments__ … beside the real keys.
    return key.startswith("__") and key.endswith("__")


def _blocks(raw: Any, here: str, errs: _Errors) -> list[dict[str, Any]] | None:
    """The blocks written for one block type, as python-hcl2 or a plain dict gives them.

    A plain value where a block belongs (``gc = false`` for ``gc { … }``) is an error: read as
    "no block", it would silently turn on the defaults the operator meant to switch off."""
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        return [dict(raw)]
    if isinstance(raw, list) and all(isinstance(b, Mapping) for b in raw):
        return [dict(b) for b in raw]
    name = here.rsplit(".", 1)[-1]
    errs.add(f"{errs.where(here)} must be a block ({name} {{ … }}), not the value {raw!r}")
    return []


def _clean(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if not _is_meta(k)}


# --- encode (host side) -----------------------------------------------------------------------


def _consumed(spec: Spec, key: str) -> set[str]:
    if isinstance(spec, Object):
        names: set[str] = set()
        for k, child in spec.attributes.items():
            names |= _consumed(child, k)
        return names
    if isinstance(spec, Array):
        out: set[str] = set()
        for child in spec.values:
            out |= _consumed(child, key)
        return out
    if isinstance(spec, Default):
        return _consumed(spec.primary, key) | _consumed(spec.default, key)
    name = input_name(spec, key)
    return {name} if name else set()


def _enc_body(spec: Spec, body: Mapping[str, Any], path: str, errs: _Errors) -> Any:
    """One HCL body (the config root or a block's inside): names nothing in ``spec`` reads are errors.

    The check is made once per body against every name the whole spec reads, because an Object
    nested directly in an Object (no block between) reads from the same body as its parent.
    """
    body = _clean(body)
    known = _consumed(spec, "")
    for name in sorted(set(body) - known):
        advice = did_you_mean(name, known) or "; remove it or check its spelling"
        errs.add(f"{errs.where(_join(path, name))} is not a known field{advice}")
    return _enc_child(spec, body, "", path, errs)


def _enc_child(spec: Spec, body: Mapping[str, Any], key: str, path: str, errs: _Errors) -> Any:
    name = input_name(spec, key) or key
    here = _join(path, name)
    if isinstance(spec, Attr):
        raw = body.get(name)
        if raw is None:
            if spec.required:
                errs.add(f"{errs.where(here)} is required ({spec.type}); set it")
            return None
        return _convert(raw, spec.parsed, here, errs)
    if isinstance(spec, Block):
        blocks = _blocks(body.get(name), here, errs)
        if not blocks:
            if spec.required:
                errs.add(f"{errs.where(here)} block is required; add a {name} {{ … }} block")
            return None
        if len(blocks) > 1:
            errs.add(f"{errs.where(here)} block is written {len(blocks)} times; only one is allowed")
        return _enc_body(spec.nested, blocks[0], here, errs)
    if isinstance(spec, BlockList | BlockSet):
        blocks = _blocks(body.get(name), here, errs) or []
        if len(blocks) < spec.min_items:
            errs.add(f"{errs.where(here)} needs at least {spec.min_items} block(s), found {len(blocks)}")
        if spec.max_items and len(blocks) > spec.max_items:
            errs.add(f"{errs.where(here)} allows at most {spec.max_items} block(s), found {len(blocks)}")
        items = [_enc_body(spec.nested, b, f"{here}[{i}]", errs) for i, b in enumerate(blocks)]
        if isinstance(spec, BlockSet):
            unique: list[Any] = []
            for item in items:
                if item not in unique:
                    unique.append(item)
            items = unique
        return items
    if isinstance(spec, BlockMap):
        out: dict[str, Any] = {}
        for block in _blocks(body.get(name), here, errs) or []:
            _enc_labelled(spec, _clean(block), list(spec.labels), out, here, errs)
        return out
    if isinstance(spec, BlockAttrs):
        blocks = _blocks(body.get(name), here, errs)
        if not blocks:
            if spec.required:
                errs.add(f"{errs.where(here)} block is required")
            return None
        merged: dict[str, Any] = {}
        for b in blocks:
            merged.update(_clean(b))
        return {k: _convert(v, spec.parsed, _join(here, k), errs) for k, v in merged.items()}
    if isinstance(spec, Default):
        value = _enc_child(spec.primary, body, key, path, errs)
        return value if value is not None else _enc_child(spec.default, body, key, path, errs)
    if isinstance(spec, Literal):
        return spec.evaluated
    if isinstance(spec, Array):
        return [_enc_child(v, body, key, path, errs) for v in spec.values]
    if isinstance(spec, Object):
        return {k: _enc_child(child, body, k, path, errs) for k, child in spec.attributes.items()}
    raise ConfigError(f"unsupported spec {spec!r}")  # pragma: no cover


def _enc_labelled(
    spec: BlockMap, block: dict[str, Any], labels: list[str], out: dict[str, Any], here: str, errs: _Errors
) -> None:
    # python-hcl2 writes `name "label" { … }` as {"label": {…}}; one dict level per label.
    for label, inner in block.items():
        where = f"{here}[{label!r}]"
        if not isinstance(inner, Mapping):
            errs.add(f"{errs.where(where)} must be a block with {len(labels)} label(s): {', '.join(labels)}")
            continue
        if len(labels) > 1:
            nested_out = out.setdefault(label, {})
            _enc_labelled(spec, _clean(inner), labels[1:], nested_out, where, errs)
        else:
            if label in out:
                errs.add(f"{errs.where(where)} is written twice; block labels must be unique")
            out[label] = _enc_body(spec.nested, inner, where, errs)


def _convert(raw: Any, typ: HclType, path: str, errs: _Errors) -> Any:
    try:
        return convert(raw, typ, errs.where(path))
    except ConfigError as err:
        errs.add(str(err))
        return None


def _cty(value: Any) -> Any:
    """Shape a converted value as go-cty's msgpack marshaller would: sorted keys, cty number forms."""
    if isinstance(value, dict):
        return {k: _cty(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_cty(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float | Decimal):
        return _cty_number(value)
    return value


def _cty_number(value: int | float | Decimal) -> int | float | str:
    """cty's rule: an exact int64 is an int, else an exact float64 is a float64, else decimal text.

    HCL parses number literals at high precision, so the literal 0.1 is not an exact float64 and
    travels as the text "0.1"; 1.5 is exact and travels as a float64. A Python float stands for
    the shortest decimal that reads back as it (what the user wrote), hence ``repr``.
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            return value  # ±Inf travels as float64 (cty has no NaN)
        exact = Decimal(repr(value))
    elif isinstance(value, int):
        exact = Decimal(value)
    else:
        exact = value
    if exact == exact.to_integral_value() and _INT64[0] <= exact <= _INT64[1]:
        return int(exact)
    as_float = float(exact)
    if Decimal(as_float) == exact:
        return as_float
    return format(exact.normalize(), "f")


def _msgpack_default(value: Any) -> Any:
    raise TypeError(f"cannot encode {type(value).__name__} in a config value")


def encode(spec: Spec, value: Mapping[str, Any], *, what: str) -> bytes:
    """Validate an HCL config body against ``spec`` and msgpack-encode it as Nomad does."""
    errs = _Errors(what)
    result = _enc_body(spec, value or {}, "", errs)
    errs.raise_if_any()
    packed: bytes = msgpack.packb(_cty(result), use_bin_type=True, use_single_float=False, default=_msgpack_default)
    return packed


# --- decode (plugin side) ---------------------------------------------------------------------


def _undynamic(value: Any) -> Any:
    """cty's dynamic wrapper is [type-JSON bytes, value]; Nomad should never send it, but may."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], bytes):
        return value[1]
    return value


def _dec(spec: Spec, value: Any, path: str, errs: _Errors) -> Any:
    value = _undynamic(value)
    if isinstance(spec, Object):
        if value is None:
            value = {}
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
            value = value[0]
        if not isinstance(value, dict):
            errs.add(f"{errs.where(path)} is {_kind(value)}, expected an object")
            return None
        for extra in sorted(set(value) - set(spec.attributes), key=str):
            advice = did_you_mean(str(extra), spec.attributes) or "; remove it or check its spelling"
            errs.add(f"{errs.where(_join(path, str(extra)))} is not a known field{advice}")
        return {k: _dec(child, value.get(k), _join(path, k), errs) for k, child in spec.attributes.items()}
    if isinstance(spec, Attr):
        if value is None:
            if spec.required:
                errs.add(f"{errs.where(path)} is required ({spec.type}); set it")
            return None
        return _floatify(_convert(value, spec.parsed, path, errs))
    if isinstance(spec, Block):
        if value is None:
            if spec.required:
                errs.add(f"{errs.where(path)} block is required")
            return None
        return _dec(spec.nested, value, path, errs)
    if isinstance(spec, BlockList | BlockSet):
        if value is None:
            return []
        if not isinstance(value, list):
            errs.add(f"{errs.where(path)} is {_kind(value)}, expected a list of blocks")
            return []
        if len(value) < spec.min_items:
            errs.add(f"{errs.where(path)} needs at least {spec.min_items} block(s), found {len(value)}")
        if spec.max_items and len(value) > spec.max_items:
            errs.add(f"{errs.where(path)} allows at most {spec.max_items} block(s), found {len(value)}")
        return [_dec(spec.nested, v, f"{path}[{i}]", errs) for i, v in enumerate(value)]
    if isinstance(spec, BlockMap):
        if value is None:
            return {}
        return _dec_map(spec, value, len(spec.labels), path, errs)
    if isinstance(spec, BlockAttrs):
        if value is None:
            if spec.required:
                errs.add(f"{errs.where(path)} block is required")
            return None
        return _floatify(_convert(value, HclType("map", elem=spec.parsed), path, errs))
    if isinstance(spec, Default):
        decoded = _dec(spec.primary, value, path, errs)
        return decoded if decoded is not None else _dec(spec.default, None, path, errs)
    if isinstance(spec, Literal):
        return _floatify(spec.evaluated)
    if isinstance(spec, Array):
        if value is None:
            value = [None] * len(spec.values)
        if not isinstance(value, list) or len(value) != len(spec.values):
            errs.add(f"{errs.where(path)} is {_kind(value)}, expected {len(spec.values)} values")
            return None
        return [_dec(s, v, f"{path}[{i}]", errs) for i, (s, v) in enumerate(zip(spec.values, value, strict=True))]
    raise ConfigError(f"unsupported spec {spec!r}")  # pragma: no cover


def _dec_map(spec: BlockMap, value: Any, depth: int, path: str, errs: _Errors) -> Any:
    if not isinstance(value, dict):
        errs.add(f"{errs.where(path)} is {_kind(value)}, expected a map of labelled blocks")
        return {}
    if depth == 1:
        return {k: _dec(spec.nested, v, f"{path}[{k!r}]", errs) for k, v in value.items()}
    return {k: _dec_map(spec, v, depth - 1, f"{path}[{k!r}]", errs) for k, v in value.items()}


def _floatify(value: Any) -> Any:
    """Decimal numbers (sent as text because float64 cannot hold them) become Python floats."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [_floatify(v) for v in value]
    if isinstance(value, dict):
        return {k: _floatify(v) for k, v in value.items()}
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    return type(value).__name__


def decode(spec: Spec, data: bytes, *, what: str) -> dict[str, Any]:
    """Decode msgpack config bytes against ``spec``; empty bytes mean every field is absent.

    Numbers come back as ``int`` when integral and ``float`` otherwise: a number cty sent as
    decimal text (e.g. "0.1") becomes the nearest float, which is what a driver computes with.
    """
    errs = _Errors(what)
    raw: Any = {}
    if data:
        try:
            raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as err:
            raise ConfigError(
                f"{what} is not valid msgpack ({err}); the host must send the encoded config value"
            ) from None
    result = _dec(spec, raw, "", errs)
    errs.raise_if_any()
    if not isinstance(result, dict):
        raise ConfigError(f"{what} must be an object at the top level")
    return result
