"""Evaluate HCL2 expressions and bodies over python-hcl2's lark parse tree.

Why this approach: python-hcl2 (already a runner dependency) parses HCL2 faithfully, with line
positions, but it does not evaluate: its ``loads`` turns ``count = var.n`` into the string
``"${var.n}"``. No maintained Python library evaluates HCL2 (Terraform's and Nomad's evaluator
is Go's hcl/cty). So we keep python-hcl2's grammar and parser — one source of truth for the
syntax — and walk its raw lark tree (``hcl2.parser.parser()``) with this small evaluator, which
knows scopes (``var``, ``local``, iterators), functions, templates with ``%{ if }`` and
``%{ for }``, for-expressions, splats, conditionals and operators.

Which roots stay literal: jobspec2's evaluation context defines only ``var`` and ``local`` (plus
the names a for-expression or a ``dynamic`` iterator binds), and its ``UnknownVariable`` hook
turns any other root into the string ``"${" + expression + "}"``. So *every* other root —
``attr.kernel.name``, ``node.unique.id``, ``meta.rack``, ``env["HOME"]``, ``NOMAD_ALLOC_DIR``,
``NOMAD_META_x``, ``CSI_ENDPOINT``, ``device.attr.memory`` — evaluates to its own text, the whole
static traversal (attributes and literal indexes) included, for the client to interpolate at
run time. ``var.undeclared`` is an error, because ``var`` is known and has no such attribute.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from driversdk.errors import DriverSDKError
from driversdk.jobspec.hcl.functions import LAZY, Func, FunctionError
from driversdk.jobspec.hcl.tree import Token, Tree
from driversdk.jobspec.hcl.values import (
    ANY,
    BOOL,
    NUMBER,
    STRING,
    ConvertError,
    Type,
    Value,
    convert,
    to_bool,
    to_number,
    to_string,
    truthy,
    type_name,
)
from driversdk.jobspec.hcllimits import (
    MAX_CACHED_TEXT_BYTES,
    MAX_INT_BITS,
    MAX_NESTING,
    MAX_STRING_CHARS,
    MAX_TREE_DEPTH,
    Budget,
    LimitError,
)

if TYPE_CHECKING:
    import lark


class EvalError(DriverSDKError):
    """An expression that cannot be evaluated: where (line), which expression, and why."""

    def __init__(self, line: int, expr: str, reason: str) -> None:
        self.line = line
        self.expr = expr
        self.reason = reason
        super().__init__(f"line {line}: {reason}" + (f" (in {expr})" if expr else ""))


class Body(dict[str, Value]):
    """An evaluated block body: a dict, plus the line of the block and of each key."""

    line: int = 0

    def __init__(self, line: int = 0) -> None:
        super().__init__()
        self.line = line
        self.lines: dict[str, int] = {}

    def blocks(self, kind: str) -> list[Value]:
        """The list that holds this body's ``kind`` blocks, started on the first one. The caller
        has made sure ``kind`` names no argument here."""
        found = self.get(kind)
        if isinstance(found, list):
            return found
        started: list[Value] = []
        self[kind] = started
        return started


@dataclass
class Source:
    """One parsed text: its lark tree and the text, for the source of expressions."""

    text: str
    tree: Tree
    line_offset: int = 0


class HCLSyntaxError(DriverSDKError):
    """Text that is not HCL: what is wrong in HCL's terms (never the parser's token names), with
    the line and column of the offending text and that text."""

    def __init__(self, err: Exception, text: str = "") -> None:
        from driversdk.jobspec.hcl.syntax import describe

        facts = describe(err, text)
        super().__init__(facts.sentence())
        self.summary = facts.summary
        self.excerpt = facts.excerpt
        self.line: int | None = facts.line
        self.column: int | None = facts.column


def parse(text: str, *, keep: bool = False) -> Tree:
    """python-hcl2's parse tree of ``text``; HCLSyntaxError when it is not HCL.

    One process parses the same text more than once (``validate`` evaluates a job for its checks
    and again for placement; ``run`` validates, then starts): trees are kept by their text, which
    is the whole key. ``keep`` also keeps the tree on disk for the next command (a whole file:
    not worth it for the small texts a variable's value is). Trees are only ever read. Texts
    over MAX_CACHED_TEXT_BYTES are parsed each time and never kept: a cache must not hold a
    tree of hundreds of MB. A tree deeper than MAX_TREE_DEPTH is refused (LimitError)."""
    if len(text) > MAX_CACHED_TEXT_BYTES:
        return _parse_uncached(text, keep=False)
    return _parse_text(text, keep)


class _TreeCache:
    """The trees of the last texts parsed, newest last, their texts adding up to at most
    ``max_bytes`` (a tree in memory is up to ~700 bytes per byte of text)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.trees: OrderedDict[tuple[str, bool], Tree] = OrderedDict()
        self.size = 0
        self.lock = threading.Lock()

    def __call__(self, text: str, keep: bool) -> Tree:
        key = (text, keep)
        with self.lock:
            tree = self.trees.get(key)
            if tree is not None:
                self.trees.move_to_end(key)
                return tree
        tree = _parse_uncached(text, keep)
        with self.lock:
            if key not in self.trees:
                self.trees[key] = tree
                self.size += len(text)
            while self.size > self.max_bytes and len(self.trees) > 1:
                (old, _), _ = self.trees.popitem(last=False)
                self.size -= len(old)
        return tree

    def cache_clear(self) -> None:
        with self.lock:
            self.trees.clear()
            self.size = 0


_parse_text = _TreeCache(max_bytes=4 * MAX_CACHED_TEXT_BYTES)


def _parse_uncached(text: str, keep: bool) -> Tree:
    from driversdk.jobspec import parsecache

    if keep:
        stored = parsecache.read_tree(text)
        if stored is not None:
            return stored
    # python-hcl2's parser, built once per process and cached between processes.
    from lark.exceptions import LarkError

    from driversdk.jobspec.hcl.tree import from_lark

    try:
        parsed = parsecache.hcl2_parser().parse(text + "\n")
    except LarkError as err:
        raise HCLSyntaxError(err, text + "\n") from None
    _shallow_enough(parsed)
    tree = from_lark(parsed)
    if keep:
        parsecache.write_tree(text, tree)
    return tree


def _shallow_enough(root: lark.Tree[lark.Token]) -> None:
    """Refuse a lark tree deeper than MAX_TREE_DEPTH before anything walks it recursively."""
    from lark import Tree as LarkTree

    pending: list[tuple[LarkTree[lark.Token], int]] = [(root, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_TREE_DEPTH:
            meta = node.meta
            line = 0 if meta.empty else int(meta.line)
            raise LimitError(
                f"the expressions nest more than {MAX_TREE_DEPTH // 2} levels deep; flatten them", line=line
            )
        pending.extend((child, depth + 1) for child in node.children if isinstance(child, LarkTree))


def kids(node: Tree) -> list[Tree | Token]:
    """Children without newline/comment trees."""
    return [c for c in node.children if not (isinstance(c, Tree) and c.data == "new_line_or_comment")]


def trees(node: Tree) -> list[Tree]:
    return [c for c in kids(node) if isinstance(c, Tree)]


def name_of(node: Tree | Token) -> str:
    """An identifier, keyword or literal_value used as a name."""
    if isinstance(node, Token):
        return str(node)
    if node.data == "string":
        return "".join(_decode(str(p.children[0])) for p in trees(node) if isinstance(p.children[0], Token))
    return str(node.children[0])


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
_ESCAPE_RE = re.compile(r"\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.S)


def _decode(raw: str) -> str:
    def one(m: re.Match[str]) -> str:
        seq = m.group(1)
        if seq[0] in "uU" and len(seq) > 1:
            return chr(int(seq[1:], 16))
        return _ESCAPES.get(seq, "\\" + seq)

    return _ESCAPE_RE.sub(one, raw)


def line_of(node: Tree | Token) -> int:
    if isinstance(node, Token):
        return node.line or 0
    meta = getattr(node, "meta", None)
    return int(getattr(meta, "line", 0) or 0) if meta is not None and not meta.empty else 0


class Scope:
    """Names visible to an expression: ``var``, ``local`` and iterators; functions by name."""

    def __init__(self, variables: dict[str, Value], functions: Mapping[str, Func]) -> None:
        self.variables = variables
        self.functions = functions

    def child(self, **names: Value) -> Scope:
        return Scope({**self.variables, **names}, self.functions)


class Evaluator:
    def __init__(self, source: Source, budget: Budget | None = None) -> None:
        self.source = source
        self.budget = budget if budget is not None else Budget()

    # --- helpers ---------------------------------------------------------------------------------

    def text(self, node: Tree | Token) -> str:
        """An expression's source text; for a block its header, for an argument its name."""
        if isinstance(node, Token):
            return str(node)
        if node.data == "block":
            parts = [p for p in trees(node) if p.data != "body"]
            return " ".join([name_of(parts[0]), *(f'"{name_of(p)}"' for p in parts[1:])])
        if node.data == "attribute":
            return name_of(trees(node)[0])
        meta = node.meta
        if meta.empty:
            return ""
        return " ".join(self.source.text[meta.start_pos : meta.end_pos].split())

    def line(self, node: Tree | Token) -> int:
        return line_of(node) + self.source.line_offset

    def fail(self, node: Tree | Token, reason: str) -> EvalError:
        return EvalError(self.line(node), self.text(node), reason)

    def over(self, node: Tree | Token, err: LimitError) -> LimitError:
        """``err`` with the line and expression of ``node`` when it has none yet."""
        if err.line is None:
            return LimitError(err.reason, self.line(node), self.text(node))
        return err

    # --- expressions -----------------------------------------------------------------------------

    def value(self, node: Tree | Token, scope: Scope) -> Value:
        if isinstance(node, Token):
            raise self.fail(node, f"unexpected {node.type}")
        method = getattr(self, "e_" + node.data, None)
        if method is None:
            raise self.fail(node, f"expression {node.data!r} is not supported")
        budget = self.budget
        try:
            budget.step()
        except LimitError as err:
            raise self.over(node, err) from None
        budget.nesting += 1
        try:
            if budget.nesting > MAX_NESTING:
                raise self.over(node, LimitError(f"expressions nest more than {MAX_NESTING} deep; flatten them"))
            result: Value = method(node, scope)
            return result
        finally:
            budget.nesting -= 1

    def e_expr_term(self, node: Tree, scope: Scope) -> Value:
        inner = trees(node)
        return self.value(inner[0], scope)

    def e_identifier(self, node: Tree, scope: Scope) -> Value:
        name = str(node.children[0])
        if name in scope.variables:
            return scope.variables[name]
        return "${" + name + "}"

    def e_keyword(self, node: Tree, scope: Scope) -> Value:
        return self.e_identifier(node, scope)

    def e_literal_value(self, node: Tree, scope: Scope) -> bool | None:
        return {"true": True, "false": False, "null": None}[str(node.children[0])]

    def e_int_lit(self, node: Tree, scope: Scope) -> int | float:
        try:
            return self.bounded(int(str(node.children[0])), node)
        except ValueError:  # more digits than Python converts
            raise self.over(node, LimitError(f"the number has more than {MAX_INT_BITS} bits")) from None

    def bounded(self, n: int | float, node: Tree) -> int | float:
        """A number within MAX_INT_BITS: products of products of locals would grow without end."""
        if isinstance(n, int) and not isinstance(n, bool) and n.bit_length() > MAX_INT_BITS:
            raise self.over(node, LimitError(f"the number has more than {MAX_INT_BITS} bits; use smaller numbers"))
        return n

    def e_float_lit(self, node: Tree, scope: Scope) -> int | float:
        number = float(str(node.children[0]))
        return int(number) if number.is_integer() and abs(number) < 2**63 else number

    def e_tuple(self, node: Tree, scope: Scope) -> list[Value]:
        return [self.value(c, scope) for c in trees(node)]

    def e_object(self, node: Tree, scope: Scope) -> dict[str, Value]:
        out: dict[str, Value] = {}
        for elem in trees(node):
            key_node, value_node = trees(elem)
            key = self.object_key(key_node, scope)
            out[key] = self.value(value_node, scope)
        return out

    def object_key(self, key_node: Tree, scope: Scope) -> str:
        inner = trees(key_node)[0] if trees(key_node) else key_node.children[0]
        if isinstance(inner, Tree) and inner.data == "keyword":
            return str(inner.children[0])
        # A bare name is the key itself; anything else (string, parenthesised) is evaluated.
        if isinstance(inner, Tree) and inner.data == "expr_term":
            only = kids(inner)
            if len(only) == 1 and isinstance(only[0], Tree) and only[0].data in ("identifier", "literal_value"):
                return str(only[0].children[0])
        key = self.value(inner, scope)
        try:
            return to_string(key)
        except ConvertError as err:
            raise self.fail(key_node, f"an object key must be a string: {err}") from None

    def e_conditional(self, node: Tree, scope: Scope) -> Value:
        cond, yes, no = trees(node)
        try:
            chosen = truthy(self.value(cond, scope))
        except ConvertError as err:
            raise self.fail(cond, f"the condition is not a bool: {err}") from None
        return self.value(yes if chosen else no, scope)

    def e_unary_op(self, node: Tree, scope: Scope) -> Value:
        op = next(c for c in node.children if isinstance(c, Token))
        value = self.value(trees(node)[0], scope)
        try:
            if op.type == "NOT":
                return not to_bool(value)
            return -to_number(value)
        except ConvertError as err:
            raise self.fail(node, f"invalid operand: {err}") from None

    def e_binary_op(self, node: Tree, scope: Scope) -> Value:
        lhs_node, term = trees(node)[:2]
        op_node, rhs_node = trees(term)
        op = next(c for c in op_node.children if isinstance(c, Token)).type
        lhs = self.value(lhs_node, scope)
        if op == "DOUBLE_AMP" or op == "DOUBLE_PIPE":
            try:
                left = to_bool(lhs)
                right = to_bool(self.value(rhs_node, scope))
            except ConvertError as err:
                raise self.fail(node, f"invalid operand: {err}") from None
            return (left and right) if op == "DOUBLE_AMP" else (left or right)
        rhs = self.value(rhs_node, scope)
        if op in ("DOUBLE_EQ", "NEQ"):
            try:  # comparing two large values element by element is the cost of their size
                self.budget.check(lhs, "the left operand")
                self.budget.check(rhs, "the right operand")
            except LimitError as err:
                raise self.over(node, err) from None
        if op == "DOUBLE_EQ":
            return _equal(lhs, rhs)
        if op == "NEQ":
            return not _equal(lhs, rhs)
        try:
            a, b = to_number(lhs), to_number(rhs)
        except ConvertError as err:
            raise self.fail(node, f"invalid operand: {err}") from None
        if op == "LT":
            return a < b
        if op == "GT":
            return a > b
        if op == "LEQ":
            return a <= b
        if op == "GEQ":
            return a >= b
        if op == "PLUS":
            return self.bounded(_tidy(a + b), node)
        if op == "MINUS":
            return self.bounded(_tidy(a - b), node)
        if op == "ASTERISK":
            return self.bounded(_tidy(a * b), node)
        if b == 0:
            raise self.fail(node, "division by zero")
        if op == "SLASH":
            return _tidy(a / b)
        return _tidy(math.fmod(a, b))

    # --- traversals ------------------------------------------------------------------------------

    def _root(self, node: Tree) -> Tree | None:
        """The root identifier of a static traversal (attributes and literal indexes), or None."""
        while True:
            if node.data == "expr_term":
                inner = kids(node)
                if len(inner) != 1 or not isinstance(inner[0], Tree):
                    return None
                node = inner[0]
            elif node.data == "identifier":
                return node
            elif node.data == "get_attr_expr_term":
                node = trees(node)[0]
            elif node.data == "index_expr_term":
                base, index = trees(node)
                if index.data == "braces_index" and not _literal(trees(index)[0]):
                    return None
                node = base
            else:
                return None

    def _unknown_root(self, node: Tree, scope: Scope) -> str | None:
        root = self._root(node)
        if root is not None and str(root.children[0]) not in scope.variables:
            return "${" + self.text(node) + "}"
        return None

    def e_get_attr_expr_term(self, node: Tree, scope: Scope) -> Value:
        literal = self._unknown_root(node, scope)
        if literal is not None:
            return literal
        base_node, attr = trees(node)
        base = self.value(base_node, scope)
        root = self._root(base_node)
        if root is base_node or (root is not None and self.text(base_node) == str(root.children[0])):
            name = name_of(trees(attr)[0])
            kind = {"var": "variable", "local": "local value"}.get(str(root.children[0]) if root else "")
            if kind and isinstance(base, dict) and name not in base:
                hint = _did_you_mean(name, base) or (
                    f'; declare it: variable "{name}" {{ … }}' if kind == "variable" else "; define it in locals { … }"
                )
                raise self.fail(node, f'there is no {kind} named "{name}"{hint}')
        return self.get_attr(base, attr, node)

    def get_attr(self, base: Value, attr: Tree, where: Tree) -> Value:
        name = name_of(trees(attr)[0])
        if isinstance(base, dict):
            if name not in base:
                raise self.fail(where, f'there is no attribute named "{name}"{_did_you_mean(name, base)}')
            return base[name]
        if base is None:
            raise self.fail(where, f'cannot read attribute "{name}" of null')
        raise self.fail(where, f'cannot read attribute "{name}" of a {type_name(base)}')

    def e_index_expr_term(self, node: Tree, scope: Scope) -> Value:
        literal = self._unknown_root(node, scope)
        if literal is not None:
            return literal
        base_node, index = trees(node)
        return self.index(self.value(base_node, scope), index, scope, node)

    def index(self, base: Value, index: Tree, scope: Scope, where: Tree) -> Value:
        if index.data == "short_index":
            key: Value = int(str(index.children[-1]))
        else:
            key = self.value(trees(index)[0], scope)
        if isinstance(base, list):
            try:
                i = to_number(key)
            except ConvertError:
                raise self.fail(where, f"a list index must be a number, not {type_name(key)}") from None
            if not float(i).is_integer() or not 0 <= int(i) < len(base):
                raise self.fail(where, f"index {i} is out of range for a list of {len(base)} element(s)")
            return base[int(i)]
        if isinstance(base, dict):
            try:
                k = to_string(key)
            except ConvertError:
                raise self.fail(where, f"a map key must be a string, not {type_name(key)}") from None
            if k not in base:
                raise self.fail(where, f'the key "{k}" does not identify an element of this map')
            return base[k]
        raise self.fail(where, f"cannot index a {type_name(base)}")

    def _splat(self, node: Tree, scope: Scope) -> list[Value]:
        base_node, splat = trees(node)
        base = self.value(base_node, scope)
        items = base if isinstance(base, list) else ([] if base is None else [base])
        out = []
        for item in items:
            value = item
            for step in trees(splat):
                value = (
                    self.get_attr(value, step, node)
                    if step.data == "get_attr"
                    else self.index(value, step, scope, node)
                )
            out.append(value)
        return out

    e_attr_splat_expr_term = _splat
    e_full_splat_expr_term = _splat

    # --- functions -------------------------------------------------------------------------------

    def e_function_call(self, node: Tree, scope: Scope) -> Value:
        parts = kids(node)
        names = [p for p in parts if isinstance(p, Tree) and p.data == "identifier"]
        name = "::".join(str(n.children[0]) for n in names)
        args_node = next((p for p in parts if isinstance(p, Tree) and p.data == "arguments"), None)
        arg_nodes = trees(args_node) if args_node is not None else []
        expand = args_node is not None and any(
            isinstance(c, Token) and c.type == "ELLIPSIS" for c in args_node.children
        )
        if name in LAZY:
            return self.lazy(name, node, arg_nodes, scope)
        func = scope.functions.get(name)
        if func is None:
            from difflib import get_close_matches

            close = get_close_matches(name, list(scope.functions), n=1)
            hint = f'; did you mean "{close[0]}"?' if close else ""
            raise self.fail(node, f'there is no function named "{name}"{hint}')
        args: list[Value | Type]
        if name == "convert":
            # Its second argument is a type expression (list(number)), read as one and never
            # evaluated, as HCL's typeexpr does: list(…) is no function.
            if len(arg_nodes) != 2 or expand:
                raise self.fail(node, "convert() takes a value and a type, as convert(x, list(number))")
            args = [self.value(arg_nodes[0], scope), type_expr(arg_nodes[1], self)]
        else:
            args = [self.value(a, scope) for a in arg_nodes]
        if expand:
            if not args or not isinstance(args[-1], list):
                raise self.fail(node, "the last argument before ... must be a list")
            args = [*args[:-1], *args[-1]]
        try:
            # Every function walks or copies its arguments: their size (as written out) is
            # checked first, so no function ever walks a value built of shared parts at length.
            self.budget.check(args, f"the arguments of {name}()")
            result = func(*args)
            self.budget.charge(result, f"the result of {name}()")
            return result
        except LimitError as err:
            raise self.over(node, err) from None
        except RecursionError:
            raise self.over(node, LimitError(f"{name}() met a value nested too deeply; flatten it")) from None
        except FunctionError as err:
            raise self.fail(node, f"{name}(): {err}") from None
        except TypeError:
            raise self.fail(node, f"{name}() was called with {len(args)} argument(s), which it does not take") from None
        except (ValueError, OverflowError, ArithmeticError) as err:
            raise self.fail(node, f"{name}(): {err}") from None

    def lazy(self, name: str, node: Tree, arg_nodes: list[Tree], scope: Scope) -> Value:
        if name == "can":
            if len(arg_nodes) != 1:
                raise self.fail(node, "can() takes exactly one argument")
            try:
                self.value(arg_nodes[0], scope)
                return True
            except EvalError:
                return False
        last: EvalError | None = None
        for arg in arg_nodes:
            try:
                return self.value(arg, scope)
            except EvalError as err:
                last = err
        raise self.fail(node, f"try(): no argument could be evaluated ({last.reason if last else 'none given'})")

    # --- for expressions -------------------------------------------------------------------------

    def _for(self, node: Tree, scope: Scope) -> Iterator[tuple[Scope, list[Tree]]]:
        parts = trees(node)
        intro = parts[0]
        names = [str(t.children[0]) for t in trees(intro) if t.data == "identifier"]
        collection_node = [t for t in trees(intro) if t.data != "identifier"][-1]
        collection = self.value(collection_node, scope)
        cond = next((p for p in parts if p.data == "for_cond"), None)
        body = [p for p in parts[1:] if p.data != "for_cond"]
        if isinstance(collection, dict):
            pairs: list[tuple[str | int, Value]] = [*sorted(collection.items())]
        elif isinstance(collection, list):
            pairs = list(enumerate(collection))
        else:
            raise self.fail(collection_node, f"a for expression needs a list or map, not {type_name(collection)}")
        for key, item in pairs:
            inner = scope.child(**({names[0]: key, names[1]: item} if len(names) == 2 else {names[0]: item}))
            if cond is not None:
                try:
                    keep = truthy(self.value(trees(cond)[0], inner))
                except ConvertError as err:
                    raise self.fail(cond, f"the if condition is not a bool: {err}") from None
                if not keep:
                    continue
            yield inner, body

    def e_for_tuple_expr(self, node: Tree, scope: Scope) -> list[Value]:
        return [self.value(body[0], inner) for inner, body in self._for(node, scope)]

    def e_for_object_expr(self, node: Tree, scope: Scope) -> dict[str, Value]:
        group = any(isinstance(c, Token) and c.type == "ELLIPSIS" for c in node.children)
        out: dict[str, Value] = {}
        groups: dict[str, list[Value]] = {}  # with ``...``: every value of a key, in order
        for inner, body in self._for(node, scope):
            try:
                key = to_string(self.value(body[0], inner))
            except ConvertError as err:
                raise self.fail(body[0], f"an object key must be a string: {err}") from None
            value = self.value(body[1], inner)
            if group:
                groups.setdefault(key, []).append(value)
            elif key in out:
                raise self.fail(node, f'duplicate object key "{key}"; add ... after the value to group them')
            else:
                out[key] = value
        return {**groups} if group else out

    # --- templates -------------------------------------------------------------------------------

    def e_string(self, node: Tree, scope: Scope) -> Value:
        parts = [p.children[0] for p in trees(node)]
        return self.template(parts, scope, node)

    def e_template_string(self, node: Tree, scope: Scope) -> str:
        raw = str(node.children[0])
        return _decode(raw[2:-2])

    def e_interpolation(self, node: Tree, scope: Scope) -> Value:
        return self.value(trees(node)[0], scope)

    def template(self, parts: list[Tree | Token], scope: Scope, node: Tree) -> Value:
        """A quoted string's parts: literal text tokens and interpolation/directive trees."""
        items = [p for p in parts]
        if len(items) == 1 and isinstance(items[0], Tree) and items[0].data == "interpolation":
            # "${x}" alone keeps x's type, as HCL does.
            return self.value(items[0], scope)
        tree = _nest(items, self, node)
        text = self.render(tree, scope, node)
        try:  # a new string: counted against what the whole evaluation may make
            self.budget.charge(text, "the template")
        except LimitError as err:
            raise self.over(node, err) from None
        return text

    def render(self, nodes: list[_Piece], scope: Scope, node: Tree) -> str:
        out: list[str] = []
        length = 0

        def add(piece: str) -> None:
            nonlocal length
            out.append(piece)
            length += len(piece)
            if length > MAX_STRING_CHARS:  # a %{for} over a large value, or large values repeated
                raise self.over(node, LimitError(f"the template would be more than {MAX_STRING_CHARS} characters"))

        for item in nodes:
            if isinstance(item, _Lit):
                add(item.text)
            elif isinstance(item, _Interp):
                value = self.value(item.expr, scope)
                add(self.stringify(value, item.expr))
            elif isinstance(item, _If):
                try:
                    chosen = truthy(self.value(item.cond, scope))
                except ConvertError as err:
                    raise self.fail(item.cond, f"the %{{if}} condition is not a bool: {err}") from None
                add(self.render(item.yes if chosen else item.no, scope, node))
            else:
                names, coll_node, body = item.names, item.collection, item.body
                coll = self.value(coll_node, scope)
                if isinstance(coll, dict):
                    pairs: list[tuple[str | int, Value]] = [*sorted(coll.items())]
                elif isinstance(coll, list):
                    pairs = list(enumerate(coll))
                else:
                    raise self.fail(coll_node, f"%{{for}} needs a list or map, not {type_name(coll)}")
                for key, value in pairs:
                    bound: dict[str, Value] = {names[0]: key, names[1]: value} if len(names) == 2 else {names[0]: value}
                    add(self.render(body, scope.child(**bound), node))
        return _apply_strips("".join(out))

    def stringify(self, value: Value, node: Tree | Token) -> str:
        if value is None:
            raise self.fail(node, "the value is null, which cannot be part of a string")
        try:
            return to_string(value)
        except ConvertError:
            raise self.fail(
                node, f"a {type_name(value)} cannot be part of a string; use jsonencode() or join()"
            ) from None

    def e_heredoc_template(self, node: Tree, scope: Scope) -> Value:
        return self.heredoc(node, scope, trim=False)

    def e_heredoc_template_trim(self, node: Tree, scope: Scope) -> Value:
        return self.heredoc(node, scope, trim=True)

    def heredoc(self, node: Tree, scope: Scope, *, trim: bool) -> Value:
        raw = str(node.children[0])
        first_nl = raw.index("\n")
        lines = raw[first_nl + 1 :].split("\n")
        # The last two pieces are the closing marker line and the empty text after its newline.
        body_lines = lines[:-2] if len(lines) >= 2 else []
        if trim:
            indents = [len(line) - len(line.lstrip(" \t")) for line in body_lines if line.strip()]
            cut = min(indents) if indents else 0
            body_lines = [line[cut:] for line in body_lines]
        body = "".join(line + "\n" for line in body_lines)
        if "${" not in body and "%{" not in body:
            return body
        quoted = heredoc_as_string(body)
        start_line = self.line(node)  # the body starts on the next line
        try:
            sub = Source(f"_ = {quoted}\n", parse(f"_ = {quoted}\n"), start_line)
        except HCLSyntaxError as err:
            raise self.fail(node, f"the heredoc's template is not valid HCL ({str(err).splitlines()[0]})") from None
        attr = trees(trees(sub.tree)[0])[0]
        expr = trees(attr)[-1]
        evaluator = type(self)(sub, self.budget)
        value = evaluator.value(expr, scope)
        return value if isinstance(value, str) else evaluator.stringify(value, expr)


def _tidy(n: int | float) -> int | float:
    if isinstance(n, float) and n.is_integer() and abs(n) < 2**63:
        return int(n)
    return n


def _equal(a: Value, b: Value) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if type_name(a) != type_name(b):
        return False
    return bool(a == b)


def _literal(node: Tree) -> bool:
    """A literal index key (number or plain string), which keeps a traversal static."""
    if node.data == "expr_term":
        inner = kids(node)
        return len(inner) == 1 and isinstance(inner[0], Tree) and _literal(inner[0])
    if node.data in ("int_lit", "float_lit"):
        return True
    if node.data == "string":
        return all(isinstance(p.children[0], Token) for p in trees(node))
    return False


def _did_you_mean(name: str, options: dict[str, Value]) -> str:
    from difflib import get_close_matches

    close = get_close_matches(name, [str(k) for k in options], n=1)
    return f'; did you mean "{close[0]}"?' if close else ""


_STRIP_LEFT = "\x00<strip-left>\x00"
_STRIP_RIGHT = "\x00<strip-right>\x00"


def _apply_strips(text: str) -> str:
    text = re.sub(r"\s*" + re.escape(_STRIP_LEFT), "", text)
    return re.sub(re.escape(_STRIP_RIGHT) + r"\s*", "", text)


@dataclass
class _Lit:
    """Literal text of a template (or a strip marker, removed with the space beside it)."""

    text: str


@dataclass
class _Interp:
    """``${expr}``: the expression's value, as a string."""

    expr: Tree


@dataclass
class _If:
    """``%{if cond}yes%{else}no%{endif}``."""

    cond: Tree
    yes: list[_Piece] = field(default_factory=list)
    no: list[_Piece] = field(default_factory=list)


@dataclass
class _For:
    """``%{for names in collection}body%{endfor}``."""

    names: list[str]
    collection: Tree
    body: list[_Piece] = field(default_factory=list)


_Piece: TypeAlias = _Lit | _Interp | _If | _For


def _nest(items: list[Tree | Token], ev: Evaluator, node: Tree) -> list[_Piece]:
    """Flat template parts → nested (lit / interp / if / for) pieces."""
    root: list[_Piece] = []
    # Open directives, innermost last: which, where its text goes now, and the %{if} it belongs to.
    stack: list[tuple[str, list[_Piece], _If | None]] = [("root", root, None)]

    def strips(directive: Tree) -> tuple[bool, bool]:
        toks = [c for c in directive.children if isinstance(c, Token)]
        left = len(toks) > 1 and toks[1].type == "STRIP_MARKER"
        right = len(toks) > 1 and toks[-2].type == "STRIP_MARKER"
        return left, right

    def emit_strips(target: list[_Piece], directive: Tree, before: bool) -> None:
        left, right = strips(directive)
        if before and left:
            target.append(_Lit(_STRIP_LEFT))
        if not before and right:
            target.append(_Lit(_STRIP_RIGHT))

    for part in items:
        current = stack[-1][1]
        if isinstance(part, Token):
            raw = str(part)
            if part.type == "ESCAPED_INTERPOLATION" or part.type == "ESCAPED_DIRECTIVE":
                current.append(_Lit(raw[1:]))
            else:
                current.append(_Lit(_decode(raw)))
            continue
        kind = part.data
        if kind == "interpolation":
            current.append(_Interp(trees(part)[0]))
        elif kind == "template_if_start":
            emit_strips(current, part, True)
            branch = _If(trees(part)[0])
            current.append(branch)
            stack.append(("if", branch.yes, branch))
            emit_strips(branch.yes, part, False)
        elif kind == "template_else":
            if stack[-1][0] != "if":
                raise ev.fail(node, "%{else} without a matching %{if}")
            emit_strips(current, part, True)
            _, _, opened = stack.pop()
            if opened is not None:  # always: an "if" entry holds its _If
                stack.append(("else", opened.no, opened))
                emit_strips(opened.no, part, False)
        elif kind == "template_endif":
            if stack[-1][0] not in ("if", "else"):
                raise ev.fail(node, "%{endif} without a matching %{if}")
            emit_strips(current, part, True)
            stack.pop()
            emit_strips(stack[-1][1], part, False)
        elif kind == "template_for_start":
            emit_strips(current, part, True)
            names = [str(t.children[0]) for t in trees(part) if t.data == "identifier"]
            coll = [t for t in trees(part) if t.data != "identifier"][-1]
            loop = _For(names, coll)
            current.append(loop)
            stack.append(("for", loop.body, None))
            emit_strips(loop.body, part, False)
        elif kind == "template_endfor":
            if stack[-1][0] != "for":
                raise ev.fail(node, "%{endfor} without a matching %{for}")
            emit_strips(current, part, True)
            stack.pop()
            emit_strips(stack[-1][1], part, False)
    if len(stack) != 1:
        raise ev.fail(node, f"%{{{stack[-1][0]}}} is not closed")
    return root


def heredoc_as_string(body: str) -> str:
    """A heredoc body as an equivalent quoted HCL string: literal text escaped, templates kept."""
    out = ['"']
    i = 0
    n = len(body)
    while i < n:
        if body.startswith(("$${", "%%{"), i):
            out.append(body[i : i + 3])
            i += 3
            continue
        if body.startswith(("${", "%{"), i):
            end = _template_end(body, i + 2)
            out.append(body[i:end])
            i = end
            continue
        ch = body[i]
        out.append({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, ch))
        i += 1
    out.append('"')
    return "".join(out)


def _template_end(text: str, i: int) -> int:
    """Index just after the ``}`` closing a template sequence whose body starts at ``i``."""
    depth = 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


# --- type expressions ----------------------------------------------------------------------------

_PRIMITIVES: dict[str, Type] = {"string": STRING, "number": NUMBER, "bool": BOOL, "any": ANY}
_TYPE_FORMS = "string, number, bool, any, list(T), set(T), map(T), tuple([T, …]) or object({name = T, …})"


def type_expr(node: Tree, ev: Evaluator) -> Type:
    """A ``type = …`` constraint: string, number, bool, any, list(T), set(T), map(T), tuple([…]),
    object({…})."""
    if node.data == "expr_term":
        inner = trees(node)
        if len(inner) == 1:
            return type_expr(inner[0], ev)
    if node.data == "identifier":
        name = str(node.children[0])
        if name in _PRIMITIVES:
            return _PRIMITIVES[name]
        raise ev.fail(node, f'"{name}" is not a type; use string, number, bool, any, list(…), map(…) or object({{…}})')
    if node.data == "function_call":
        name = str(trees(node)[0].children[0])
        args_node = next((p for p in trees(node) if p.data == "arguments"), None)
        args = trees(args_node) if args_node is not None else []
        if name in ("list", "set", "map") and len(args) == 1:
            return (name, type_expr(args[0], ev))
        if name == "tuple" and len(args) == 1:
            elems = trees(args[0])
            if elems and elems[0].data == "tuple":
                return ("tuple", [type_expr(e, ev) for e in trees(elems[0])])
        if name == "object" and len(args) == 1:
            elems = trees(args[0])
            if elems and elems[0].data == "object":
                attrs = {}
                for elem in trees(elems[0]):
                    key_node, value_node = trees(elem)
                    attrs[ev.object_key(key_node, Scope({}, {}))] = type_expr(value_node, ev)
                return ("object", attrs)
        if name not in ("list", "set", "map", "tuple", "object"):
            raise ev.fail(node, f'"{name}" is not a type; use {_TYPE_FORMS}')
    raise ev.fail(node, f"this is not a type constraint; use {_TYPE_FORMS}")


def convert_or_fail(value: Value, t: Type, ev: Evaluator, node: Tree | Token, what: str) -> Value:
    try:
        return convert(value, t)
    except ConvertError as err:
        raise ev.fail(node, f"{what}: {err}") from None


__all__ = ["Body", "EvalError", "Evaluator", "Scope", "Source", "json", "parse", "type_expr"]
