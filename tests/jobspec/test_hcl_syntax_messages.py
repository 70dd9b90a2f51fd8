"""Syntax errors said in HCL's terms: file:line:column, what is wrong as HCL names it, and the
offending text; never a parser's token name (``Token('DBLQUOTE', '"')``, ``RIGHTBRACE``)."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from driversdk.jobspec.clientconfig import load_client
from driversdk.jobspec.hclload import HCLFileError, load_hcl
from driversdk.jobspec.job import parse_job

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.hcl"))

# Any of these in a message is the parser's language, not HCL's.
PARSER_WORDS = re.compile(
    r"Token\(|Expected one of|\$END|DBLQUOTE|RBRACE|LBRACE|RSQB|LSQB|STRING_CHARS|NL_OR_COMMENT|INT_LITERAL|"
    r"RIGHTBRACE|LEFTBRACE|RIGHTBRACKET|IDENTIFIER|Previous tokens|Unexpected token"
)

# (name, job text, the HCL summary's start, line, column, offending text)
CASES = [
    ("quoted argument name", 'job "x" {\n  "driver" = "docker"\n}\n', "Invalid argument name", 2, 3,
     '`"driver" = "docker"`'),
    ("missing = before a number", 'job "x" {\n  count 3\n}\n', "Missing equals sign", 2, 9, "`count 3`"),
    ("missing = before a string", 'job "x" {\n  driver "docker"\n}\n', "Missing equals sign or block body", 2, 3,
     '`driver "docker"`'),
    ("colon for =", 'job "x" {\n  count: 3\n}\n', "Missing equals sign", 2, 8, "`count: 3`"),
    ("unclosed block", 'job "x" {\n  group "g" {\n    count = 1\n  }\n', "Unclosed configuration block", 1, 9,
     '`job "x" {`'),
    ("unclosed string", 'job "x" {\n  datacenters = ["dc1]\n}\n', "Unterminated template string", 2, None,
     '`datacenters = ["dc1]`'),
    ("unclosed heredoc", 'job "x" {\n  meta = <<EOT\nhello\n}\n', "Unclosed heredoc", 2, 10, "`meta = <<EOT`"),
    ("invalid expression", 'job "x" {\n  count = *3\n}\n', "Invalid expression", 2, 11, "`count = *3`"),
    ("missing value", 'job "x" {\n  count =\n}\n', "Missing expression", 2, None, "`count =`"),
    ("newline after argument (block with =)", 'job "x" {\n  group = "g" {\n  }\n}\n',
     "Missing newline after argument", 2, 15, '`group = "g" {`'),
    ("stray closing brace", 'job "x" {\n}\n}\n', "Unexpected closing brace", 3, 1, "`}`"),
    ("stray token", 'job "x" {\n  count = 1\n  ]\n}\n', "Argument or block definition required", 3, 3, "`]`"),
    ("stray character", 'job "x" {\n  count = 1\n  @\n}\n', "Argument or block definition required", 3, 3,
     "`@`"),
    ("unclosed list", 'job "x" {\n  datacenters = ["dc1",\n}\n', "Unclosed [", 2, 17,
     '`datacenters = ["dc1",`'),
    ("unclosed interpolation", 'job "x" {\n  name = "${foo"\n}\n', "Unclosed template interpolation", 2, None,
     '`name = "${foo"`'),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "summary", "line", "column", "excerpt"), CASES, ids=[c[0] for c in CASES])
def test_each_kind_of_syntax_error_in_hcl_terms(
    tmp_path: Path, name: str, text: str, summary: str, line: int, column: int | None, excerpt: str
) -> None:
    path = tmp_path / "job.hcl"
    path.write_text(text)
    with pytest.raises(HCLFileError) as caught:
        parse_job(path)
    message = str(caught.value)
    where = f"{path}:{line}:{column}: " if column else f"{path}:{line}:"
    assert message.startswith(where), message
    assert f": {summary}" in message, message
    # A file that reads as HCL1 (a quoted name, name: value) goes on to name -hcl1 (tests/jobspec/test_hcl1.py).
    assert message.split("; the file looks like HCL1")[0].endswith(f"in {excerpt}"), message
    assert not PARSER_WORDS.search(message), message
    assert caught.value.line == line


def test_an_hcl1_job_gets_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "old.hcl"
    path.write_text('job "x" {\n  update {\n    stagger = "10s",\n    max_parallel = 1,\n  }\n}\n')
    with pytest.raises(HCLFileError) as caught:
        parse_job(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:3:") and "Missing newline after argument" in message
    assert "looks like HCL1" in message and "-hcl1" in message


def test_the_cli_says_it_in_hcl_terms_with_its_line_in_json(tmp_path: Path) -> None:
    path = tmp_path / "web.hcl"
    path.write_text('job "web" {\n  group "g" {\n    task "t" {\n      "driver" = "docker"\n    }\n  }\n}\n')
    run = [sys.executable, "-m", "driversdk.cli", "validate", str(path)]
    done = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"error: {path}:4:7: Invalid argument name: argument names must not be quoted; write the name without "
        'quotes, in `"driver" = "docker"`; the file looks like HCL1, as older Nomad versions ran it with -hcl1: '
        f"read it so with `driversdk run -hcl1 {path}` (or `driversdk validate -hcl1 {path}`), or rewrite it as HCL2"
    )
    import json

    done = subprocess.run([*run, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    (problem,) = json.loads(done.stdout)["problems"]
    assert problem["file"] == str(path) and problem["line"] == 4


CLIENT_CASES = [
    ("client {\n  host_volume \"x\" {\n    path = \"/a\"\n  }\n", "Unclosed configuration block", 1),
    ("client {\n  a 1\n}\n", "Missing equals sign", 2),
    ("client {\n  a = \"x\n}\n", "Unterminated string", 2),
    ("client {\n  a = @\n}\n", "Invalid character", 2),
    ("client {\n}\n}\n", "Unexpected closing brace", 3),
    ("client {\n  a = [1,\n}\n", "Unclosed list", 2),
]  # fmt: skip


@pytest.mark.parametrize(("text", "summary", "line"), CLIENT_CASES)
def test_client_config_syntax_errors_in_hcl_terms(tmp_path: Path, text: str, summary: str, line: int) -> None:
    path = tmp_path / "client.hcl"
    path.write_text(text)
    with pytest.raises(HCLFileError) as caught:
        load_client(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}:") and f": {summary}" in message, message
    assert not PARSER_WORDS.search(message), message


def _mutations(text: str, rng: random.Random) -> list[str]:
    """Ways to break a good file: each a common slip of a hand editing it."""
    lines = text.split("\n")
    out = []
    args = [i for i, line in enumerate(lines) if re.match(r"^\s*[a-z_]+\s*=\s*\S", line)]
    closers = [i for i, line in enumerate(lines) if line.strip() == "}"]
    if args:
        i = rng.choice(args)
        out.append(_with(lines, i, re.sub(r"^(\s*)([a-z_]+)", r'\1"\2"', lines[i])))  # quoted name
        out.append(_with(lines, i, lines[i].replace("=", " ", 1)))  # missing =
        out.append(_with(lines, i, lines[i].rstrip() + ","))  # HCL1's comma
        out.append(_with(lines, i, lines[i].split("=")[0] + "= *"))  # invalid expression
        out.append(_with(lines, i, lines[i].split("=")[0] + '= "open'))  # unclosed string
    if closers:
        out.append("\n".join(lines[: closers[-1]] + lines[closers[-1] + 1 :]))  # unclosed block
        out.append(text + "}\n")  # one brace too many
    out.append(text[: rng.randrange(1, max(len(text), 2))])  # cut off anywhere
    at = rng.randrange(len(lines))
    out.append("\n".join([*lines[:at], "  @@", *lines[at:]]))  # a stray token
    return out


def _with(lines: list[str], i: int, new: str) -> str:
    return "\n".join([*lines[:i], new, *lines[i + 1 :]])


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_broken_fixtures_never_show_parser_tokens(tmp_path: Path, fixture: Path) -> None:
    """Every good fixture, broken mechanically (seeded): whatever the parser says, the message is
    HCL's, at file:line:column within the file, with the text there."""
    rng = random.Random(fixture.name)
    text = fixture.read_text()
    for n, broken in enumerate(_mutations(text, rng)):
        path = tmp_path / f"{n}.hcl"
        path.write_text(broken)
        for read in (parse_job, load_hcl):
            try:
                read(path)
            except HCLFileError as err:
                message = str(err)
            else:
                continue  # a slip that is still HCL (a cut at the end of a block, say)
            assert not PARSER_WORDS.search(message), (broken, message)
            found = re.match(rf"^{re.escape(str(path))}:(\d+):(\d+): [A-Z]", message)
            assert found, message
            assert 1 <= int(found.group(1)) <= broken.count("\n") + 1, message
            assert "\n" not in message
