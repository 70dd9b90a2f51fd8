"""The client config loader knows every option our bundled drivers' plugin schemas accept, so a
client file that sets one of them (Nomad's or our addition) is never called unknown."""

from __future__ import annotations

from typing import Any

import pytest

from driversdk.hclspec import spec as hs
from driversdk.jobspec.nomadopts import PLUGIN_OPTIONS


def _names(spec: hs.Spec) -> dict[str, Any]:
    """The option names a plugin schema reads: None for an argument, a dict for a block."""
    if isinstance(spec, hs.Default):
        return _names(spec.primary)
    assert isinstance(spec, hs.Object), spec
    out: dict[str, Any] = {}
    for key, child in spec.attributes.items():
        name = hs.input_name(child, key)
        if name is None:
            continue
        inner = child.primary if isinstance(child, hs.Default) else child
        if isinstance(inner, (hs.Block, hs.BlockList, hs.BlockSet, hs.BlockMap)):
            out[name] = _names(inner.nested)
        else:
            out[name] = None
    return out


def _missing(schema: dict[str, Any], known: dict[str, Any], path: str = "") -> list[str]:
    gaps = []
    for name, nested in schema.items():
        where = f"{path}.{name}" if path else name
        if name not in known:
            gaps.append(where)
        elif isinstance(nested, dict):
            inner = known[name]
            if not isinstance(inner, dict):
                gaps.append(f"{where} (a block in the schema, an argument in nomadopts)")
            else:
                gaps.extend(_missing(nested, inner, where))
    return gaps


@pytest.mark.parametrize("driver", ["docker", "exec", "raw_exec"])
def test_every_plugin_option_of_a_bundled_driver_is_known(driver: str) -> None:
    module = __import__(f"drivers.{driver}.config", fromlist=["plugin_spec"])
    assert _missing(_names(module.plugin_spec()), PLUGIN_OPTIONS[driver]) == []
