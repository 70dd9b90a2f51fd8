"""The parse tree the evaluator walks: python-hcl2's lark tree, copied into two small classes.

Why not walk lark's own ``Tree`` and ``Token``: importing lark and python-hcl2 and loading the
parser costs a command about 0.1 s, and a job file that has been parsed before need not pay it.
Its tree is kept on disk (:mod:`driversdk.jobspec.parsecache`) as plain JSON and read back into
these classes, which hold just what the evaluator reads: a rule's name, its children and where
it stands in the text; a token's type, text and line. Only a text never parsed before loads lark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from driversdk.errors import DriverSDKError

if TYPE_CHECKING:
    import lark


class Token(str):
    """A terminal: its text (the ``str`` itself), its terminal type and the line it starts on."""

    __slots__ = ("line", "type")
    type: str
    line: int

    def __new__(cls, type_: str, value: str, line: int) -> Token:
        token = super().__new__(cls, value)
        token.type = type_
        token.line = line
        return token

    def __repr__(self) -> str:
        return f"Token({self.type!r}, {str(self)!r})"


class Meta:
    """Where a rule's text stands; ``empty`` for a rule that matched no text."""

    __slots__ = ("end_pos", "line", "start_pos")

    def __init__(self, line: int, start_pos: int, end_pos: int) -> None:
        self.line = line
        self.start_pos = start_pos
        self.end_pos = end_pos

    @property
    def empty(self) -> bool:
        return self.start_pos < 0


class Tree:
    """A rule: its name (``data``), its children (trees and tokens) and its place in the text."""

    __slots__ = ("children", "data", "meta")

    def __init__(self, data: str, children: list[Tree | Token], meta: Meta) -> None:
        self.data = data
        self.children = children
        self.meta = meta

    def __repr__(self) -> str:
        return f"Tree({self.data!r}, {self.children!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Tree)
            and self.data == other.data
            and self.children == other.children
            and (self.meta.line, self.meta.start_pos, self.meta.end_pos)
            == (other.meta.line, other.meta.start_pos, other.meta.end_pos)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like lark's


_NO_META = (0, -1, -1)


def from_lark(node: lark.Tree[lark.Token]) -> Tree:
    """Copy a lark tree (with propagated positions) into these classes."""
    from lark import Tree as LarkTree  # loaded already: the tree comes from lark's parser

    meta = node.meta
    where = _NO_META if meta.empty else (int(meta.line), int(meta.start_pos), int(meta.end_pos))
    children: list[Tree | Token] = []
    for child in node.children:
        if isinstance(child, LarkTree):
            children.append(from_lark(child))
        else:  # a lark Token: a str with its type and position
            children.append(Token(str(child.type), str(child), int(child.line or 0)))
    return Tree(str(node.data), children, Meta(*where))


# On disk a tree is JSON: a rule is [name, line, start, end, children...], a token is
# [type, text, line]. Both are lists; a rule's second item is an int, a token's a str.
Plain: TypeAlias = list["str | int | Plain"]


def to_plain(node: Tree) -> Plain:
    out: Plain = [node.data, node.meta.line, node.meta.start_pos, node.meta.end_pos]
    for child in node.children:
        if isinstance(child, Tree):
            out.append(to_plain(child))
        else:
            out.append([child.type, str(child), child.line])
    return out


class TreeFormatError(DriverSDKError):
    """A stored tree that is not one this module wrote (the cache then parses afresh)."""


def from_plain(item: object) -> Tree:
    """The tree :func:`to_plain` wrote; TreeFormatError for anything else."""
    if not isinstance(item, list) or len(item) < 4:
        raise TreeFormatError("a rule is a list of at least four items")
    data, line, start, end = item[0], item[1], item[2], item[3]
    if not (isinstance(data, str) and type(line) is int and type(start) is int and type(end) is int):
        raise TreeFormatError("a rule starts with its name and three positions")
    children: list[Tree | Token] = []
    for child in item[4:]:
        if isinstance(child, list) and len(child) == 3 and isinstance(child[1], str):
            kind, text, at = child
            if not isinstance(kind, str) or type(at) is not int:
                raise TreeFormatError("a token is its type, its text and its line")
            children.append(Token(kind, text, at))
        else:
            children.append(from_plain(child))
    return Tree(data, children, Meta(line, start, end))
