"""The HCL evaluator's surface says what an HCL value is (``values.Value``), not ``Any``.

Three guards: every public function, method and dataclass field of the package resolves to
annotations without ``Any``; the package's source holds no more ``Any`` than the one left on
purpose (the decoders' raw document, before it is a value); and ``Value`` tells the truth: it is
exactly HCL's values, and every leaf a job file's evaluation produces is one of its members.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import typing
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import lark
import pytest

import driversdk.jobspec.hcl as hcl
from driversdk.jobspec.hcl import FilePolicy, Inputs, evaluate

# ``functions._plain(v: Any, …)``: json.loads' / yaml.safe_load's document, not yet a value.
MAX_ANY_IN_SOURCE = 1


def _modules() -> list[ModuleType]:
    return [importlib.import_module(f"{hcl.__name__}.{info.name}") for info in pkgutil.iter_modules(hcl.__path__)]


def _public(module: ModuleType) -> Iterator[tuple[str, object]]:
    """The module's own public functions and classes, and the public methods of those classes."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj
        elif inspect.isclass(obj):
            yield f"{module.__name__}.{name}", obj  # its annotated attributes (dataclass fields)
            for attr, member in vars(obj).items():
                if inspect.isfunction(member) and (not attr.startswith("_") or attr == "__init__"):
                    yield f"{module.__name__}.{name}.{attr}", member


def _has_any(hint: object, seen: set[int] | None = None) -> bool:
    seen = seen if seen is not None else set()
    if id(hint) in seen:  # Value and Type are recursive
        return False
    seen.add(id(hint))
    if hint is typing.Any:
        return True
    if isinstance(hint, typing.ForwardRef):
        return "Any" in hint.__forward_arg__
    return any(_has_any(arg, seen) for arg in typing.get_args(hint))


def test_public_annotations_name_no_any() -> None:
    offenders = []
    checked = 0
    for module in _modules():
        # lark's types are named under TYPE_CHECKING only (lark loads lazily): given here.
        namespace = {**vars(module), "lark": lark}
        for qualname, obj in _public(module):
            hints = typing.get_type_hints(obj, globalns=namespace)
            checked += len(hints)
            offenders += [f"{qualname}: {name}" for name, hint in hints.items() if _has_any(hint)]
    assert checked > 100, f"only {checked} annotations were found; is the walk broken?"
    assert offenders == [], "annotated with Any (use values.Value or a narrower type):\n" + "\n".join(offenders)


def _any_in_source(path: Path) -> int:
    """``Any`` named anywhere in a module's code (annotations, aliases, casts), its import aside."""
    tree = ast.parse(path.read_text())
    return sum(
        1
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")
    )


def test_source_holds_no_more_any_than_the_documented_one() -> None:
    counts = {path.name: _any_in_source(path) for path in sorted(Path(hcl.__path__[0]).glob("*.py"))}
    assert sum(counts.values()) <= MAX_ANY_IN_SOURCE, f"Any in the HCL package's code: {counts}"


JOB = """
locals {
  list   = [1, 2.5, "s", true, null]
  object = { a = { b = [1] } }
  yaml   = yamldecode("when: 2001-12-14\\nraw: !!binary aGk=\\nat: !!timestamp 2001-12-14 21:59:43.10\\nn: 1.0")
  json   = jsondecode("{\\"x\\": [1, 2.0, null]}")
  csv    = csvdecode("a,b\\n1,2")
  text   = "%{for k, v in local.object}${k}%{endfor} ${upper("x")}"
  parts  = [split(",", "a,b"), keys(local.object), sort(["b", "a"]), setproduct([1], ["x"]), flatten([[1], [[2]]])]
  typed  = convert(3, string)
}
job "j" {
  meta = { v = jsonencode(local.text) }
  group "g" {
    dynamic "task" {
      for_each = local.object
      labels   = [task.key]
      content {
        driver = "raw_exec"
        config {
          everything = [local.list, local.object, local.yaml, local.json, local.csv, local.text, local.parts,
                        local.typed]
        }
      }
    }
  }
}
"""


def _leaves(value: object) -> Iterator[object]:
    if isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str), f"an object key that is not a string: {key!r}"
            yield from _leaves(item)
    else:
        yield value


def _runtime_classes(alias: object) -> tuple[type, ...]:
    """The classes an isinstance check of the alias's members needs (list[Value] → list)."""
    out: list[type] = []
    for member in typing.get_args(alias):
        if member is type(None) or isinstance(member, type):
            out.append(member)
        elif isinstance(typing.get_origin(member), type):
            out.append(typing.get_origin(member))
        else:  # a nested alias
            out.extend(_runtime_classes(member))
    return tuple(out)


# HCL's values and nothing else: a decoder's own types (PyYAML's date, bytes, set) are no member.
HCL_CLASSES = {bool, int, float, str, list, dict, type(None)}


def test_value_is_exactly_the_hcl_values() -> None:
    values = importlib.import_module(f"{hcl.__name__}.values")
    members = set(_runtime_classes(getattr(values, "Value", None)))
    assert members == HCL_CLASSES, f"values.Value is not exactly HCL's values: {members ^ HCL_CLASSES}"


def test_every_evaluated_leaf_is_a_value_member(tmp_path: Path) -> None:
    values = importlib.import_module(f"{hcl.__name__}.values")
    value_alias = getattr(values, "Value", None)
    assert value_alias is not None, "driversdk.jobspec.hcl.values has no Value alias"
    allowed = _runtime_classes(value_alias)
    job = tmp_path / "job.hcl"
    job.write_text(JOB)
    doc = evaluate(str(job), JOB, Inputs(files=FilePolicy.beside(str(job))))
    assert doc.errors == []
    leaves = list(_leaves(doc.body)) + list(_leaves(doc.locals))
    assert len(leaves) > 20
    strays = [leaf for leaf in leaves if not isinstance(leaf, allowed)]
    assert strays == [], f"values outside values.Value ({allowed}): {strays}"


@pytest.mark.parametrize("name", ["Value", "Type"])
def test_the_aliases_are_in_values(name: str) -> None:
    values = importlib.import_module(f"{hcl.__name__}.values")
    assert typing.get_args(getattr(values, name, None)), f"values.{name} is not a type alias of a union"
