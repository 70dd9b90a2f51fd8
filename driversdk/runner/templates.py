"""A small evaluator for the part of Nomad's ``template`` language a lone machine can answer.

Nomad renders templates with consul-template (Go's text/template plus Consul, Vault and Nomad
functions). Without servers only the task's own data is there, so this module evaluates a
subset, and says exactly which:

- text, and actions between the delimiters (``{{``/``}}`` or the template's
  ``left_delimiter``/``right_delimiter``), with Go's trim markers (``{{-`` and ``-}}``) and
  comments (``{{/* … */}}``);
- ``if`` / ``else if`` / ``else`` / ``end`` on a pipeline (empty string, 0, false and a missing
  value are false, as in Go);
- pipelines (``a | b``: the value on the left becomes the last argument of ``b``),
  parenthesised pipelines, string literals (``"…"`` with Go escapes, raw `` `…` ``), integers,
  ``true``/``false``;
- functions: ``env "X"`` (the task's environment), ``envOrDefault "X" "d"``, ``timestamp``
  (RFC 3339 UTC; ``timestamp "unix"`` for seconds), ``toLower``, ``toUpper``, ``toTitle``,
  ``trimSpace``, ``replaceAll "old" "new" s``, ``base64Encode``, ``base64Decode``, and Go's
  ``eq``, ``ne``, ``not``, ``and``, ``or``, ``len``, ``print``.

A template that calls a function needing a Consul, Vault or Nomad server (:data:`CLUSTER_FUNCTIONS`:
``key``, ``service``, ``secret``, ``nomadVar`` …) is not rendered by ``driversdk run``:
:func:`cluster_functions` finds them, so ``validate`` notes the template and ``run`` skips it with
a task event. Anything else outside the subset (``range``, ``with``, variables, other functions)
is a :class:`TemplateError` naming it.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from driversdk.errors import ConfigError

# consul-template functions that ask a Consul, Vault or Nomad server: no answer on one machine.
CLUSTER_FUNCTIONS = frozenset(
    {
        "key",
        "keyExists",
        "keyOrDefault",
        "ls",
        "safeLs",
        "tree",
        "safeTree",
        "service",
        "services",
        "connect",
        "connectCARoots",
        "connectLeaf",
        "caLeaf",
        "caRoots",
        "datacenters",
        "node",
        "nodes",
        "secret",
        "secrets",
        "pkiCert",
        "nomadVar",
        "nomadVarList",
        "nomadVarListSafe",
        "nomadVarExists",
        "nomadService",
        "nomadServices",
        "nomadSecureVariables",
        "executeTemplate",
    }
)


class TemplateError(ConfigError):
    """A template the evaluator cannot read or render; the sentence says where and why."""


# A rendered file never raises privileges: setuid and setgid are refused (the sticky bit means
# nothing on a regular file and is left alone).
PRIVILEGE_BITS = 0o6000


def perms_problem(perms: str, destination: str) -> str | None:
    """Why a template's ``perms`` are refused, or None: the setuid or setgid bit. Text that is not
    octal is not this check's to judge."""
    try:
        mode = int(perms, 8)
    except ValueError:
        return None
    if not mode & PRIVILEGE_BITS:
        return None
    return (
        f"perms {perms!r} of the template for {destination!r} set the setuid or setgid bit; templates write "
        f'plain files, so give perms without them (such as "{mode & 0o1777:04o}")'
    )


@dataclass
class _Text:
    text: str


@dataclass
class _Action:
    pipe: list[Any]


@dataclass
class _If:
    branches: list[tuple[list[Any], list[Any]]] = field(default_factory=list)  # (condition pipe, body)
    otherwise: list[Any] = field(default_factory=list)


_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<num>-?\d+)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)'
    r"|(?P<var>\$[A-Za-z0-9_]*)|(?P<punct>:=|[|().=,]))"
)


def _tokens(source: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(source):
        if source[pos:].strip() == "":
            break
        match = _TOKEN.match(source, pos)
        if match is None:
            raise TemplateError(f"unexpected {source[pos:].strip()[:20]!r} in action {{{{{source.strip()}}}}}")
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


def _unquote(text: str) -> str:
    if text.startswith("`"):
        return text[1:-1]
    try:
        value = text[1:-1].encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError):
        raise TemplateError(f"bad escape in string {text}") from None
    return value


def _split(text: str, left: str, right: str) -> list[tuple[bool, str]]:
    """(is_action, text) pieces, with trim markers applied to the neighbouring text."""
    pieces: list[tuple[bool, str]] = []
    pos = 0
    while True:
        start = text.find(left, pos)
        if start < 0:
            pieces.append((False, text[pos:]))
            break
        pieces.append((False, text[pos:start]))
        inner_start = start + len(left)
        end = text.find(right, inner_start)
        if end < 0:
            raise TemplateError(f"unclosed action: {left} at offset {start} has no {right}")
        inner = text[inner_start:end]
        if inner.startswith("- ") or inner == "-":
            pieces[-1] = (False, pieces[-1][1].rstrip())
            inner = inner[1:]
        pos = end + len(right)
        if inner.endswith(" -"):
            inner = inner[:-1]
            rest = text[pos:]
            pos += len(rest) - len(rest.lstrip())
        pieces.append((True, inner))
    return pieces


def parse(text: str, left: str = "{{", right: str = "}}") -> list[Any]:
    """The template's tree; TemplateError for what the subset does not read."""
    left, right = left or "{{", right or "}}"
    root: list[Any] = []
    stack: list[tuple[_If, list[Any]]] = []
    body = root
    for is_action, piece in _split(text, left, right):
        if not is_action:
            if piece:
                body.append(_Text(piece))
            continue
        stripped = piece.strip()
        if stripped.startswith("/*"):
            if not stripped.endswith("*/"):
                raise TemplateError(f"unclosed comment in {left}{piece}{right}")
            continue
        tokens = _tokens(piece)
        if not tokens:
            raise TemplateError(f"empty action {left}{piece}{right}")
        head = tokens[0][1] if tokens[0][0] == "ident" else ""
        if head == "if":
            node = _If()
            node.branches.append((_pipeline(tokens[1:], piece), []))
            body.append(node)
            stack.append((node, body))
            body = node.branches[-1][1]
        elif head == "else":
            if not stack:
                raise TemplateError(f"{left}else{right} without {left}if{right}")
            node = stack[-1][0]
            if len(tokens) > 1 and tokens[1] == ("ident", "if"):
                node.branches.append((_pipeline(tokens[2:], piece), []))
                body = node.branches[-1][1]
            elif len(tokens) == 1:
                body = node.otherwise
            else:
                raise TemplateError(f"unexpected {piece.strip()!r} after else")
        elif head == "end":
            if not stack:
                raise TemplateError(f"{left}end{right} without {left}if{right}")
            body = stack.pop()[1]
        elif head in ("range", "with", "define", "template", "block", "break", "continue"):
            raise TemplateError(f'"{head}" is not supported by driversdk run\'s templates')
        else:
            body.append(_Action(_pipeline(tokens, piece)))
    if stack:
        raise TemplateError(f"{left}if{right} without {left}end{right}")
    return root


def _pipeline(tokens: list[tuple[str, str]], source: str) -> list[Any]:
    """A pipeline as a list of commands; each command is a list of operands, an operand a
    ("str", value), ("int", n), ("bool", b), ("func", name) or ("pipe", pipeline)."""
    commands: list[list[Any]] = [[]]
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "punct" and text == "|":
            if not commands[-1]:
                raise TemplateError(f"missing command before | in {{{{{source.strip()}}}}}")
            commands.append([])
        elif kind == "punct" and text == "(":
            depth, j = 1, i + 1
            while j < len(tokens) and depth:
                depth += {"(": 1, ")": -1}.get(tokens[j][1], 0) if tokens[j][0] == "punct" else 0
                j += 1
            if depth:
                raise TemplateError(f"unclosed ( in {{{{{source.strip()}}}}}")
            commands[-1].append(("pipe", _pipeline(tokens[i + 1 : j - 1], source)))
            i = j
            continue
        elif kind in ("str", "raw"):
            commands[-1].append(("str", _unquote(text)))
        elif kind == "num":
            commands[-1].append(("int", int(text)))
        elif kind == "ident" and text in ("true", "false"):
            commands[-1].append(("bool", text == "true"))
        elif kind == "ident":
            commands[-1].append(("func", text))
        elif kind == "var" or text == ":=":
            raise TemplateError(f"variables ({text}) are not supported by driversdk run's templates")
        else:
            raise TemplateError(f"unexpected {text!r} in {{{{{source.strip()}}}}}")
        i += 1
    if not commands[-1]:
        raise TemplateError(f"missing value in {{{{{source.strip()}}}}}")
    return commands


def _walk_functions(nodes: list[Any]) -> list[str]:
    names: list[str] = []

    def pipe(p: list[Any]) -> None:
        for command in p:
            for kind, value in command:
                if kind == "func":
                    names.append(value)
                elif kind == "pipe":
                    pipe(value)

    for node in nodes:
        if isinstance(node, _Action):
            pipe(node.pipe)
        elif isinstance(node, _If):
            for cond, body in node.branches:
                pipe(cond)
                names.extend(_walk_functions(body))
            names.extend(_walk_functions(node.otherwise))
    return names


def cluster_functions(text: str, left: str = "{{", right: str = "}}") -> list[str]:
    """The functions of :data:`CLUSTER_FUNCTIONS` the template calls, sorted, each once. The
    text is scanned even when the subset cannot parse it (a ``range`` over ``service`` …)."""
    try:
        names = _walk_functions(parse(text, left, right))
    except TemplateError:
        names = [
            word
            for is_action, piece in _split_lenient(text, left or "{{", right or "}}")
            if is_action
            for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", piece)
        ]
    return sorted({n for n in names if n in CLUSTER_FUNCTIONS})


def _split_lenient(text: str, left: str, right: str) -> list[tuple[bool, str]]:
    try:
        return _split(text, left, right)
    except TemplateError:
        return [(True, text)]


def _truth(value: Any) -> bool:
    return value not in (None, "", 0, False) and not (isinstance(value, list | dict) and not value)


def _text(value: Any) -> str:
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _timestamp(now: Callable[[], float], *args: Any) -> str:
    moment = datetime.datetime.fromtimestamp(now(), tz=datetime.UTC)
    if not args:
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    if args[0] == "unix":
        return str(int(moment.timestamp()))
    layouts = {"2006-01-02T15:04:05Z07:00": "%Y-%m-%dT%H:%M:%SZ", "2006-01-02": "%Y-%m-%d",
               "15:04:05": "%H:%M:%S", "2006-01-02 15:04:05": "%Y-%m-%d %H:%M:%S"}  # fmt: skip
    if args[0] not in layouts:
        raise TemplateError(
            f'timestamp layout {args[0]!r} is not supported (use none, "unix" or one of {", ".join(layouts)})'
        )
    return moment.strftime(layouts[args[0]])


def _b64decode(value: str) -> str:
    try:
        return base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise TemplateError(f"base64Decode: {value[:40]!r} is not base64 of UTF-8 text") from None


class _Renderer:
    def __init__(self, env: Mapping[str, str], now: Callable[[], float]) -> None:
        self.env = env
        self.functions: dict[str, Callable[..., Any]] = {
            "env": lambda name: self.env.get(str(name), ""),
            "envOrDefault": lambda name, default: self.env.get(str(name)) or default,
            "timestamp": lambda *args: _timestamp(now, *args),
            "toLower": lambda s: str(s).lower(),
            "toUpper": lambda s: str(s).upper(),
            "toTitle": lambda s: str(s).title(),
            "trimSpace": lambda s: str(s).strip(),
            "replaceAll": lambda old, new, s: str(s).replace(str(old), str(new)),
            "base64Encode": lambda s: base64.b64encode(str(s).encode()).decode(),
            "base64Decode": lambda s: _b64decode(str(s)),
            "eq": lambda a, *bs: any(a == b for b in bs),
            "ne": lambda a, b: a != b,
            "not": lambda a: not _truth(a),
            "and": lambda *xs: next((x for x in xs if not _truth(x)), xs[-1]),
            "or": lambda *xs: next((x for x in xs if _truth(x)), xs[-1]),
            "len": lambda s: len(s),
            "print": lambda *xs: "".join(_text(x) for x in xs),
        }

    def pipe(self, pipeline: list[Any]) -> Any:
        value: Any = _NOTHING
        for command in pipeline:
            value = self.command(command, value)
        return value

    def command(self, command: list[Any], piped: Any) -> Any:
        kind, first = command[0]
        args = [self.operand(op) for op in command[1:]]
        if piped is not _NOTHING:
            args.append(piped)
        if kind != "func":
            if args:
                raise TemplateError(f"can't give arguments to a value ({_text(self.operand(command[0]))!r})")
            return self.operand(command[0])
        if first in CLUSTER_FUNCTIONS:
            raise TemplateError(f'function "{first}" needs a Consul, Vault or Nomad server; driversdk run has none')
        func = self.functions.get(first)
        if func is None:
            raise TemplateError(
                f'function "{first}" is not supported by driversdk run\'s templates (supported: '
                f"{', '.join(sorted(self.functions))})"
            )
        try:
            return func(*args)
        except TypeError:
            raise TemplateError(f'wrong number of arguments for "{first}" ({len(args)})') from None

    def operand(self, op: tuple[str, Any]) -> Any:
        kind, value = op
        if kind == "pipe":
            return self.pipe(value)
        if kind == "func":
            return self.command([op], _NOTHING)
        return value

    def nodes(self, nodes: list[Any], out: list[str]) -> None:
        for node in nodes:
            if isinstance(node, _Text):
                out.append(node.text)
            elif isinstance(node, _Action):
                out.append(_text(self.pipe(node.pipe)))
            else:
                for cond, body in node.branches:
                    if _truth(self.pipe(cond)):
                        self.nodes(body, out)
                        break
                else:
                    self.nodes(node.otherwise, out)


_NOTHING = object()


def render(
    text: str,
    env: Mapping[str, str],
    left: str = "{{",
    right: str = "}}",
    *,
    now: Callable[[], float] = time.time,
) -> str:
    """The template rendered with the task's environment; TemplateError says what failed."""
    out: list[str] = []
    _Renderer(env, now).nodes(parse(text, left, right), out)
    return "".join(out)


def parse_env(text: str) -> dict[str, str]:
    """An ``env = true`` template's output as variables: ``KEY=value`` lines (``export`` and
    quotes allowed, ``#`` comments and blank lines skipped), as Nomad reads them."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key):
            raise TemplateError(f"line {number} is not KEY=value: {line[:60]!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key] = value
    return out
