"""Read an HCL file into plain Python values, with parse errors as one sentence naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from driversdk.errors import ConfigError
from driversdk.jobspec.hcllimits import MAX_JOB_FILE_BYTES


class HCLFileError(ConfigError):
    """A file that is not valid HCL (or cannot be read); ``path`` and ``line`` when known (the
    sentence itself starts with them)."""

    def __init__(self, message: str, path: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


def read_text(path: str | Path) -> str:
    """A file's text; unreadable, oversized or non-UTF-8 files are one sentence naming the file
    (and line). At most MAX_JOB_FILE_BYTES are read: a larger file (or /dev/zero given as a
    job) is refused before it is parsed."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JOB_FILE_BYTES + 1)
    except OSError as err:
        raise HCLFileError(f"{path}: cannot read the file: {err.strerror or err}") from None
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise HCLFileError(
            f"{path}: the file is over {MAX_JOB_FILE_BYTES} bytes, the most driversdk reads of an HCL file; "
            "move large content into a file next to it and read it with file()"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        # HCL files are UTF-8 (as Nomad reads them); anything else is refused with the first bad
        # byte, so the operator can find it, instead of a decode traceback.
        bad_line = raw.count(b"\n", 0, err.start) + 1
        raise HCLFileError(
            f"{path}:{bad_line}: the file is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
            "save it as UTF-8"
        ) from None


def syntax_error(path: str | Path, err: Exception, text: str = "") -> HCLFileError:
    """One sentence for a syntax error in HCL's terms, at file:line:column with the offending
    text (lark's own error is described here; the evaluator's HCLSyntaxError already is)."""
    from driversdk.jobspec.hcl.evaluator import HCLSyntaxError

    described = err if isinstance(err, HCLSyntaxError) else HCLSyntaxError(err, text)
    line, column = described.line, described.column
    where = f"{path}:{line}:{column}" if line and column else f"{path}:{line}" if line else str(path)
    return HCLFileError(f"{where}: {described}", str(path), line or 0)


def load_hcl(path: str | Path) -> dict[str, Any]:
    # python-hcl2 and lark are imported here, not with this module: the client config, job files'
    # helpers and `driversdk run`'s first steps use this module without parsing HCL2 (~80 ms of imports).
    try:
        from hcl2.api import serialize, transform
        from hcl2.utils import SerializationOptions
        from lark.exceptions import LarkError
    except ImportError as err:
        # The runner extra is missing or broken: said as such by the caller, never as the file's fault.
        raise ImportError(f"python-hcl2 (module 'hcl2') does not import: {err}", name="hcl2") from err
    from driversdk.jobspec import parsecache

    text = read_text(path)
    options = SerializationOptions(strip_string_quotes=True, with_comments=False, preserve_heredocs=False)
    try:
        # hcl2.loads, with the job path's parser (parsecache): python-hcl2's own loads its lark
        # cache file object by object (~50 ms), or builds the grammar afresh (~0.2 s) when that
        # file in site-packages cannot be written; the pickled one loads in ~20 ms.
        tree = parsecache.hcl2_parser().parse(text + "\n")  # the trailing newline, as hcl2.loads adds it
        data = serialize(transform(tree), serialization_options=options)
    except LarkError as err:
        raise syntax_error(path, err, text) from None
    except Exception as err:
        # python-hcl2's transformer fails with plain Python errors (ValueError, RuntimeError for
        # an attribute and a block of the same name, ...) on some inputs that parse: whatever it
        # raises on a file's content is a problem with the file, said as one sentence.
        raise HCLFileError(f"{path}: this HCL could not be read ({type(err).__name__}: {err}); fix it") from None
    if not isinstance(data, dict):
        raise HCLFileError(f"{path}: this HCL file has no body of arguments and blocks")
    cleaned: dict[str, Any] = clean(data)
    return cleaned


def clean(value: Any) -> Any:
    """Drop python-hcl2's bookkeeping keys (``__is_block__`` …)."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if not (k.startswith("__") and k.endswith("__"))}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def is_blocks(value: Any) -> bool:
    """Whether ``value`` is what blocks parse to (a list of bodies); ``x = 5`` for a block is not."""
    return isinstance(value, list) and all(isinstance(b, dict) for b in value)


def labelled(blocks: Any) -> list[tuple[str, dict[str, Any]]]:
    """``job "x" { … }`` comes back as [{"x": {…}}]: return [("x", {…})].

    Anything else (``job = 5``) gives no blocks; callers report it with :func:`is_blocks`.
    """
    out: list[tuple[str, dict[str, Any]]] = []
    if not is_blocks(blocks):
        return out
    for block in blocks:
        for label, body in block.items():
            out.append((str(label), body if isinstance(body, dict) else {}))
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
