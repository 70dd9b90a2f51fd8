"""A whole HCL2 job file evaluated as Nomad's jobspec2 does: ``variable``/``variables`` blocks
with values from NOMAD_VAR_* env, var files and ``-var`` (in that order, the last wins), their
type constraints and validation rules, ``locals``, then the ``job`` block with ``dynamic``
blocks expanded.

The result keeps python-hcl2's shape (a block is a list of bodies; a labelled block is
``[{label: body}]``) so the job parser reads it like any HCL file, with each body's lines kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from difflib import get_close_matches

from driversdk.jobspec.hcl.evaluator import (
    Body,
    EvalError,
    Evaluator,
    HCLSyntaxError,
    Scope,
    Source,
    kids,
    line_of,
    name_of,
    parse,
    trees,
    type_expr,
)
from driversdk.jobspec.hcl.files import FilePolicy, FileReader
from driversdk.jobspec.hcl.functions import FunctionError, table
from driversdk.jobspec.hcl.tree import Tree
from driversdk.jobspec.hcl.values import ConvertError, Type, Value, convert, show_type, to_string, type_name, type_of
from driversdk.jobspec.hcllimits import MAX_JOB_FILE_BYTES, Budget, LimitError

VAR_ENV_PREFIX = "NOMAD_VAR_"
TOP_LEVEL = ("variable", "variables", "locals", "job")


@dataclass
class Inputs:
    """What a job file may take from outside itself: variable values, and where its file
    functions may read (nowhere unless the caller says: a job sent over an API reads nothing of
    the host; ``driversdk validate`` / ``run`` pass ``FilePolicy.beside(job_path)``)."""

    vars: Sequence[str] = ()  # -var K=V, in order
    var_files: Sequence[str] = ()  # -var-file FILE, in order
    var_texts: Sequence[tuple[str, str]] = ()  # (name, content) of var files sent over the API, after var_files
    env: Mapping[str, str] = field(default_factory=dict)  # NOMAD_VAR_<name>
    files: FilePolicy = field(default_factory=FilePolicy.none)


@dataclass
class Variable:
    name: str
    line: int
    type: Type | None = None
    description: str = ""
    values: list[tuple[str, Value]] = field(default_factory=list)  # (from, value)
    validations: list[tuple[Tree, str, int]] = field(default_factory=list)


@dataclass
class Document:
    body: Body | None
    errors: list[EvalError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    variables: dict[str, Value] = field(default_factory=dict)
    locals: dict[str, Value] = field(default_factory=dict)


class _Literal(Scope):
    """Where only literal values are allowed (defaults, var files): no variables, no functions."""


def _literal_scope() -> Scope:
    return _Literal({}, {})


class _DocEvaluator(Evaluator):
    def e_identifier(self, node: Tree, scope: Scope) -> Value:
        if isinstance(scope, _Literal):
            raise self.fail(node, "variables may not be used here; give a literal value")
        return super().e_identifier(node, scope)

    def _unknown_root(self, node: Tree, scope: Scope) -> str | None:
        if isinstance(scope, _Literal):
            raise self.fail(node, "variables may not be used here; give a literal value")
        return super()._unknown_root(node, scope)

    def e_function_call(self, node: Tree, scope: Scope) -> Value:
        if isinstance(scope, _Literal):
            raise self.fail(node, "functions may not be called here; give a literal value")
        return super().e_function_call(node, scope)


class _Run:
    def __init__(self, path: str, text: str, inputs: Inputs) -> None:
        self.path = path
        self.inputs = inputs
        self.budget = Budget()
        self.source = Source(text, parse(text, keep=True))
        self.ev = _DocEvaluator(self.source, self.budget)
        self.functions = table(FileReader(inputs.files, self.budget, FunctionError))
        self.doc = Document(None)

    def error(self, err: EvalError) -> None:
        self.doc.errors.append(err)

    # --- bodies ----------------------------------------------------------------------------------

    def body(self, node: Tree, scope: Scope, line: int = 0) -> Body:
        out = Body(line or self.ev.line(node))
        blocks_seen: set[str] = set()
        for child in trees(node):
            if child.data == "attribute":
                parts = trees(child)
                name = name_of(parts[0])
                if name in out:
                    where = "a block" if name in blocks_seen else "an argument"
                    self.error(self.ev.fail(child, f'"{name}" is already defined as {where} in this body'))
                    continue
                try:
                    out[name] = self.ev.value(parts[-1], scope)
                except EvalError as err:
                    self.error(err)
                    out[name] = None
                try:  # what the job parser, the schema and the drivers will walk
                    self.budget.charge(out[name], f'the value of "{name}"')
                except LimitError as err:
                    raise self.ev.over(child, err) from None
                out.lines[name] = self.ev.line(child)
            elif child.data == "block":
                for kind, labels, inner in self.block(child, scope):
                    if kind in out and kind not in blocks_seen:
                        self.error(self.ev.fail(child, f'"{kind}" is already defined as an argument in this body'))
                        continue
                    blocks_seen.add(kind)
                    value: Value = inner
                    for label in reversed(labels):
                        value = {label: value}
                    out.blocks(kind).append(value)
                    out.lines.setdefault(kind, inner.line)
        return out

    def block(self, node: Tree, scope: Scope) -> list[tuple[str, list[str], Body]]:
        parts = trees(node)
        kind = name_of(parts[0])
        labels = [name_of(p) for p in parts[1:] if p.data != "body"]
        inner = next(p for p in parts if p.data == "body")
        if kind != "dynamic":
            return [(kind, labels, self.body(inner, scope, self.ev.line(node)))]
        return self.dynamic(node, labels, inner, scope)

    def dynamic(self, node: Tree, labels: list[str], inner: Tree, scope: Scope) -> list[tuple[str, list[str], Body]]:
        if len(labels) != 1:
            self.error(self.ev.fail(node, 'a dynamic block needs one label, the block type: dynamic "port" { … }'))
            return []
        kind = labels[0]
        attrs = {name_of(trees(c)[0]): trees(c)[-1] for c in trees(inner) if c.data == "attribute"}
        contents = [c for c in trees(inner) if c.data == "block" and name_of(trees(c)[0]) == "content"]
        unknown = sorted(set(attrs) - {"for_each", "iterator", "labels"})
        others = [c for c in trees(inner) if c.data == "block" and name_of(trees(c)[0]) != "content"]
        for name in unknown:
            self.error(
                self.ev.fail(node, f'dynamic "{kind}": unexpected argument "{name}"; use for_each, iterator, labels')
            )
        for other in others:
            self.error(
                self.ev.fail(other, f'dynamic "{kind}": unexpected block; the block body goes in content {{ … }}')
            )
        if "for_each" not in attrs or len(contents) != 1:
            self.error(self.ev.fail(node, f'dynamic "{kind}" needs for_each = … and exactly one content {{ … }} block'))
            return []
        iterator = kind
        if "iterator" in attrs:
            it = attrs["iterator"]
            only = trees(it)
            if it.data != "expr_term" or len(only) != 1 or only[0].data != "identifier":
                self.error(self.ev.fail(it, "iterator must be a bare name"))
                return []
            iterator = str(only[0].children[0])
        try:
            collection = self.ev.value(attrs["for_each"], scope)
        except EvalError as err:
            self.error(err)
            return []
        if isinstance(collection, dict):
            pairs: list[tuple[str | int, Value]] = [*sorted(collection.items())]
        elif isinstance(collection, list):
            pairs = list(enumerate(collection))
        else:
            self.error(
                self.ev.fail(attrs["for_each"], f"for_each needs a list, set or map, not {type(collection).__name__}")
            )
            return []
        label_nodes: list[Tree] = []
        if "labels" in attrs:
            listed = self.label_expressions(kind, attrs["labels"])
            if listed is None:
                return []
            label_nodes = listed
        content_body = next(p for p in trees(contents[0]) if p.data == "body")
        out = []
        for key, value in pairs:
            inner_scope = scope.child(**{iterator: {"key": key, "value": value}})
            block_labels = self.labels(kind, label_nodes, inner_scope)
            if block_labels is None:
                continue
            out.append((kind, block_labels, self.body(content_body, inner_scope, self.ev.line(contents[0]))))
        return out

    def label_expressions(self, kind: str, node: Tree) -> list[Tree] | None:
        """The expressions of a dynamic block's ``labels``, which HCL wants written out as a list
        (``[a, b]``), one expression a label: not a value that happens to be a list."""
        inner = trees(node)
        if node.data == "expr_term" and len(inner) == 1 and inner[0].data == "tuple":
            return trees(inner[0])
        written = "labels must be a list written out, one expression a label, as labels = [each.key]"
        self.error(self.ev.fail(node, f'dynamic "{kind}": {written}'))
        return None

    def labels(self, kind: str, nodes: list[Tree], scope: Scope) -> list[str] | None:
        """One generated block's labels as strings, converted as cty converts (3 → "3", true →
        "true"); None, with the error kept, when one is null or no string can stand for it."""
        out: list[str] = []
        for number, node in enumerate(nodes, 1):
            try:
                label = self.ev.value(node, scope)
            except EvalError as err:
                self.error(err)
                return None
            if label is None:
                why = f"label {number} is null, and a block label cannot be; give a string"
                self.error(self.ev.fail(node, f'dynamic "{kind}": {why}'))
                return None
            try:
                out.append(to_string(label))
            except ConvertError:
                why = f"label {number} is a {type_name(label)}, and a block label must be a string, number or bool"
                self.error(self.ev.fail(node, f'dynamic "{kind}": {why}'))
                return None
        return out

    # --- the file --------------------------------------------------------------------------------

    def run(self) -> Document:
        top = trees(trees(self.source.tree)[0])
        variables: dict[str, Variable] = {}
        locals_nodes: list[tuple[str, Tree]] = []
        jobs: list[Tree] = []
        for child in top:
            if child.data == "attribute":
                name = name_of(trees(child)[0])
                self.error(
                    self.ev.fail(
                        child,
                        f'unexpected argument "{name}" at the top of a job file; it holds variable, '
                        "locals and job blocks",
                    )
                )
                continue
            kind = name_of(trees(child)[0])
            labels = [name_of(p) for p in trees(child)[1:] if p.data != "body"]
            inner = next(p for p in trees(child) if p.data == "body")
            if kind == "variable":
                self.variable_block(child, labels, inner, variables)
            elif kind == "variables":
                for attr in trees(inner):
                    if attr.data != "attribute":
                        continue
                    name = name_of(trees(attr)[0])
                    if name in variables:
                        self.error(self.ev.fail(attr, f'variable "{name}" is declared twice'))
                        continue
                    var = Variable(name, self.ev.line(attr))
                    try:
                        value = self.ev.value(trees(attr)[-1], _literal_scope())
                        var.values.append(("default", value))
                        var.type = type_of(value)
                    except EvalError as err:
                        self.error(err)
                    variables[name] = var
            elif kind == "locals":
                for attr in trees(inner):
                    if attr.data == "attribute":
                        name = name_of(trees(attr)[0])
                        if any(n == name for n, _ in locals_nodes):
                            self.error(self.ev.fail(attr, f'local "{name}" is defined twice'))
                            continue
                        locals_nodes.append((name, attr))
            elif kind == "job":
                if len(labels) != 1:
                    self.error(self.ev.fail(child, 'a job block needs one label, its name: job "example" { … }'))
                    continue
                jobs.append(child)
            else:
                close = get_close_matches(kind, TOP_LEVEL, n=1)
                hint = (
                    f'; did you mean "{close[0]}"?' if close else "; a job file holds variable, locals and job blocks"
                )
                self.error(self.ev.fail(child, f'unsupported block type "{kind}" at the top of a job file{hint}'))
        self.collect_values(variables)
        values = self.variable_values(variables)
        self.doc.variables = values
        if self.doc.errors:
            return self.doc
        local_values = self.locals(locals_nodes, values)
        self.doc.locals = local_values
        if self.doc.errors:
            return self.doc
        scope = Scope({"var": values, "local": local_values}, self.functions)
        out = Body(1)
        if not jobs:
            self.doc.errors.append(EvalError(1, "", 'a job file needs a job block: job "example" { … }'))
        for index, job in enumerate(jobs):
            if index > 0:
                self.error(self.ev.fail(job, "only one job block is allowed in a job file"))
                continue
            for kind, labels, inner_body in self.block(job, scope):
                out.blocks(kind).append({labels[0]: inner_body})
                out.lines[kind] = inner_body.line
        self.doc.body = out
        return self.doc

    def variable_block(self, node: Tree, labels: list[str], inner: Tree, variables: dict[str, Variable]) -> None:
        if len(labels) != 1:
            self.error(self.ev.fail(node, 'a variable block needs one label, its name: variable "image" { … }'))
            return
        name = labels[0]
        if name in variables:
            self.error(self.ev.fail(node, f'variable "{name}" is declared twice'))
            return
        var = Variable(name, self.ev.line(node))
        attrs = {name_of(trees(c)[0]): c for c in trees(inner) if c.data == "attribute"}
        for key in sorted(set(attrs) - {"type", "default", "description"}):
            self.error(self.ev.fail(attrs[key], f'variable "{name}": unexpected argument "{key}"; use type, default, '
                                    "description and validation { … }"))  # fmt: skip
        try:
            if "type" in attrs:
                var.type = type_expr(trees(attrs["type"])[-1], self.ev)
            if "description" in attrs:
                var.description = str(self.ev.value(trees(attrs["description"])[-1], _literal_scope()))
            if "default" in attrs:
                expr = trees(attrs["default"])[-1]
                value = self.ev.value(expr, _literal_scope())
                if var.type is not None:
                    try:
                        value = convert(value, var.type)
                    except ConvertError as err:
                        raise self.ev.fail(
                            expr, f'the default of variable "{name}" is not a {show_type(var.type)}: {err}'
                        ) from None
                else:
                    var.type = type_of(value)
                var.values.append(("default", value))
        except EvalError as err:
            self.error(err)
            var.values.append(("default", None))  # reported once: not also as "not set"
        for block in trees(inner):
            if block.data != "block":
                continue
            kind = name_of(trees(block)[0])
            body = next(p for p in trees(block) if p.data == "body")
            if kind != "validation":
                self.error(
                    self.ev.fail(block, f'variable "{name}": unexpected block "{kind}"; only validation {{ … }}')
                )
                continue
            vattrs = {name_of(trees(c)[0]): c for c in trees(body) if c.data == "attribute"}
            if "condition" not in vattrs or "error_message" not in vattrs:
                self.error(self.ev.fail(block, f'variable "{name}": a validation needs condition and error_message'))
                continue
            try:
                message = str(self.ev.value(trees(vattrs["error_message"])[-1], _literal_scope()))
            except EvalError as err:
                self.error(err)
                continue
            if not message or message[-1] not in ".?!" or (message[0].isalpha() and not message[0].isupper()):
                self.error(
                    self.ev.fail(
                        vattrs["error_message"],
                        f'variable "{name}": error_message must be a full sentence, starting with a capital letter '
                        "and ending with a period or question mark",
                    )
                )
                continue
            var.validations.append((trees(vattrs["condition"])[-1], message, self.ev.line(block)))
        variables[name] = var

    def parse_value(self, var: Variable, text: str, origin: str) -> Value:
        """A -var or NOMAD_VAR_ value: a literal string for string/number/untyped variables,
        else an HCL expression."""
        if var.type is None or (var.type[0] in ("string", "number", "any") and var.type[0] != "any"):
            return text
        try:
            sub = Source(f"_ = {text}\n", parse(f"_ = {text}\n"))
        except HCLSyntaxError:
            raise EvalError(
                var.line, text, f'the value of variable "{var.name}" from {origin} is not valid HCL'
            ) from None
        ev = _DocEvaluator(sub, self.budget)
        return ev.value(trees(trees(trees(sub.tree)[0])[0])[-1], _literal_scope())

    def collect_values(self, variables: dict[str, Variable]) -> None:
        for key, text in sorted(self.inputs.env.items()):
            if not key.startswith(VAR_ENV_PREFIX):
                continue
            name = key[len(VAR_ENV_PREFIX) :]
            if name in variables:
                self.assign(variables[name], text, f"the environment ({key})", "env")
        for var_file in self.inputs.var_files:
            self.var_file(var_file, variables)
        for name, text in self.inputs.var_texts:
            self.var_text(name, text, variables)
        for item in self.inputs.vars:
            name, sep, text = item.partition("=")
            if not sep:
                self.error(EvalError(0, item, f"-var {item!r} is not NAME=VALUE"))
                continue
            if name not in variables:
                self.doc.warnings.append(
                    f'-var {name}: no variable "{name}" is declared in the job file; the value is not used'
                )
                continue
            self.assign(variables[name], text, "-var", "cmd")

    def assign(self, var: Variable, text: str, origin: str, kind: str) -> None:
        try:
            value = self.parse_value(var, text, origin)
            if var.type is not None:
                try:
                    value = convert(value, var.type)
                except ConvertError as err:
                    raise EvalError(
                        var.line, f"var.{var.name}", f"the value from {origin} is not a {show_type(var.type)}: {err}"
                    ) from None
        except EvalError as err:
            self.error(err)
            return
        var.values.append((kind, value))

    def var_file(self, path: str, variables: dict[str, Variable]) -> None:
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_JOB_FILE_BYTES + 1)
            if len(raw) > MAX_JOB_FILE_BYTES:
                self.error(
                    EvalError(0, path, f"the var file {path} is over {MAX_JOB_FILE_BYTES} bytes; make it smaller")
                )
                return
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            self.error(EvalError(0, path, f"cannot read the var file {path}: {getattr(err, 'strerror', None) or err}"))
            return
        self.var_text(path, text, variables)

    def var_text(self, path: str, text: str, variables: dict[str, Variable]) -> None:
        """A var file's content; ``path`` names it in messages (and ``.json`` makes it JSON)."""
        where = os.path.basename(path)
        values: dict[str, Value] = {}
        if path.endswith(".json"):
            try:
                data = json.loads(text)
            except ValueError as err:
                self.error(EvalError(0, path, f"the var file {path} is not valid JSON: {err}"))
                return
            if not isinstance(data, dict):
                self.error(EvalError(0, path, f"the var file {path} must hold a JSON object of name: value"))
                return
            values = data  # JSON's values are HCL values: null, bool, number, string, array, object
        else:
            try:
                sub = Source(text, parse(text))
            except HCLSyntaxError as err:
                line = getattr(err, "line", 0) or 0
                self.error(EvalError(line, path, f"the var file {path} is not valid HCL ({str(err).splitlines()[0]})"))
                return
            ev = _DocEvaluator(sub, self.budget)
            for child in trees(trees(sub.tree)[0]):
                if child.data == "block":
                    self.error(
                        ev.fail(
                            child, f"{where}: a var file sets values (name = value); declare variables in the job file"
                        )
                    )
                    continue
                name = name_of(trees(child)[0])
                try:
                    values[name] = ev.value(trees(child)[-1], _literal_scope())
                except EvalError as err:
                    self.error(EvalError(err.line, err.expr, f"{where}: {err.reason}"))
        for name, value in values.items():
            var = variables.get(name)
            if var is None:
                self.doc.warnings.append(
                    f'{where}: no variable "{name}" is declared in the job file; the value is not used'
                )
                continue
            if var.type is not None:
                try:
                    value = convert(value, var.type)
                except ConvertError as err:
                    self.error(
                        EvalError(
                            var.line, f"var.{name}", f"the value from {where} is not a {show_type(var.type)}: {err}"
                        )
                    )
                    continue
            var.values.append(("varfile", value))

    def variable_values(self, variables: dict[str, Variable]) -> dict[str, Value]:
        out: dict[str, Value] = {}
        for name, var in variables.items():
            if not var.values:
                self.error(
                    EvalError(
                        var.line,
                        f"var.{name}",
                        f'variable "{name}" is not set and has no default; set it with '
                        f"-var {name}=…, a -var-file or the environment variable {VAR_ENV_PREFIX}{name}",
                    )
                )
                continue
            origin, value = var.values[-1]
            out[name] = value
            for condition, message, line in var.validations:
                scope = Scope({"var": {name: value}}, self.functions)
                try:
                    ok = self.ev.value(condition, scope)
                    passed = convert(ok, ("bool",))
                except EvalError as err:
                    self.error(err)
                    continue
                except ConvertError as err:
                    self.error(self.ev.fail(condition, f"a validation condition must be true or false: {err}"))
                    continue
                if passed is not True:
                    kind = {"default": "default", "env": "env", "varfile": "varfile", "cmd": "-var"}[origin]
                    self.error(
                        EvalError(line, f"var.{name}", f'invalid value for variable "{name}" (from {kind}): {message}')
                    )
        return out

    def locals(self, nodes: list[tuple[str, Tree]], values: dict[str, Value]) -> dict[str, Value]:
        done: dict[str, Value] = {}
        pending = list(nodes)
        while pending:
            progress = False
            failures: list[EvalError] = []
            for name, attr in list(pending):
                scope = Scope({"var": values, "local": done}, self.functions)
                try:
                    done[name] = self.ev.value(trees(attr)[-1], scope)
                except EvalError as err:
                    failures.append(err)
                    continue
                pending.remove((name, attr))
                progress = True
            if not progress:
                self.doc.errors.extend(failures)
                break
        return done


def evaluate(path: str, text: str, inputs: Inputs | None = None) -> Document:
    """Evaluate a job file's text; syntax errors raise HCLSyntaxError, the rest are in ``errors``.

    Going over a cap of :mod:`driversdk.jobspec.hcllimits` stops the evaluation: its one sentence
    is the only error (what was evaluated before it cannot be trusted to be complete)."""
    try:
        return _Run(path, text, inputs or Inputs()).run()
    except LimitError as err:
        return Document(None, [EvalError(err.line or 0, err.expr, err.reason)])
    except RecursionError:
        # The caps keep Python's stack well within its limit; this is the last guard.
        return Document(None, [EvalError(0, "", "the file nests expressions too deeply to evaluate; flatten them")])


__all__ = ["Document", "Inputs", "evaluate", "kids", "line_of"]
