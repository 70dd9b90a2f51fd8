"""Saved task state and records as JSON: one reader for every kit driver's frozen dataclasses.

A handle or record written by an older plugin version may lack a field added since: such a
field has a default, and a missing (or null) value takes it. A field without a default must be
present. Values are converted to the declared type, so a record edited by hand or a handle from
another tool cannot smuggle in, say, a string where a pid is expected.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from driversdk.errors import ConfigError

_SCALARS: dict[object, Callable[[Any], Any]] = {str: str, int: int, float: float, bool: bool}


class Dataclass(Protocol):
    __dataclass_fields__: typing.ClassVar[dict[str, Any]]


D = TypeVar("D", bound=Dataclass)


def _convert(kind: object, value: Any) -> Any:
    if typing.get_origin(kind) is dict:
        return {str(k): str(v) for k, v in dict(value).items()}  # every map a kit driver saves is str -> str
    convert = _SCALARS.get(kind)
    if convert is None:
        raise TypeError(f"no JSON reader for a field of type {kind!r}")
    return convert(value)


def from_fields(cls: type[D], raw: Mapping[str, Any], **given: Any) -> D:
    """``cls`` built from ``raw``'s values for its fields; ``given`` values (already checked by
    the caller) are taken as they are. Raises KeyError/ValueError/TypeError on bad input."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
            continue
        value = raw.get(f.name)
        if value is None:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise KeyError(f.name)
            continue
        values[f.name] = _convert(hints[f.name], value)
    return cls(**values)


def encode_state(state: Dataclass, version: int) -> bytes:
    """A task's driver_state: its fields plus the layout ``version``, which decode_state checks."""
    return json.dumps({"version": version, **dataclasses.asdict(state)}, sort_keys=True).encode()


def decode_state(cls: type[D], data: bytes, version: int, *, expected: int, driver: str) -> D:
    """The driver_state ``encode_state`` wrote, from a handle of layout ``version``."""
    try:
        raw = json.loads(data)
        if version != expected or raw.get("version") != expected:
            raise ValueError(f"unknown state version {raw.get('version')} (handle version {version})")
        return from_fields(cls, raw)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"failed to decode the {driver} driver's task state: {err}") from None
