"""What one job file's evaluation may cost, and the counter that enforces it.

A job file is code: functions read files, loops multiply, locals share values that functions then
copy. Each cap below is far above what a real job file reaches (the fixtures of the test suite use
less than a thousandth of each) and low enough that the worst case stays a few hundred MB and
seconds of work for `driversdk validate` / `run`. Going over one is a refusal naming the file and
the line of the expression, never a traceback or a machine out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from driversdk.errors import DriverSDKError

KIB = 1024
MIB = 1024 * KIB

# The job file (and each -var-file): Nomad's API takes jobs of a few MB as JSON, and HCL parses
# to ~700 bytes of tree per byte of dense text, so 512 KiB keeps a parse under ~0.4 GB. Large
# content belongs in a file next to the job, read with file().
MAX_JOB_FILE_BYTES = 512 * KIB
# One file read by file() / filebase64(): a config or a template, not a data set.
MAX_READ_FILE_BYTES = 1 * MIB
# Everything the file functions read in one evaluation.
MAX_READ_TOTAL_BYTES = 8 * MIB
# Directory entries fileset() may look at in one evaluation (a job dir holds tens).
MAX_FILESET_ENTRIES = 10_000
# One string: 4 MiB is 4x the largest file() may return; a join/format/template beyond it is a
# loop running away, not a job.
MAX_STRING_CHARS = 4 * MIB
# One value (a function's arguments or result, an argument of a block): its elements counted
# as written out, so values that share a part (locals, setproduct) are counted as what they copy to.
MAX_VALUE_ELEMENTS = 100_000
MAX_VALUE_CHARS = 16 * MIB
# Values nested deeper than this would exhaust Python's stack in whatever walks them next.
MAX_VALUE_DEPTH = 64
# Everything functions return and arguments hold in one evaluation: bounds the memory made.
MAX_TOTAL_ELEMENTS = 2_000_000
MAX_TOTAL_CHARS = 64 * MIB
# Expressions evaluated in one evaluation (a real job: a few thousand); ~5 s of work at most.
MAX_STEPS = 1_000_000
# Expressions nested inside each other while evaluating (each costs Python stack frames).
MAX_NESTING = 100
# Levels of the parse tree (a list in a list is two): real job files reach 30; the tree is copied
# and walked recursively, and Python's stack holds about 1000 frames.
MAX_TREE_DEPTH = 200
# Integers beyond this many bits are a multiplication running away (cty numbers hold 512 bits).
MAX_INT_BITS = 1024
# Parse trees are kept (in memory, on disk) only for texts up to this size: a tree is ~30x its
# text as JSON, so the cache can never hold a huge tree.
MAX_CACHED_TEXT_BYTES = 64 * KIB


class LimitError(DriverSDKError):
    """An evaluation that went over a cap: it stops there (``try`` and ``can`` do not catch it).

    Functions raise it without a line; the evaluator fills in the expression it was evaluating."""

    def __init__(self, reason: str, line: int | None = None, expr: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.expr = expr


@dataclass(frozen=True)
class Size:
    """A value's size as written out: elements (scalars and collections), characters, depth."""

    elements: int
    chars: int
    depth: int


_SCALAR = Size(1, 0, 0)


@dataclass
class Budget:
    """What one evaluation has spent; every :class:`Evaluator` of a document shares one."""

    steps: int = 0
    nesting: int = 0
    elements: int = 0
    chars: int = 0
    read_bytes: int = 0
    fileset_entries: int = 0
    # id -> (the value, its size): a value is measured once, then each value holding it adds its
    # size in O(1). The value is kept here so its id cannot be reused while the evaluation runs.
    _sizes: dict[int, tuple[Any, Size]] = field(default_factory=dict)

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise LimitError(
                f"the job file needs more than {MAX_STEPS} expression evaluations (loops over loops); "
                "make the loops smaller"
            )

    def size(self, value: Any) -> Size:
        """The size of ``value`` written out, in time linear in its distinct parts (no recursion)."""
        if isinstance(value, str):
            return Size(1, len(value), 0)
        if not isinstance(value, list | dict):
            return _SCALAR
        sizes = self._sizes
        pending: list[tuple[Any, bool]] = [(value, False)]
        while pending:
            node, ready = pending.pop()
            if id(node) in sizes:
                continue
            items = list(node.values()) if isinstance(node, dict) else node
            if not ready:
                pending.append((node, True))
                pending.extend((c, False) for c in items if isinstance(c, list | dict) and id(c) not in sizes)
                continue
            elements, chars, depth = 1, sum(len(k) for k in node) if isinstance(node, dict) else 0, 0
            for child in items:
                if isinstance(child, str):
                    elements += 1
                    chars += len(child)
                elif isinstance(child, list | dict):
                    inner = sizes[id(child)][1]
                    elements += inner.elements
                    chars += inner.chars
                    depth = max(depth, inner.depth)
                else:
                    elements += 1
            sizes[id(node)] = (node, Size(elements, chars, depth + 1))
        return sizes[id(value)][1]

    def check(self, value: Any, what: str) -> Size:
        """Refuse a value too large or too deep for one value; ``what`` names it in the sentence."""
        size = self.size(value)
        if size.depth > MAX_VALUE_DEPTH:
            raise LimitError(f"{what} nests more than {MAX_VALUE_DEPTH} lists or maps deep; flatten it")
        if size.elements > MAX_VALUE_ELEMENTS:
            raise LimitError(
                f"{what} would hold {size.elements} elements, more than the {MAX_VALUE_ELEMENTS} one value may; "
                "make it smaller"
            )
        if size.chars > MAX_VALUE_CHARS or (isinstance(value, str) and size.chars > MAX_STRING_CHARS):
            cap = MAX_STRING_CHARS if isinstance(value, str) else MAX_VALUE_CHARS
            raise LimitError(f"{what} would be {size.chars} characters, more than the {cap} allowed; make it smaller")
        return size

    def charge(self, value: Any, what: str) -> None:
        """:meth:`check`, then count the value against what the whole evaluation may make."""
        size = self.check(value, what)
        self.elements += size.elements
        self.chars += size.chars
        if self.elements > MAX_TOTAL_ELEMENTS or self.chars > MAX_TOTAL_CHARS:
            raise LimitError(
                f"the job file's values add up to more than {MAX_TOTAL_ELEMENTS} elements or {MAX_TOTAL_CHARS} "
                "characters; make them smaller"
            )

    def read(self, size: int) -> None:
        self.read_bytes += size
        if self.read_bytes > MAX_READ_TOTAL_BYTES:
            raise LimitError(
                f"the file functions of this job read more than {MAX_READ_TOTAL_BYTES} bytes in all; read fewer files"
            )

    def listed(self, count: int) -> None:
        self.fileset_entries += count
        if self.fileset_entries > MAX_FILESET_ENTRIES:
            raise LimitError(
                f"fileset() looked at more than {MAX_FILESET_ENTRIES} directory entries; "
                "give it a smaller directory or a narrower pattern"
            )


def string_fits(length: int, what: str) -> None:
    """For functions that can work out a string's length before making it."""
    if length > MAX_STRING_CHARS:
        raise LimitError(
            f"{what} would be {length} characters, more than the {MAX_STRING_CHARS} allowed; make its inputs smaller"
        )


def elements_fit(count: int, what: str) -> None:
    """For functions that can work out a collection's size before making it."""
    if count > MAX_VALUE_ELEMENTS:
        raise LimitError(
            f"{what} would hold {count} elements, more than the {MAX_VALUE_ELEMENTS} allowed; make its inputs smaller"
        )


__all__ = ["Budget", "LimitError", "Size", "elements_fit", "string_fits"]
