"""A syntax error of python-hcl2's grammar, said in HCL's terms instead of the parser's.

Lark reports what its LALR tables expected (``Unexpected token Token('DBLQUOTE', '"')…``); an
operator needs what is wrong in the language they wrote: a quoted argument name, a missing
``=``, a block never closed. Each error is read from the token lark stopped at, the terminals it
would have taken and the source text around it, and becomes one summary (HCL's own titles, such
as "Unclosed configuration block") with the line and column of the offending text and that text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

# Terminals that start an expression: lark expecting one of these means "a value belongs here".
_EXPRESSION_START = {"INT_LITERAL", "FLOAT_LITERAL", "DBLQUOTE", "LSQB", "LPAR", "TRUE", "FALSE", "NULL", "MINUS"}
_HCL1_COMMA = re.compile(r'^\s*"?[A-Za-z_][\w-]*"?\s*=\s*[^\[{(]*,\s*$', re.M)


@dataclass(frozen=True)
class SyntaxFacts:
    """What is wrong (``summary``), where (1-based line and column) and the text there."""

    summary: str
    line: int | None
    column: int | None
    excerpt: str

    def sentence(self) -> str:
        """The summary with the offending line's text (escaped and shortened)."""
        return f"{self.summary}, in {_quote(self.excerpt)}" if self.excerpt else self.summary


def describe(err: Exception, text: str) -> SyntaxFacts:
    """``err`` (lark's UnexpectedToken, UnexpectedCharacters or UnexpectedEOF) in HCL's terms."""
    line: int | None = _int(getattr(err, "line", None))
    column: int | None = _int(getattr(err, "column", None))
    token: object = getattr(err, "token", None)  # lark's Token, read by its text and type
    kind = str(getattr(token, "type", "")) if token is not None else ""
    value = str(token) if token is not None else str(getattr(err, "char", ""))
    expected = {str(e) for e in (getattr(err, "expected", None) or getattr(err, "allowed", None) or ())}
    lines = text.split("\n")
    first = _quote(value.split("\n")[0].strip() or value)  # the offending text, as written
    starts_line = not _before(lines, line, column).strip()
    summary: str
    if token is None and hasattr(err, "char"):
        summary = f"Invalid character: {_quote(value.split(chr(10))[0] or value)} cannot appear here"
    elif kind == "$END" or (token is None and not hasattr(err, "char")):
        summary, line, column = _at_end(text, expected, line, column)
    elif value.startswith("}") and (inside := _inner_open(text, line)) is not None:
        # A } while a [ or ( is still open: the list or parentheses were never closed.
        opener, line, column = inside
        summary = f"Unclosed {opener}: there is no closing {_CLOSE[opener]} for the {opener} opened here"
    elif kind == "DBLQUOTE" and expected == {"RBRACE"}:
        summary = "Unclosed template interpolation: a ${ in this string has no closing }"
    elif kind == "DBLQUOTE" and "NAME" in expected and "EQ" not in expected:
        rest = _rest(lines, line, column)
        if re.match(r'"[^"]*"\s*=', rest):
            summary = "Invalid argument name: argument names must not be quoted; write the name without quotes"
        else:
            summary = "Invalid block type: block type names must not be quoted; write the name without quotes"
    elif kind == "COLON" and "EQ" in expected:
        summary = "Missing equals sign: an argument is written name = value, not name: value"
    elif kind == "STRING_CHARS" and starts_line and not value.startswith("<<"):
        summary = (
            f"Argument or block definition required: a body holds arguments (name = value) and blocks "
            f"(name {{ … }}), not {first}"
        )
    elif "EQ" in expected and "LBRACE" in expected:
        summary = (
            f"Missing equals sign: an argument needs = between its name and its value (found {first}); "
            'a block needs { after its labels (name "label" { … })'
        )
    elif expected == {"LBRACE"}:
        # Labels ended by a newline or a brace: the line before is where the = or { is missing.
        line, column = _previous_line(lines, line)
        summary = (
            "Missing equals sign or block body: this is neither an argument (name = value) nor a block "
            '(name "label" { … })'
        )
    elif kind == "STRING_CHARS" and value.startswith("<<"):
        marker = value[2:].lstrip("-").split("\n")[0].strip()
        summary = f"Unclosed heredoc: no line holds its closing marker {marker}"
    elif kind == "STRING_CHARS" and expected & _EXPRESSION_START:
        found = value.split("\n")[0].strip()
        if not found:
            summary = "Missing expression: the argument has = but no value after it on its line"
        else:
            summary = (
                "Invalid expression: expected the start of an expression (a number, a string in quotes, true, "
                "false, null, a [list], an {object}, a variable or a function call), found " + _quote(found.split()[0])
            )
    elif kind == "RBRACE" and expected <= {"$END"}:
        summary = "Unexpected closing brace: this } closes no block (one too many, or a block above was closed early)"
    elif "RPAR" in expected or "RSQB" in expected:
        opener = "(" if "RPAR" in expected else "["
        where = _unclosed(text, opener, line)
        summary = (
            f"Unclosed {opener}: there is no closing {_CLOSE[opener]} for the {opener} opened here (before {first})"
        )
        if where is not None:
            line, column = where
    elif kind == "COMMA":
        summary = "Missing newline after argument: an argument ends at the end of its line, not with a comma"
    elif kind == "LBRACE":
        summary = (
            "Missing newline after argument: an argument ends at the end of its line; a block is written "
            'name "label" { … }, without ='
        )
    elif "NAME" in expected or "RBRACE" in expected:
        summary = (
            f"Argument or block definition required: a body holds arguments (name = value) and blocks "
            f"(name {{ … }}), not {first}"
        )
    else:
        summary = f"Invalid syntax: {first} is not expected here"
    if kind == "COMMA" or (summary.startswith(("Missing newline", "Argument or block")) and _HCL1_COMMA.search(text)):
        summary += "; " + hcl1_hint("FILE", "commas after arguments")
    excerpt = lines[line - 1].strip() if line is not None and 0 < line <= len(lines) else ""
    return SyntaxFacts(summary, line, column, excerpt)


# Where the HCL1 hint starts in a summary (jobhcl1 words it again with the file's name).
HCL1_MARK = "the file looks like HCL1"


def hcl1_hint(file: str, why: str = "") -> str:
    """That the file looks like HCL1 (for ``why``), as Nomad 1.0-1.5 ran such files with
    ``-hcl1``, and the flag that reads it so (the file's name quoted as a shell would need it)."""
    file = shlex.quote(file)
    return (
        f"{HCL1_MARK}{f' ({why})' if why else ''}, as older Nomad versions ran it with -hcl1: read it so with "
        f"`driversdk run -hcl1 {file}` (or `driversdk validate -hcl1 {file}`), or rewrite it as HCL2"
    )


def _quote(text: str, limit: int = 80) -> str:
    """Source text in backticks, as written: control characters escaped (they could forge lines
    of the output) and shortened."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text).replace("`", "'")
    return f"`{out if len(out) <= limit else out[:limit] + '…'}`"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def _before(lines: list[str], line: int | None, column: int | None) -> str:
    if line is None or column is None or not 0 < line <= len(lines):
        return ""
    return lines[line - 1][: column - 1]


def _rest(lines: list[str], line: int | None, column: int | None) -> str:
    if line is None or column is None or not 0 < line <= len(lines):
        return ""
    return lines[line - 1][column - 1 :]


def _previous_line(lines: list[str], line: int | None) -> tuple[int | None, int | None]:
    if line is None:
        return None, None
    n = min(line, len(lines))
    # The error is reported at the token after the labels: the line that has them is the last
    # non-blank one before it (or its own, when a brace follows on the same line).
    while n > 1 and not lines[n - 2].strip():
        n -= 1
    n = max(n - 1, 1)
    text = lines[n - 1]
    return n, len(text) - len(text.lstrip()) + 1


def _at_end(text: str, expected: set[str], line: int | None, column: int | None) -> tuple[str, int | None, int | None]:
    """The file ended inside something: a string, a block, a list or parentheses."""
    if expected & {"DBLQUOTE", "STRING_CHARS"}:
        return "Unterminated template string: the string has no closing quote before the end of its line", line, column
    for opener, closer, name in (("{", "RBRACE", "configuration block"), ("[", "RSQB", "list"), ("(", "RPAR", "(")):
        if closer in expected:
            where = _unclosed(text, opener, None)
            if where is not None:
                return f"Unclosed {name}: there is no closing {_CLOSE[opener]} for the {opener} opened here", *where
            return f"Unclosed {name}: the file ends before its closing {_CLOSE[opener]}", line, column
    return "Unexpected end of file: something opened above is not finished", line, column


_CLOSE = {"{": "}", "[": "]", "(": ")"}


def _inner_open(text: str, before: int | None) -> tuple[str, int, int] | None:
    """The innermost ``[`` or ``(`` still open at line ``before``, when it is inside the last open
    ``{`` (so the ``}`` there cannot close it)."""
    found = [(o, *w) for o in "[(" if (w := _unclosed(text, o, before)) is not None]
    brace = _unclosed(text, "{", before)
    found = [f for f in found if brace is None or (f[1], f[2]) > brace]
    return max(found, key=lambda f: (f[1], f[2])) if found else None


def _unclosed(text: str, opener: str, before: int | None) -> tuple[int, int] | None:
    """Line and column of the innermost ``opener`` still open at line ``before`` (or at the end),
    skipping strings, comments and heredocs."""
    stack: list[tuple[str, int, int]] = []
    i, line, col, n = 0, 1, 1, len(text)
    heredoc: str | None = None
    while i < n:
        if before is not None and line >= before:
            break
        c = text[i]
        if heredoc is not None:
            end = text.find("\n", i)
            end = n if end < 0 else end
            if text[i:end].strip() == heredoc:
                heredoc = None
            i, line, col = end + 1, line + 1, 1
            continue
        if c == "\n":
            i, line, col = i + 1, line + 1, 1
            continue
        if c == "#" or text.startswith("//", i):
            end = text.find("\n", i)
            i, col = (n, col) if end < 0 else (end, col + end - i)
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
            continue
        if text.startswith("<<", i):
            match = re.match(r"<<-?([A-Za-z_]\w*)[ \t]*\n", text[i:])
            if match:
                heredoc = match.group(1)
                i, line, col = i + match.end(), line + 1, 1
                continue
        if c == '"':
            j = i + 1
            while j < n and text[j] not in '"\n':
                j += 2 if text[j] == "\\" else 1
            col += j + 1 - i
            i = j + 1
            continue
        if c in "{[(":
            stack.append((c, line, col))
        elif c in "}])" and stack and _CLOSE[stack[-1][0]] == c:
            stack.pop()
        i, col = i + 1, col + 1
    for kind, at_line, at_col in reversed(stack):
        if kind == opener:
            return at_line, at_col
    return None


# pyhcl's (HCL1, the agent config's parser) token names, as the text they stand for.
_HCL1_TOKENS = {"RIGHTBRACE": "}", "LEFTBRACE": "{", "RIGHTBRACKET": "]", "LEFTBRACKET": "[", "COMMA": ",",
                "EQUAL": "=", "PERIOD": ".", "COLON": ":", "STRING": "a string", "IDENTIFIER": "a name",
                "NUMBER": "a number", "FLOAT": "a number", "BOOL": "true or false"}  # fmt: skip
_HCL1_ERROR = re.compile(r"^Line (\d+), column (\d+)(?:, index (\d+))?: (.*)$")


def describe_hcl1(message: str, text: str) -> SyntaxFacts:
    """pyhcl's error message in HCL's terms: its token names (RIGHTBRACE …) never reach an operator."""
    lines = text.split("\n")
    found = _HCL1_ERROR.match(message.strip().splitlines()[0] if message.strip() else "")
    line: int | None = int(found.group(1)) if found else None
    column: int | None = None
    what = found.group(4) if found else message.strip().splitlines()[0] if message.strip() else ""
    if found and found.group(3):  # the lexer's: an absolute index, from which the column follows
        index = int(found.group(3))
        column = index - text.rfind("\n", 0, index)
    unexpected = re.match(r"unexpected (\w+); expected (.*)$", what)
    if what.startswith("Unexpected end of file") or (unexpected and "$end" not in what and "RIGHTBRACE" in what and
                                                     unexpected.group(1) == "$end"):  # fmt: skip
        where = _unclosed(text, "{", None)
        if where is not None:
            line, column = where
            summary = "Unclosed configuration block: there is no closing } for the { opened here"
        else:
            summary = "Unexpected end of file: something opened above is not finished"
    elif "before closing string quote" in what:
        summary = "Unterminated string: a string has no closing quote"
        line = _last_quote_line(text) or line
    elif illegal := re.match(r"Illegal character '(.*)'", what):
        summary = f"Invalid character: {_quote(illegal.group(1))} cannot appear here"
    elif unexpected:
        token = unexpected.group(1)
        shown = _HCL1_TOKENS.get(token, "this text")
        expected = unexpected.group(2)
        if line is not None and 0 < line <= len(lines) and len(shown) == 1 and shown in lines[line - 1]:
            column = lines[line - 1].index(shown) + 1
        if token == "RIGHTBRACE" and "$end" in expected:
            summary = (
                "Unexpected closing brace: this } closes no block (one too many, or a block above was closed early)"
            )
        elif "RIGHTBRACKET" in expected:
            where = _unclosed(text, "[", line)
            summary = "Unclosed list: there is no closing ] for the [ opened here"
            if where is not None:
                line, column = where
        elif "EQUAL" in expected or "ADD" in expected:
            # pyhcl stops at the token after the argument (often the next line's): the line before has it.
            if token in ("RIGHTBRACE", "IDENTIFIER"):
                line, column = _previous_line(lines, line)
            summary = "Missing equals sign: an argument needs = between its name and its value"
        else:
            summary = f"Invalid syntax: {shown} is not expected here"
    else:
        summary = "Invalid syntax: this is not HCL"
    excerpt = lines[line - 1].strip() if line is not None and 0 < line <= len(lines) else ""
    return SyntaxFacts(summary, line, column, excerpt)


def _last_quote_line(text: str) -> int | None:
    """The line of the first string that is not closed on its own line."""
    for n, line in enumerate(text.split("\n"), 1):
        bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", line.split("#")[0])
        if '"' in bare:
            return n
    return None
