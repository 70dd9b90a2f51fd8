"""A small evaluator for the part of Nomad's ``template`` language a lone machine can answer.

Nomad renders templates with consul-template (Go's text/template plus Consul, Vault and Nomad
functions). Without servers only the task's own data is there, so this module evaluates a
subset, and says exactly which:

- text, and actions between the delimiters (``{{``/``}}`` or the template's
  ``left_delimiter``/``right_delimiter``), with Go's trim markers (``{{-`` and ``-}}``) and
  comments (``{{/* … */}}``);
- ``if`` / ``else if`` / ``else`` / ``end`` on a pipeline (empty string, 0, false, an empty list
  or map and a missing value are false, as in Go); ``with`` (the dot becomes its value) with
  ``else`` / ``else with``; ``range`` over a list, a map (in key order) or an integer, with
  ``else``, ``break`` and ``continue``;
- variables as in Go: ``{{ $x := p }}`` declares in the current scope, ``{{ $x = p }}`` assigns
  the nearest, a scope ends at its ``{{ end }}``, ``range $i, $e := p`` / ``range $e := p``,
  ``$`` is the data root; a variable used before it is declared is refused when parsing, as Go
  does;
- the dot: the element in ``range``, the value in ``with``, and at the top nil, because
  consul-template executes every template with nil data (``{{ . }}`` prints ``<no value>``,
  ``{{ printf "%#v" . }}`` prints ``<nil>``); ``.Field`` / ``$x.Field`` read a map's key;
- pipelines (``a | b``: the value on the left becomes the last argument of ``b``),
  parenthesised pipelines, string literals (``"…"`` with Go escapes, raw `` `…` ``), integers,
  ``true``/``false``/``nil``;
- functions: ``env "X"`` (the task's environment), ``envOrDefault "X" "d"``, ``timestamp``
  (RFC 3339 UTC; ``timestamp "unix"`` for seconds), ``toLower``, ``toUpper``, ``toTitle``,
  ``trimSpace``, ``replaceAll "old" "new" s``, ``base64Encode``, ``base64Decode``, ``split``,
  ``join``, ``parseJSON``, and Go's ``eq``, ``ne``, ``not``, ``and``, ``or``, ``len``, ``index``,
  ``print``, ``println``, ``printf`` (verbs ``%v %#v %s %d %q %t %x %f``);
- go-sockaddr's functions on this node's interfaces (:mod:`driversdk.jobspec.sockaddr`):
  ``GetAllInterfaces``, ``GetDefaultInterfaces``, ``GetPrivateInterfaces``,
  ``GetPublicInterfaces``, ``GetPrivateIP(s)``, ``GetPublicIP(s)``, ``GetInterfaceIP(s)``, the
  helpers ``attr``, ``include``, ``exclude``, ``sort``, ``limit``, ``offset``, ``reverse``,
  ``unique``, ``join "attr" "sep"``, and consul-template's ``sockaddr "GetPrivateIP"`` form.

A template that calls a function needing a Consul, Vault or Nomad server (:data:`CLUSTER_FUNCTIONS`:
``key``, ``service``, ``secret``, ``nomadVar`` …) is not rendered by ``driversdk run``:
:func:`cluster_functions` finds them, so ``validate`` notes the template and ``run`` skips it with
a task event. Anything else outside the subset (``define``/``template``/``block``, method calls,
other functions) is a :class:`TemplateError` naming it.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from driversdk.errors import ConfigError, DriverSDKError
from driversdk.jobspec import sockaddr

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
class _Cond:
    """A control pipeline, with the variables it declares (``:=``) or assigns (``=``)."""

    pipe: list[Any]
    names: list[str] = field(default_factory=list)
    op: str = ""


@dataclass
class _Action:
    cond: _Cond


@dataclass
class _If:
    """``if`` and ``with`` (and their ``else if``/``else with`` chains): each branch is
    (keyword, condition, body); ``with`` moves the dot to its value."""

    branches: list[tuple[str, _Cond, list[Any]]] = field(default_factory=list)
    otherwise: list[Any] = field(default_factory=list)


@dataclass
class _Range:
    cond: _Cond
    body: list[Any] = field(default_factory=list)
    otherwise: list[Any] = field(default_factory=list)


@dataclass
class _Jump:
    word: str  # "break" or "continue"


_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<num>-?\d+)'
    r"|(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)|(?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>:=|[|().=,]))"
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


def _cond(tokens: list[tuple[str, str]], source: str, *, pair: bool = False) -> _Cond:
    """A pipeline with an optional ``$x :=``/``$x =`` in front (``$i, $e :=`` when ``pair``, as
    range allows)."""
    names: list[str] = []
    i = 0
    while i < len(tokens) and tokens[i][0] == "var" and "." not in tokens[i][1]:
        if i + 1 < len(tokens) and tokens[i + 1] in (("punct", ":="), ("punct", "=")):
            names.append(tokens[i][1])
            if len(names) > (2 if pair else 1) or tokens[i][1] == "$":
                raise TemplateError(f"too many or bad variables declared in {{{{{source.strip()}}}}}")
            return _Cond(_pipeline(tokens[i + 2 :], source), names, tokens[i + 1][1])
        if pair and i + 1 < len(tokens) and tokens[i + 1] == ("punct", ",") and not names:
            names.append(tokens[i][1])
            i += 2
            continue
        break
    if names:
        raise TemplateError(f"missing := after the variables in {{{{{source.strip()}}}}}")
    return _Cond(_pipeline(tokens, source))


def parse(text: str, left: str = "{{", right: str = "}}") -> list[Any]:
    """The template's tree; TemplateError for what the subset does not read."""
    left, right = left or "{{", right or "}}"
    root: list[Any] = []
    stack: list[tuple[_If | _Range, list[Any]]] = []
    body = root
    # Variables known at each open block, checked while parsing as Go's parser does.
    known: list[set[str]] = [{"$"}]

    def declared(cond: _Cond, *, opens: bool = False) -> _Cond:
        wanted = [v[0] for v in _variables(cond.pipe)] + (cond.names if cond.op == "=" else [])
        for name in wanted:
            if not any(name in scope for scope in known):
                raise TemplateError(f"undefined variable: {name}")
        if opens:
            known.append(set())
        if cond.op == ":=":
            known[-1].update(cond.names)
        return cond

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
        if head in ("if", "with"):
            node = _If()
            node.branches.append((head, declared(_cond(tokens[1:], piece), opens=True), []))
            body.append(node)
            stack.append((node, body))
            body = node.branches[-1][2]
        elif head == "range":
            loop = _Range(declared(_cond(tokens[1:], piece, pair=True), opens=True))
            body.append(loop)
            stack.append((loop, body))
            body = loop.body
        elif head == "else":
            if not stack:
                raise TemplateError(f"{left}else{right} without {left}if{right}")
            owner = stack[-1][0]
            chained = len(tokens) > 1 and tokens[1][1] in ("if", "with") and tokens[1][0] == "ident"
            if chained and isinstance(owner, _If):
                owner.branches.append((tokens[1][1], declared(_cond(tokens[2:], piece)), []))
                body = owner.branches[-1][2]
            elif len(tokens) == 1:
                body = owner.otherwise
            else:
                raise TemplateError(f"unexpected {piece.strip()!r} after else")
        elif head == "end":
            if not stack:
                raise TemplateError(f"{left}end{right} without {left}if{right}")
            body = stack.pop()[1]
            known.pop()
        elif head in ("break", "continue"):
            if not any(isinstance(n, _Range) for n, _ in stack) or len(tokens) > 1:
                raise TemplateError(f"{left}{head}{right} outside a {left}range{right}")
            body.append(_Jump(head))
        elif head in ("define", "template", "block"):
            raise TemplateError(f'"{head}" is not supported by driversdk run\'s templates')
        else:
            body.append(_Action(declared(_cond(tokens, piece))))
    if stack:
        opened = stack[-1][0]
        word = "range" if isinstance(opened, _Range) else opened.branches[0][0]
        raise TemplateError(f"{left}{word}{right} without {left}end{right}")
    return root


def _pipeline(tokens: list[tuple[str, str]], source: str) -> list[Any]:
    """A pipeline as a list of commands; each command is a list of operands, an operand a
    ("str", value), ("int", n), ("bool", b), ("func", name), ("pipe", pipeline), ("dot", None),
    ("field", names) or ("var", (name, names))."""
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
        elif kind == "ident" and text == "nil":
            commands[-1].append(("nil", None))
        elif kind == "ident":
            commands[-1].append(("func", text))
        elif kind == "punct" and text == ".":
            commands[-1].append(("dot", None))
        elif kind == "field":
            commands[-1].append(("field", tuple(text.split(".")[1:])))
        elif kind == "var":
            name, *names = text.split(".")
            commands[-1].append(("var", (name, tuple(names))))
        else:
            raise TemplateError(f"unexpected {text!r} in {{{{{source.strip()}}}}}")
        i += 1
    if not commands[-1]:
        raise TemplateError(f"missing value in {{{{{source.strip()}}}}}")
    return commands


def _variables(pipe: list[Any]) -> list[tuple[str, tuple[str, ...]]]:
    """The variables a pipeline reads, nested pipelines included."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for command in pipe:
        for kind, value in command:
            if kind == "var":
                found.append(value)
            elif kind == "pipe":
                found.extend(_variables(value))
    return found


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
            pipe(node.cond.pipe)
        elif isinstance(node, _If):
            for _, cond, body in node.branches:
                pipe(cond.pipe)
                names.extend(_walk_functions(body))
            names.extend(_walk_functions(node.otherwise))
        elif isinstance(node, _Range):
            pipe(node.cond.pipe)
            names.extend(_walk_functions(node.body))
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


def _text(value: Any, top: bool = True) -> str:
    """A value as Go's text/template prints it (``<no value>`` for a missing one at the top)."""
    if value is None:
        return "<no value>" if top else "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + " ".join(_text(v, False) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_text(value[k], False)}" for k in sorted(value)) + "]"
    return str(value)


def _go_syntax(value: Any) -> str:
    """``%#v``: the value as Go source (consul-template's data is nil at the top: ``<nil>``)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        kind = "string" if value and all(isinstance(v, str) for v in value) else "interface {}"
        return f"[]{kind}{{" + ", ".join(_go_syntax(v) for v in value) + "}"
    if isinstance(value, dict):
        items = ", ".join(f"{_go_syntax(k)}:{_go_syntax(value[k])}" for k in sorted(value))
        return "map[string]interface {}{" + items + "}"
    return str(value)


_VERB = re.compile(r"%([-+# 0]*)(\d*)(?:\.(\d+))?([a-zA-Z%])")


def _printf(layout: Any, *args: Any) -> str:
    """Go's fmt.Sprintf for the verbs templates use: %v %s %d %q %t %x %X %f and %#v."""
    queue = list(args)

    def one(match: re.Match[str]) -> str:
        flags, width, precision, verb = match.groups()
        if verb == "%":
            return "%"
        if not queue:
            return f"%!{verb}(MISSING)"
        value = queue.pop(0)
        if verb == "v" and "#" in flags:
            text = _go_syntax(value)
        elif verb in ("v", "s", "t"):
            text = _text(value, False)
        elif verb == "q":
            text = _go_syntax(str(value))
        elif verb in ("d", "x", "X", "f") and isinstance(value, int | float) and not isinstance(value, bool):
            spec = {"d": "d", "x": "x", "X": "X", "f": f".{precision or 6}f"}[verb]
            text = format(int(value) if verb != "f" else float(value), spec)
        elif verb in ("x", "X") and isinstance(value, str):
            text = value.encode().hex() if verb == "x" else value.encode().hex().upper()
        else:
            return f"%!{verb}({type(value).__name__}={_text(value, False)})"
        if precision and verb == "s":
            text = text[: int(precision)]
        if width:
            text = text.ljust(int(width)) if "-" in flags else text.rjust(int(width), "0" if "0" in flags else " ")
        return text

    return _VERB.sub(one, str(layout))


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


def _parse_json(text: Any) -> Any:
    try:
        return json.loads(str(text))
    except ValueError:
        raise TemplateError(f"parseJSON: {str(text)[:40]!r} is not JSON") from None


def _index(value: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list | str) and isinstance(key, int) and 0 <= key < len(value):
            value = value[key]
        else:
            raise TemplateError(f"index: can't index {_text(value, False)!r} with {_text(key, False)!r}")
    return value


def _join(*args: Any) -> str:
    """consul-template's ``join sep list``, or go-sockaddr's ``join "attr" sep addresses``."""
    if len(args) == 3:
        return sockaddr.join(str(args[0]), str(args[1]), args[2])
    if len(args) != 2:
        raise TypeError
    sep, items = args
    if not isinstance(items, list):
        raise TemplateError(f"join: {_text(items, False)!r} is not a list")
    return str(sep).join(_text(i, False) for i in items)


def _field(value: Any, name: str) -> Any:
    if value is None or isinstance(value, dict):
        return None if value is None else value.get(name)  # a missing key is Go's zero: <no value>
    if isinstance(value, sockaddr.IfAddr) and name in ("Name", "SockAddr"):
        return value.name if name == "Name" else value.text()
    raise TemplateError(f"can't evaluate field {name} in {_text(value, False)!r}")


class _Jumped(DriverSDKError):
    """{{ break }} / {{ continue }} unwinding to the range it belongs to, which catches it (the
    parser refuses either outside a range), so it never reaches an operator; it sits in the one
    exception tree all the same."""

    def __init__(self, word: str) -> None:
        super().__init__(word)
        self.word = word


class _Renderer:
    def __init__(self, env: Mapping[str, str], now: Callable[[], float]) -> None:
        self.env = env
        # consul-template executes every template with nil data: the dot and $ start as nil.
        self.scopes: list[dict[str, Any]] = [{"$": None}]
        self.dot: Any = None
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
            "split": lambda sep, s: str(s).split(str(sep)) if s else [],
            "join": _join,
            "parseJSON": _parse_json,
            "index": _index,
            "printf": _printf,
            "println": lambda *xs: " ".join(_text(x, False) for x in xs) + "\n",
            "eq": lambda a, *bs: any(a == b for b in bs),
            "ne": lambda a, b: a != b,
            "not": lambda a: not _truth(a),
            "and": lambda *xs: next((x for x in xs if not _truth(x)), xs[-1]),
            "or": lambda *xs: next((x for x in xs if _truth(x)), xs[-1]),
            "len": lambda s: len(s),
            "print": lambda *xs: "".join(_text(x, False) for x in xs),
            "sockaddr": self.sockaddr,
            **sockaddr.functions(),
        }

    def sockaddr(self, *args: Any) -> Any:
        """consul-template's ``sockaddr "GetPrivateIP"``: the arguments, joined, are one
        go-sockaddr pipeline."""
        source = " ".join(str(a) for a in args)
        return self.pipe(_pipeline(_tokens(source), source))

    # variables ---------------------------------------------------------------------------------

    def lookup(self, name: str) -> Any:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise TemplateError(f"undefined variable: {name}")

    def bind(self, cond: _Cond, values: list[Any]) -> None:
        for name, value in zip(cond.names, values, strict=True):
            if cond.op == ":=":
                self.scopes[-1][name] = value
                continue
            for scope in reversed(self.scopes):
                if name in scope:
                    scope[name] = value
                    break
            else:
                raise TemplateError(f"undefined variable: {name}")

    def run(self, body: list[Any], out: list[str], dot: Any) -> None:
        """A body in its own scope (Go's variables end at the body's {{end}}) with ``dot``."""
        saved = self.dot
        self.scopes.append({})
        self.dot = dot
        try:
            self.nodes(body, out)
        finally:
            self.scopes.pop()
            self.dot = saved

    # evaluation --------------------------------------------------------------------------------

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
        except sockaddr.SockaddrError as err:
            raise TemplateError(f"{first}: {err}") from None

    def operand(self, op: tuple[str, Any]) -> Any:
        kind, value = op
        if kind == "pipe":
            return self.pipe(value)
        if kind == "func":
            return self.command([op], _NOTHING)
        if kind in ("dot", "field", "var"):
            base, names = (self.dot, value) if kind != "var" else (self.lookup(value[0]), value[1])
            for name in names if kind != "dot" else ():
                base = _field(base, name)
            return base
        return value

    def nodes(self, nodes: list[Any], out: list[str]) -> None:
        for node in nodes:
            if isinstance(node, _Text):
                out.append(node.text)
            elif isinstance(node, _Action):
                value = self.pipe(node.cond.pipe)
                if node.cond.names:
                    self.bind(node.cond, [value])  # a declaration prints nothing, as in Go
                else:
                    out.append(_text(value))
            elif isinstance(node, _If):
                self.branch(node, out)
            elif isinstance(node, _Range):
                self.range(node, out)
            else:
                raise _Jumped(node.word)

    def branch(self, node: _If, out: list[str]) -> None:
        self.scopes.append({})  # a variable of the condition lives until {{end}}
        try:
            for word, cond, body in node.branches:
                value = self.pipe(cond.pipe)
                if cond.names:
                    self.bind(cond, [value])
                if _truth(value):
                    self.run(body, out, value if word == "with" else self.dot)
                    return
            self.run(node.otherwise, out, self.dot)
        finally:
            self.scopes.pop()

    def range(self, node: _Range, out: list[str]) -> None:
        value = self.pipe(node.cond.pipe)
        if isinstance(value, dict):
            items = [(k, value[k]) for k in sorted(value)]  # Go ranges over a map in key order
        elif isinstance(value, list):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [(i, i) for i in range(value)]
        elif value is None:
            items = []
        else:
            raise TemplateError(f"range can't iterate over {_text(value, False)!r}")
        if not items:
            self.run(node.otherwise, out, self.dot)
            return
        for key, item in items:
            self.scopes.append({})
            try:
                if node.cond.names:
                    self.bind(node.cond, [key, item] if len(node.cond.names) == 2 else [item])
                self.run(node.body, out, item)
            except _Jumped as jump:
                if jump.word == "break":
                    break
            finally:
                self.scopes.pop()


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
