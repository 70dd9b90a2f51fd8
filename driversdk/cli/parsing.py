"""The CLI's argparse parser class: argparse's own, with a help formatter that does not import
``shutil``; and the argument types more than one command takes.

argparse makes a help formatter at each ``add_argument`` (to check the metavar), and the stock
formatter imports shutil (with zlib, bz2 and lzma) for the terminal's width: ~2 ms of a verb whose
whole round trip to the agent is ~15. The width here is the one shutil would find."""

from __future__ import annotations

import argparse
import os
import sys


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``: COLUMNS when it is a positive number, else stdout's
    terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
        columns = columns or 80
    return columns


class Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:  # fmt: skip
        super().__init__(prog, indent_increment, max_help_position, terminal_columns() - 2 if width is None else width)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser with :class:`Formatter`; its sub-parsers are Parsers too (argparse makes
    them of the parent's class)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def line_count(text: str) -> int:
    """An argparse ``type`` for ``-n N`` / ``--tail N``: a number of lines, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of lines (0 or more), not {text!r}")
    return value
