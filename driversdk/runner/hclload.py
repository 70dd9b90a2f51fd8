"""Read an HCL file into plain Python values, with parse errors as one sentence naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hcl2
from hcl2.utils import SerializationOptions
from lark.exceptions import LarkError

from driversdk.errors import ConfigError

_OPTIONS = SerializationOptions(strip_string_quotes=True, with_comments=False, preserve_heredocs=False)


class HCLFileError(ConfigError):
    """A file that is not valid HCL (or cannot be read)."""


def load_hcl(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise HCLFileError(f"{path}: cannot read the file: {err.strerror}") from None
    try:
        data = hcl2.loads(text, serialization_options=_OPTIONS)
    except LarkError as err:
        line = getattr(err, "line", None)
        column = getattr(err, "column", None)
        where = f"{path}:{line}:{column}" if line else str(path)
        first = str(err).strip().splitlines()[0]
        raise HCLFileError(f"{where}: this is not valid HCL ({first}); fix the syntax there") from None
    cleaned: dict[str, Any] = clean(data)
    return cleaned


def clean(value: Any) -> Any:
    """Drop python-hcl2's bookkeeping keys (``__is_block__`` …)."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if not (k.startswith("__") and k.endswith("__"))}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def labelled(blocks: Any) -> list[tuple[str, dict[str, Any]]]:
    """``job "x" { … }`` comes back as [{"x": {…}}]: return [("x", {…})]."""
    out: list[tuple[str, dict[str, Any]]] = []
    for block in blocks or []:
        for label, body in block.items():
            out.append((label, body if isinstance(body, dict) else {}))
    return out


def single(blocks: Any) -> dict[str, Any]:
    """An unlabelled block written once: [{…}] -> {…}; absent -> {}."""
    if isinstance(blocks, list):
        merged: dict[str, Any] = {}
        for block in blocks:
            if isinstance(block, dict):
                merged.update(block)
        return merged
    return blocks if isinstance(blocks, dict) else {}
