"""Job files in HCL1, read with ``-hcl1`` as Nomad 1.0-1.5 read them (jobspec v1 over HCL v1).

HCL1 allows what HCL2 refuses: quoted keys (``meta { "version" = "2" }``), commas between
arguments, blocks written ``key { … }`` or ``key = { … }``, and no variables, locals or
functions (``${…}`` is left as written, for the runtime interpolation of NOMAD_*, attr, meta and
env, as an HCL2 job written for runtime interpolation leaves it). The file is parsed with pyhcl,
the maintained HCL1 parser the client config is read with, and its nested dicts are turned into
the body the HCL2 evaluator produces (a block is a list of bodies, a labelled one ``{label:
body}``), so the job schema's checks, did-you-means and problems are the ones an HCL2 job gets.
pyhcl keeps no positions: what is found in an HCL1 job carries no line.

Without ``-hcl1``, a file that is not HCL2 but reads as HCL1 says so, naming the flag.
"""

from __future__ import annotations

from typing import Any

from driversdk.jobspec import jobschema
from driversdk.jobspec.hcl import Body, Document, EvalError, HCLSyntaxError, Inputs, evaluate
from driversdk.jobspec.hcl.syntax import HCL1_MARK, SyntaxFacts, describe_hcl1, hcl1_hint
from driversdk.jobspec.hcllimits import MAX_VALUE_DEPTH, Budget
from driversdk.jobspec.hclload import HCLFileError


def wants_hcl1(inputs: Inputs | None) -> bool:
    from driversdk.jobspec.jobjson import JobInputs

    return isinstance(inputs, JobInputs) and inputs.hcl1


def document(path: str, text: str, inputs: Inputs | None) -> Document:
    """The evaluated document of a job file: HCL1 with ``-hcl1``, else HCL2 (whose syntax error,
    for a file that reads as HCL1, names ``-hcl1``)."""
    if wants_hcl1(inputs):
        return _hcl1_document(path, text)
    try:
        return evaluate(path, text, inputs)
    except HCLSyntaxError as err:
        if _parse(text) is None:
            raise  # neither HCL2 nor HCL1: HCL2's own error
        raise _hinted(path, err) from None


def _hinted(path: str, err: HCLSyntaxError) -> HCLFileError:
    """HCL2's syntax error, then that the file reads as HCL1 and how to run it so: one sentence."""
    summary = err.summary.split("; " + HCL1_MARK)[0]  # the generic hint, said here with the file's name
    line, column = getattr(err, "line", None), getattr(err, "column", None)
    where = f"{path}:{line}:{column}" if line and column else f"{path}:{line}" if line else path
    sentence = SyntaxFacts(summary, line, column, err.excerpt).sentence()
    return HCLFileError(f"{where}: {sentence}; {hcl1_hint(path)}", path, line or 0)


def _parse(text: str) -> Any:
    """What pyhcl parses ``text`` to, or None when it is no HCL1 either."""
    try:
        return _loads(text)
    except Exception:  # pyhcl raises ValueError (and its lexer's errors) for any syntax problem
        return None


def _loads(text: str) -> Any:
    """pyhcl's parse of ``text`` on the process's one parser (its tables cached by parsecache),
    with heredocs ending in their last newline as HCL1 ends them (pyhcl drops it; Nomad's HCL1
    keeps it, as HCL2 does)."""
    from driversdk.jobspec import parsecache

    lexer = _heredoc_lexer()()
    with parsecache._hcl1_lock:  # PLY keeps its stacks on the parser: parses take turns
        return parsecache._hcl1_parser().yacc.parse(text, lexer=lexer)


def _heredoc_lexer() -> Any:
    from hcl.lexer import Lexer

    class HeredocLexer(Lexer):  # type: ignore[misc]
        def _end_heredoc(self, t: Any) -> Any:
            closing, start, lexer = t.value, t.lexer.here_start, t.lexer
            token = super()._end_heredoc(t)
            if token is None:
                return None
            if lexer.is_tabbed and closing.strip() == lexer.here_identifier:
                # <<- as HCL1 unindents it: by the closing marker's indentation (spaces or tabs),
                # when every line has it; pyhcl strips leading tabs only.
                raw = lexer.lexdata[start : lexer.lexpos - lexer.newline_chars - len(closing)]
                indent = closing[: len(closing) - len(closing.lstrip())]
                lines = raw.split("\n")
                if all(line.startswith(indent) for line in lines):
                    token.value = "\n".join(line[len(indent) :] for line in lines)
                else:
                    token.value = raw
            token.value += "\n"
            return token

    return HeredocLexer


def _hcl1_document(path: str, text: str) -> Document:
    try:
        data = _loads(text)
    except ImportError as err:
        raise ImportError(f"pyhcl (module 'hcl') does not import: {err}", name="hcl") from err
    except RecursionError:
        raise HCLFileError(f"{path}: the HCL1 nests too deeply to read; flatten it", path) from None
    except Exception as err:  # pyhcl raises ValueError (and its lexer's errors) for any syntax problem
        facts = describe_hcl1(str(err), text)
        where = ":".join(str(p) for p in (path, facts.line, facts.column) if p)
        raise HCLFileError(f"{where}: {facts.sentence()} (read as HCL1, with -hcl1)", path, facts.line or 0) from None
    if not isinstance(data, dict):
        raise HCLFileError(f"{path}: this HCL1 file has no body of arguments and blocks", path)
    # Measured without recursion: what walks the body next (this module, the schema, the parser) recurses.
    depth = Budget().size(data).depth
    if depth > MAX_VALUE_DEPTH:
        raise HCLFileError(
            f"{path}: the HCL1 nests {depth} blocks and maps deep, more than the {MAX_VALUE_DEPTH} read; flatten it",
            path,
        )
    errors: list[EvalError] = []
    top = Body()
    for key, value in data.items():
        if key != "job":
            errors.append(EvalError(0, "", f'unexpected "{_key(key)}" at the top of a job file; it holds a job block'))
            continue
        jobs: list[Any] = []
        for item in _items(value):
            for label, inner in item.items():
                if isinstance(inner, dict):
                    jobs.append({_key(label): _body(inner, jobschema.JOB)})
                else:
                    errors.append(
                        EvalError(0, "", 'the job block needs one label, the job\'s name: job "example" { … }')
                    )
        top["job"] = jobs
    return Document(None if errors else top, errors)


def _key(key: Any) -> str:
    # pyhcl reads `a+1 = …` as a tuple of its parts; HCL1 has no such key, but it is named as written.
    return "".join(map(str, key)) if isinstance(key, tuple) else str(key)


def _items(value: Any) -> list[dict[str, Any]]:
    """pyhcl's value of a block written once (a dict) or repeated (a list of dicts) as a list;
    anything else (``key = 5`` where a block belongs) is no block."""
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return value
    return []


def _body(obj: dict[str, Any], spec: jobschema.Block) -> Body:
    body = Body()
    for key, value in obj.items():
        name = _key(key)
        child = spec.fields.get(name)
        if isinstance(child, jobschema.Attr):
            body[name] = value
        elif isinstance(child, jobschema.Block):
            body[name] = _block(value, child)
        else:
            body[name] = _free(value)  # no such field: the schema names it, with a did-you-mean
    return body


def _block(value: Any, spec: jobschema.Block) -> Any:
    """A block as the evaluator writes it: a list of bodies, a labelled one as ``{label: body}``."""
    items = _items(value)
    if not items:
        return value  # the schema says a block belongs here
    out: list[Any] = []
    for item in items:
        out.extend(_free(item) if spec.open else _labelled(item, spec, spec.labels))
    return out


def _labelled(item: dict[str, Any], spec: jobschema.Block, labels: int) -> list[Any]:
    if labels == 0:
        return [_body(item, spec)]
    out: list[Any] = []
    for label, inner in item.items():
        inners = _items(inner)
        if not inners:
            out.append({_key(label): inner})  # no body under the label: the schema says how many labels it takes
        for one in inners:
            out.extend({_key(label): b} for b in _labelled(one, spec, labels - 1))
    return out


def _free(value: Any) -> Any:
    """A value no schema describes (meta, env, a driver's config): a nested object is a block, as
    HCL1 wrote it (``port_map { http = 80 }``) and as Nomad's HCL1 decoding passed it on."""
    items = _items(value)
    if not items:
        return value
    out = []
    for item in items:
        body = Body()
        body.update({_key(k): _free(v) for k, v in item.items()})
        out.append(body)
    return out
