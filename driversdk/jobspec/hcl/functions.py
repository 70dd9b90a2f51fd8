"""The functions a Nomad job file may call (the set Nomad's jobspec2 exposes), in Python.

Each takes already evaluated arguments and returns a value, or raises :class:`FunctionError`
with a short reason. ``try`` and ``can`` need their arguments unevaluated, so the evaluator
implements those two itself. The file functions read under the evaluation's
:class:`~driversdk.jobspec.hcl.files.FilePolicy` (see :mod:`.files`). Functions whose result can
be far larger than their arguments (setproduct, join, format, indent, replace, flatten, the
decoders) work out its size first and raise :class:`LimitError` past the caps of
:mod:`driversdk.jobspec.hcllimits`.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import ipaddress
import json
import math
import os
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from driversdk.errors import DriverSDKError
from driversdk.jobspec.hcl import yamldoc
from driversdk.jobspec.hcl.files import FILES_OFF, FileReader
from driversdk.jobspec.hcl.values import (
    ConvertError,
    Type,
    Value,
    convert,
    number_text,
    parse_number,
    show_type,
    to_number,
    to_string,
    type_name,
)
from driversdk.jobspec.hcllimits import (
    MAX_STRING_CHARS,
    MAX_VALUE_CHARS,
    MAX_VALUE_DEPTH,
    LimitError,
    elements_fit,
    string_fits,
)


class FunctionError(DriverSDKError, ValueError):
    """A call that cannot be evaluated (a bad argument, a function driversdk cannot run)."""


# A function a job file calls: evaluated arguments in, a value out.
Func = Callable[..., Value]


def _str(v: Value) -> str:
    try:
        return to_string(v)
    except ConvertError as err:
        raise FunctionError(str(err)) from None


def _num(v: Value) -> int | float:
    try:
        return to_number(v)
    except ConvertError as err:
        raise FunctionError(str(err)) from None


def _int(v: Value) -> int:
    n = _num(v)
    if isinstance(n, float) and not n.is_integer():
        raise FunctionError(f"a whole number is required, not {number_text(n)}")
    return int(n)


def _list(v: Value) -> list[Value]:
    if not isinstance(v, list):
        raise FunctionError(f"a list is required, not {type_name(v)}")
    return v


def _map(v: Value) -> dict[str, Value]:
    if not isinstance(v, dict):
        raise FunctionError(f"a map is required, not {type_name(v)}")
    return v


def _whole(n: float) -> int | float:
    return int(n) if isinstance(n, float) and n.is_integer() and math.isfinite(n) else n


# --- strings -------------------------------------------------------------------------------------

_VERB = re.compile(r"%(?:\[(\d+)\])?([-+# 0]*)(\d+|\*)?(?:\.(\d+))?([a-zA-Z%])")


def _format(fmt: Value, *args: Value) -> str:
    """Go's fmt verbs as cty's format function accepts them: %v %s %q %d %f %e %g %t %x %X %o %b %%."""
    text = _str(fmt)
    out: list[str] = []
    pos = 0
    next_arg = 0
    length = 0
    for m in _VERB.finditer(text):
        out.append(text[pos : m.start()])
        # What the last verb made and the text up to this one: the result so far, checked as it grows.
        length += sum(len(piece) for piece in out[-2:])
        string_fits(length, "format's result")
        pos = m.end()
        index, flags, width, precision, verb = m.groups()
        for number in (width, precision):
            if number and number != "*":
                string_fits(int(number) if len(number) < 10 else MAX_STRING_CHARS + 1, "a format width")
        if verb == "%":
            out.append("%")
            continue
        if index is not None:
            next_arg = int(index) - 1
        if next_arg >= len(args):
            raise FunctionError(f"not enough arguments for format verb %{verb}")
        value = args[next_arg]
        next_arg += 1
        spec = flags.replace("#", "") + (width or "") + (f".{precision}" if precision else "")
        if verb in ("v", "s"):
            if isinstance(value, list | dict):
                piece = json.dumps(value, separators=(",", ":")) if verb == "v" else None
                if piece is None:
                    raise FunctionError("%s needs a string, number or bool")
            else:
                piece = "null" if value is None else _str(value)
            out.append(format(piece, spec.replace("0", "") if "-" in spec else spec) if spec else piece)
        elif verb == "q":
            out.append(json.dumps(_str(value)))
        elif verb == "t":
            if not isinstance(value, bool):
                raise FunctionError("%t needs a bool")
            out.append("true" if value else "false")
        elif verb in ("d", "x", "X", "o", "b"):
            out.append(format(_int(value), spec + verb))
        elif verb in ("f", "F", "e", "E", "g", "G"):
            if verb in ("f", "F") and not precision:
                spec += ".6"
            out.append(format(float(_num(value)), spec + verb))
        else:
            raise FunctionError(f"unsupported format verb %{verb}")
    out.append(text[pos:])
    return "".join(out)


def _formatlist(fmt: Value, *args: Value) -> list[Value]:
    lengths = {len(a) for a in args if isinstance(a, list)}
    if len(lengths) > 1:
        raise FunctionError("all list arguments must have the same length")
    n = lengths.pop() if lengths else 1
    out: list[Value] = []
    total = 0
    for i in range(n):
        piece = _format(fmt, *[a[i] if isinstance(a, list) else a for a in args])
        out.append(piece)
        total += len(piece)
        if total > MAX_VALUE_CHARS:
            raise LimitError(f"formatlist's result would be more than {MAX_VALUE_CHARS} characters")
    return out


def _indent(spaces: Value, text: Value) -> str:
    width = _int(spaces)
    source = _str(text)
    string_fits(len(source) + max(0, width) * source.count("\n"), "indent's result")
    pad = " " * width
    lines = source.split("\n")
    return "\n".join([lines[0], *[pad + line if line else line for line in lines[1:]]])


def _regex_replace(s: Value, pattern: Value, repl: Value) -> str:
    # Go's $1 / ${name} references become Python's \g<…>.
    py_repl = re.sub(r"\$\{?(\w+)\}?", lambda m: f"\\g<{m.group(1)}>", _str(repl).replace("\\", "\\\\"))
    text = _str(s)
    grown = [len(text)]

    def expand(m: re.Match[str]) -> str:
        piece = m.expand(py_repl)
        grown[0] += len(piece) - (m.end() - m.start())
        string_fits(grown[0], "regex_replace's result")
        return piece

    try:
        return re.sub(_str(pattern), expand, text)
    except re.error as err:
        raise FunctionError(f"invalid regular expression: {err}") from None


def _replace(s: Value, old: Value, new: Value) -> str:
    old_s = _str(old)
    if len(old_s) > 1 and old_s.startswith("/") and old_s.endswith("/"):
        return _regex_replace(s, old_s[1:-1], new)
    text, new_s = _str(s), _str(new)
    count = text.count(old_s) if old_s else len(text) + 1
    string_fits(len(text) + count * (len(new_s) - len(old_s)), "replace's result")
    return text.replace(old_s, new_s)


def _substr(s: Value, offset: Value, length: Value) -> str:
    text = _str(s)
    start = _int(offset)
    if start < 0:
        start += len(text)
    start = max(0, min(start, len(text)))
    n = _int(length)
    return text[start:] if n < 0 else text[start : start + n]


def _title(s: Value) -> str:
    return re.sub(r"(^|\s)(\S)", lambda m: m.group(1) + m.group(2).upper(), _str(s))


def _trim(s: Value, chars: Value) -> str:
    return _str(s).strip(_str(chars))


def _split(sep: Value, s: Value) -> list[Value]:
    text = _str(s)
    return [] if text == "" else [*text.split(_str(sep))]


def _join(sep: Value, *lists: Value) -> str:
    items = [v for lst in lists for v in _list(lst)]
    if any(v is None for v in items):
        raise FunctionError("join cannot join null elements")
    parts = [_str(v) for v in items]
    glue = _str(sep)
    string_fits(sum(len(p) for p in parts) + len(glue) * max(0, len(parts) - 1), "join's result")
    return glue.join(parts)


def _chomp(s: Value) -> str:
    return re.sub(r"(\r\n|\n|\r)+$", "", _str(s))


# --- numbers -------------------------------------------------------------------------------------


def _parseint(s: Value, base: Value) -> int:
    b = _int(base)
    if b < 2 or b > 62:
        raise FunctionError("base must be a whole number between 2 and 62")
    try:
        return int(_str(s), b)
    except ValueError:
        raise FunctionError(f"cannot parse {_str(s)!r} as a base {b} integer") from None


def _minmax(pick: Callable[[Iterator[int | float]], int | float]) -> Func:
    def run(*numbers: Value) -> Value:
        if not numbers:
            raise FunctionError("needs at least one number")
        return pick(_num(n) for n in numbers)

    return run


# --- collections ---------------------------------------------------------------------------------


def _coalesce(*values: Value) -> Value:
    for v in values:
        if v is not None and v != "":
            return v
    raise FunctionError("no non-null, non-empty-string arguments")


def _coalescelist(*lists: Value) -> Value:
    for lst in lists:
        if _list(lst):
            return lst
    return []


def _chunklist(lst: Value, size: Value) -> list[Value]:
    items = _list(lst)
    n = _int(size)
    if n < 0:
        raise FunctionError("the chunk size must not be negative")
    if n == 0:
        return [items]
    return [items[i : i + n] for i in range(0, len(items), n)]


def _identity(v: Value) -> str:
    """What makes two values the same element of a set (1 and true, 1 and "1" are not)."""
    return json.dumps(v, sort_keys=True)


def _distinct(lst: Value) -> list[Value]:
    # By a key, in linear time: a list compared element by element is quadratic.
    seen: set[str] = set()
    out: list[Value] = []
    for v in _list(lst):
        key = _identity(v)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def _element(lst: Value, index: Value) -> Value:
    items = _list(lst)
    if not items:
        raise FunctionError("cannot use element function with an empty list")
    i = _int(index)
    if i < 0:
        raise FunctionError("cannot use element function with a negative index")
    return items[i % len(items)]


def _flatten(lst: Value) -> list[Value]:
    out: list[Value] = []
    pending = [iter(_list(lst))]
    while pending:
        try:
            v = next(pending[-1])
        except StopIteration:
            pending.pop()
            continue
        if isinstance(v, list):
            pending.append(iter(v))
        else:
            out.append(v)
            elements_fit(len(out), "flatten's result")
    return out


def _index(lst: Value, value: Value) -> int:
    items = _list(lst)
    if value not in items:
        raise FunctionError("item not found")
    return items.index(value)


def _keys(m: Value) -> list[Value]:
    return [*sorted(_map(m))]


def _values(m: Value) -> list[Value]:
    d = _map(m)
    return [d[k] for k in sorted(d)]


def _length(v: Value) -> int:
    if isinstance(v, str | list | dict):
        return len(v)
    raise FunctionError(f"cannot take the length of {type_name(v)}")


def _lookup(m: Value, key: Value, *default: Value) -> Value:
    d = _map(m)
    k = _str(key)
    if k in d:
        return d[k]
    if default:
        return default[0]
    raise FunctionError(f'the given key "{k}" does not identify an element in this map')


def _merge(*maps: Value) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for m in maps:
        if m is not None:
            out.update(_map(m))
    return out


def _range(*args: Value) -> list[Value]:
    nums = [_num(a) for a in args]
    start: int | float
    end: int | float
    step: int | float
    if len(nums) == 1:
        start, end, step = 0, nums[0], 1
    elif len(nums) == 2:
        start, end, step = nums[0], nums[1], 1 if nums[1] >= nums[0] else -1
    elif len(nums) == 3:
        start, end, step = nums
    else:
        raise FunctionError("range needs one to three numbers")
    if step == 0:
        raise FunctionError("step must not be zero")
    out: list[Value] = []
    v = start
    while (v < end if step > 0 else v > end) and len(out) < 1024:
        out.append(_whole(v))
        v += step
    if len(out) >= 1024:
        raise FunctionError("more than 1024 values were generated")
    return out


def _slice(lst: Value, start: Value, end: Value) -> list[Value]:
    items = _list(lst)
    a, b = _int(start), _int(end)
    if a < 0 or b > len(items) or a > b:
        raise FunctionError("invalid slice indices")
    return items[a:b]


def _sort(lst: Value) -> list[Value]:
    return [*sorted(_str(v) for v in _list(lst))]


def _setproduct(*sets: Value) -> list[Value]:
    count = 1
    for s in sets:
        count *= len(_list(s))
    elements_fit(count * (len(sets) + 1), "setproduct's result")  # each tuple and its elements
    out: list[list[Value]] = [[]]
    for s in sets:
        out = [[*prev, v] for prev in out for v in _list(s)]
    return [*out] if sets else []


def _setop(op: str) -> Func:
    def run(first: Value, *rest: Value) -> list[Value]:
        result = _distinct(first)
        for other in rest:
            items = _list(other)
            if op == "union":
                known = {_identity(v) for v in result}
                result += _distinct([v for v in items if _identity(v) not in known])
            else:
                keep = {_identity(v) for v in items}
                result = [v for v in result if _identity(v) in keep]
        return result

    return run


def _zipmap(keys: Value, values: Value) -> dict[str, Value]:
    ks, vs = _list(keys), _list(values)
    if len(ks) != len(vs):
        raise FunctionError("the keys and values lists must have the same length")
    return {_str(k): v for k, v in zip(ks, vs, strict=True)}


def _concat(*lists: Value) -> list[Value]:
    return [v for lst in lists for v in _list(lst)]


def _compact(lst: Value) -> list[Value]:
    return [_str(v) for v in _list(lst) if v is not None and v != ""]


def _reverse(v: Value) -> Value:
    if isinstance(v, str):
        return v[::-1]
    return list(reversed(_list(v)))


# --- encoding ------------------------------------------------------------------------------------


def _jsondecode(s: Value) -> Value:
    try:
        return _plain(json.loads(_str(s)))
    except ValueError as err:
        raise FunctionError(f"invalid JSON: {err}") from None


def _plain(v: Any, depth: int = 0, count: list[int] | None = None) -> Value:
    """A decoded document as HCL values; a YAML document whose aliases repeat a part many times
    ("billion laughs") is refused by the count of elements it copies to, not built.

    ``v`` is Any: it is what json.loads or yaml.safe_load returned, not yet a value."""
    count = count if count is not None else [0]
    count[0] += 1
    elements_fit(count[0], "the decoded document")
    if depth > MAX_VALUE_DEPTH:
        raise LimitError(f"the decoded document nests more than {MAX_VALUE_DEPTH} lists or maps deep")
    if isinstance(v, float):
        if math.isnan(v):  # cty's numbers have no NaN
            raise FunctionError("the document holds NaN, which is not a number HCL has")
        return _whole(v)
    if isinstance(v, list):
        return [_plain(x, depth + 1, count) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x, depth + 1, count) for k, x in v.items()}  # strings from both loaders
    scalar: Value = v  # None, bool, int or str: all the loaders make besides (see yamldoc)
    return scalar


def _jsonencode(v: Value) -> str:
    return json.dumps(v, separators=(",", ":"), sort_keys=True)


def _yamldecode(s: Value) -> Value:
    try:
        import yaml
    except ImportError:
        raise FunctionError("yamldecode needs PyYAML installed") from None
    try:
        return _plain(yamldoc.load(_str(s)))
    except yamldoc.YAMLValueError as err:
        raise FunctionError(str(err)) from None
    except yaml.YAMLError as err:
        raise FunctionError(f"invalid YAML: {_yaml_reason(err)}") from None


def _yaml_reason(err: Exception) -> str:
    """PyYAML's error in one line: what is wrong and where (its own text spans several lines)."""
    said = ", ".join(str(part) for part in (getattr(err, "context", None), getattr(err, "problem", None)) if part)
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    if not said:
        return " ".join(str(err).split())
    if mark is None:
        return said
    return f"{said} at line {mark.line + 1}, column {mark.column + 1} of the YAML"


def _yamlencode(v: Value) -> str:
    try:
        import yaml
    except ImportError:
        raise FunctionError("yamlencode needs PyYAML installed") from None
    return str(yaml.safe_dump(v, sort_keys=True, default_flow_style=False))


def _csvdecode(s: Value) -> list[Value]:
    rows = list(csv.reader(io.StringIO(_str(s))))
    if not rows:
        raise FunctionError("missing header line")
    header = rows[0]
    out: list[Value] = []
    for row in rows[1:]:
        if len(row) != len(header):
            raise FunctionError("a row has a different number of fields than the header")
        record: dict[str, Value] = dict(zip(header, row, strict=True))
        out.append(record)
    return out


def _b64decode(s: Value) -> str:
    try:
        return base64.b64decode(_str(s), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise FunctionError("the string is not valid base64 of UTF-8 text") from None


def _urlencode(s: Value) -> str:
    from urllib.parse import quote_plus

    return quote_plus(_str(s))


def _hash(name: str) -> Func:
    return lambda s: hashlib.new(name, _str(s).encode()).hexdigest()


# --- network -------------------------------------------------------------------------------------


def _net(prefix: Value) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(_str(prefix), strict=False)
    except ValueError as err:
        raise FunctionError(f"invalid CIDR expression: {err}") from None


def _cidrhost(prefix: Value, num: Value) -> str:
    net = _net(prefix)
    n = _int(num)
    size = net.num_addresses
    if n >= size or n < -size:
        raise FunctionError(f"prefix {net} has no host number {n}")
    return str(net[n])


def _cidrnetmask(prefix: Value) -> str:
    net = _net(prefix)
    if net.version != 4:
        raise FunctionError("only IPv4 prefixes have a netmask")
    return str(net.netmask)


def _cidrsubnet(prefix: Value, newbits: Value, netnum: Value) -> str:
    net = _net(prefix)
    subnets = list(net.subnets(prefixlen_diff=_int(newbits))) if _int(newbits) <= 16 else []
    n = _int(netnum)
    if not 0 <= n < len(subnets):
        raise FunctionError(f"prefix extension of {_int(newbits)} does not accommodate a subnet numbered {n}")
    return str(subnets[n])


def _within(
    sub: ipaddress.IPv4Network | ipaddress.IPv6Network, net: ipaddress.IPv4Network | ipaddress.IPv6Network
) -> bool:
    if isinstance(sub, ipaddress.IPv4Network) and isinstance(net, ipaddress.IPv4Network):
        return sub.subnet_of(net)
    if isinstance(sub, ipaddress.IPv6Network) and isinstance(net, ipaddress.IPv6Network):
        return sub.subnet_of(net)
    return False  # never: a subnet is built from its prefix's own address family


def _cidrsubnets(prefix: Value, *newbits: Value) -> list[Value]:
    net = _net(prefix)
    out: list[Value] = []
    current = int(net.network_address)
    for bits in newbits:
        length = net.prefixlen + _int(bits)
        block = 1 << (net.max_prefixlen - length)
        current = (current + block - 1) // block * block
        sub = ipaddress.ip_network(f"{ipaddress.ip_address(current)}/{length}")
        if not _within(sub, net):
            raise FunctionError("not enough remaining address space for a subnet")
        out.append(str(sub))
        current += block
    return out


# --- time ----------------------------------------------------------------------------------------


def _rfc3339(s: Value) -> datetime:
    try:
        return datetime.fromisoformat(_str(s).replace("Z", "+00:00"))
    except ValueError:
        raise FunctionError(f"{_str(s)!r} is not an RFC 3339 timestamp") from None


_DATE_TOKENS = [
    ("YYYY", "%Y"), ("YY", "%y"), ("MMMM", "%B"), ("MMM", "%b"), ("MM", "%m"), ("M", "%-m"),
    ("DD", "%d"), ("D", "%-d"), ("EEEE", "%A"), ("EEE", "%a"), ("hh", "%H"), ("h", "%-H"),
    ("HH", "%I"), ("H", "%-I"), ("AA", "%p"), ("aa", "%p"), ("mm", "%M"), ("m", "%-M"),
    ("ss", "%S"), ("s", "%-S"), ("ZZZZZ", "%:z"), ("ZZZZ", "%z"), ("ZZZ", "%Z"), ("Z", "Z"),
]  # fmt: skip


def _formatdate(fmt: Value, ts: Value) -> str:
    when = _rfc3339(ts)
    text = _str(fmt)
    out = []
    i = 0
    while i < len(text):
        if text[i] == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise FunctionError("unterminated quoted literal in the format")
            out.append(text[i + 1 : end] or "'")
            i = end + 1
            continue
        for token, code in _DATE_TOKENS:
            if text.startswith(token, i):
                if token == "Z":
                    offset = when.utcoffset()
                    out.append("Z" if not offset else when.strftime("%:z"))
                else:
                    out.append(when.strftime(code))
                i += len(token)
                break
        else:
            if text[i].isalpha():
                raise FunctionError(f"invalid date format verb {text[i]!r}")
            out.append(text[i])
            i += 1
    return "".join(out)


def _timeadd(ts: Value, duration: Value) -> str:
    from driversdk.durations import parse_duration
    from driversdk.errors import ConfigError

    try:
        seconds = parse_duration(_str(duration), "duration", allow_negative=True)
    except ConfigError as err:
        raise FunctionError(str(err)) from None
    when = _rfc3339(ts) + timedelta(seconds=seconds)
    return when.isoformat().replace("+00:00", "Z")


# --- files ---------------------------------------------------------------------------------------


def _files(reader: FileReader | None) -> dict[str, Func]:
    """The file functions; without a reader (no filesystem for this job) each is refused, as
    Nomad's are for a job sent to its API. basename and dirname only cut strings: kept."""

    sentence = (reader.policy.refusal if reader is not None else "") or FILES_OFF

    def refused(name: str) -> Func:
        def run(*_: Value) -> Value:
            raise FunctionError(sentence)

        return run

    common: dict[str, Func] = {
        "basename": lambda p: os.path.basename(_str(p)),
        "dirname": lambda p: os.path.dirname(_str(p)),
    }
    if reader is None or reader.policy.root is None:
        # abspath and pathexpand read the process's directory and $HOME: host facts too.
        names = ("abspath", "pathexpand", "file", "filebase64", "fileexists", "fileset")
        return {**common, **{name: refused(name) for name in names}}

    def file(p: Value) -> str:
        try:
            return reader.read(p).decode("utf-8")
        except UnicodeDecodeError:
            raise FunctionError(f"{_str(p)!r} is not UTF-8 text; use filebase64") from None

    return {
        **common,
        "abspath": lambda p: os.path.abspath(_str(p)),
        "pathexpand": lambda p: os.path.expanduser(_str(p)),
        "file": file,
        "filebase64": lambda p: base64.b64encode(reader.read(p)).decode(),
        "fileexists": reader.exists,
        "fileset": lambda path, pattern: [*reader.fileset(path, pattern)],
    }


def _unsupported(name: str) -> Func:
    def run(*_: Value) -> Value:
        raise FunctionError(f"{name}() is a Nomad function driversdk cannot evaluate; compute the value elsewhere")

    return run


def _convert(value: Value, t: Type) -> Value:
    # The evaluator passes the second argument as the type expression it reads there.
    try:
        return convert(value, t)
    except ConvertError as err:
        raise FunctionError(f"the {type_name(value)} cannot be converted to {show_type(t)}: {err}") from None


def table(files: FileReader | None) -> dict[str, Func]:
    """Every function name Nomad's job files may call; the file functions read through ``files``
    (None: they are refused)."""
    funcs: dict[str, Func] = {
        "abs": lambda n: abs(_num(n)),
        "base64decode": _b64decode,
        "base64encode": lambda s: base64.b64encode(_str(s).encode()).decode(),
        "bcrypt": _unsupported("bcrypt"),
        "ceil": lambda n: math.ceil(_num(n)),
        "chomp": _chomp,
        "chunklist": _chunklist,
        "cidrhost": _cidrhost,
        "cidrnetmask": _cidrnetmask,
        "cidrsubnet": _cidrsubnet,
        "cidrsubnets": _cidrsubnets,
        "coalesce": _coalesce,
        "coalescelist": _coalescelist,
        "compact": _compact,
        "concat": _concat,
        "contains": lambda lst, v: v in _list(lst),
        "convert": _convert,
        "csvdecode": _csvdecode,
        "distinct": _distinct,
        "element": _element,
        "flatten": _flatten,
        "floor": lambda n: math.floor(_num(n)),
        "format": _format,
        "formatdate": _formatdate,
        "formatlist": _formatlist,
        "indent": _indent,
        "index": _index,
        "join": _join,
        "jsondecode": _jsondecode,
        "jsonencode": _jsonencode,
        "keys": _keys,
        "length": _length,
        "log": lambda n, b: _whole(math.log(_num(n), _num(b))),
        "lookup": _lookup,
        "lower": lambda s: _str(s).lower(),
        "max": _minmax(max),
        "md5": _hash("md5"),
        "merge": _merge,
        "min": _minmax(min),
        "parseint": _parseint,
        "pow": lambda a, b: _whole(math.pow(_num(a), _num(b))),
        "range": _range,
        "reverse": _reverse,
        "replace": _replace,
        "regex_replace": _regex_replace,
        "rsadecrypt": _unsupported("rsadecrypt"),
        "setintersection": _setop("intersection"),
        "setproduct": _setproduct,
        "setunion": _setop("union"),
        "sha1": _hash("sha1"),
        "sha256": _hash("sha256"),
        "sha512": _hash("sha512"),
        "signum": lambda n: (_num(n) > 0) - (_num(n) < 0),
        "slice": _slice,
        "sort": _sort,
        "split": _split,
        "strlen": lambda s: len(_str(s)),
        "strrev": lambda s: _str(s)[::-1],
        "substr": _substr,
        "timeadd": _timeadd,
        "title": _title,
        "trim": _trim,
        "trimprefix": lambda s, p: _str(s).removeprefix(_str(p)),
        "trimspace": lambda s: _str(s).strip(),
        "trimsuffix": lambda s, p: _str(s).removesuffix(_str(p)),
        "upper": lambda s: _str(s).upper(),
        "urlencode": _urlencode,
        "uuidv4": lambda: str(uuid.uuid4()),
        "uuidv5": lambda ns, name: str(uuid.uuid5(_uuid_ns(ns), _str(name))),
        "values": _values,
        "yamldecode": _yamldecode,
        "yamlencode": _yamlencode,
        "zipmap": _zipmap,
    }
    funcs.update(_files(files))
    return funcs


def _uuid_ns(ns: Value) -> uuid.UUID:
    known = {
        "dns": uuid.NAMESPACE_DNS,
        "url": uuid.NAMESPACE_URL,
        "oid": uuid.NAMESPACE_OID,
        "x500": uuid.NAMESPACE_X500,
    }
    text = _str(ns)
    if text in known:
        return known[text]
    try:
        return uuid.UUID(text)
    except ValueError:
        raise FunctionError(f"{text!r} is not a UUID namespace (dns, url, oid, x500 or a UUID)") from None


# try and can are evaluated lazily by the evaluator; they are listed here so they are "known".
LAZY = ("try", "can")
NAMES = frozenset([*table(None), *LAZY])

__all__ = ["LAZY", "NAMES", "FunctionError", "parse_number", "table"]
