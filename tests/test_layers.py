"""The layers of the package hold, and hand-written code has no import cycle.

Layers (``LAYERS``, the one map): the go-plugin transport (``driversdk/plugin/``) imports nothing
above it, only the leaves it stands on ("base": errors, childwait, peercred and the generated
``driversdk/pb``); the core (driversdk's top-level modules and hclspec/, taskkit/, testing/, csi/,
pluginpack/) imports nothing of the jobspec, the agent, the CLI or a bundled driver;
``driversdk/jobspec/`` (job files and configs) imports the core only; ``driversdk/agent/`` never
imports the CLI; each bundled driver imports the core only, never the agent or another driver.

What counts as an import: ``import`` and ``from ... import`` at any depth (module level, inside a
function, under ``if TYPE_CHECKING:``), relative imports resolved, the argument of
``importlib.import_module`` / ``__import__``, any string constant that is exactly the name of a
module of the tree (the lazy tables that feed ``import_module`` later), and module names in code
strings handed to a child interpreter (``python -c "from drivers.exec import ..."``).
``logging.getLogger("driversdk.plugin")`` names a logger, not a module, and does not count.

Which imports count for which rule: the layer rules read every import above, including those
under ``if TYPE_CHECKING:`` (a type-only import is still a dependency of the code's meaning, and a
type moved across a layer makes the next runtime import easy). The cycle rule ("no import cycle in
hand-written code") reads runtime imports only (module level, function level, ``import_module``
strings and lazy tables) and allows none: a cycle that exists only through ``TYPE_CHECKING``
imports is never executed, and code handed to a child interpreter runs in another process. The
cycles that do appear once ``TYPE_CHECKING`` imports are counted too are listed in
``TYPE_LEVEL_CYCLES`` by their exact member set, each with what removes it, so a new one, or one
that grows, shrinks or is gone, fails with the member list to update. The generated protobuf
modules (``driversdk/pb``) are left out of both.

Importing ``a.b.c`` also imports the packages ``a`` and ``a.b``; that implicit parent import is not
an edge (every submodule of a package whose ``__init__`` imports it would otherwise be a cycle),
but naming the package itself (``from driversdk import __version__``, ``import driversdk``) is.
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("driversdk", "drivers")
GENERATED = ("driversdk.pb",)

# The layer map: layer -> (module prefixes, the other layers it may import). A module belongs to the
# layer of its longest matching prefix; ``driversdk`` alone catches the top-level modules, and every
# sub-package of driversdk/ and drivers/ must be named here (test_every_package_is_on_the_layer_map).
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # What the transport stands on: stdlib-only leaves and the generated protobuf modules.
    "base": (("driversdk.errors", "driversdk.childwait", "driversdk.peercred", "driversdk.pb"), ()),
    "plugin": (("driversdk.plugin",), ("base",)),
    "core": (
        (
            "driversdk",
            "driversdk.hclspec",
            "driversdk.taskkit",
            "driversdk.testing",
            "driversdk.csi",
            "driversdk.pluginpack",
        ),
        ("base", "plugin"),
    ),
    # Job files and configs: the HCL2 evaluator, Nomad's job schema and model, client/agent config.
    "jobspec": (("driversdk.jobspec",), ("base", "plugin", "core")),
    # One node's client: alloc/task runners and hooks, plugin manager, state, CSI, log monitor, HTTP API.
    "agent": (("driversdk.agent",), ("base", "plugin", "core", "jobspec")),
    "cli": (("driversdk.cli",), ("base", "plugin", "core", "jobspec", "agent")),
    "drivers": (("drivers",), ()),
    "drivers.docker": (("drivers.docker",), ("base", "plugin", "core")),
    "drivers.exec": (("drivers.exec",), ("base", "plugin", "core")),
    "drivers.raw_exec": (("drivers.raw_exec",), ("base", "plugin", "core")),
}

# Runtime import cycles allowed: none. Cycles through ``if TYPE_CHECKING:`` imports known today, each by
# its exact member set and what removes it.
TYPE_LEVEL_CYCLES: dict[frozenset[str], str] = {}

IMPORTERS = {"import_module", "__import__"}
LOGGERS = {"getLogger"}
CODE_IMPORT = re.compile(r"(?:^|[\s;\"'])(?:from|import)\s+([A-Za-z_][\w.]*)")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.\w+)+")


@dataclass(frozen=True)
class Edge:
    """One import of ``target`` (a module of the tree) at ``line`` of the importing module."""

    line: int
    target: str
    runtime: bool  # False under ``if TYPE_CHECKING:`` and in code run by another interpreter


def modules_of(root: Path) -> dict[str, Path]:
    """Every hand-written and generated module under the trees, by dotted name."""
    found = {}
    for tree in TREES:
        for path in sorted((root / tree).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the tree (``a.b.attr`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def edges_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Edge]:
    """Every module of the tree that module ``name`` (at ``path``) imports or names for an import."""
    tree = ast.parse(path.read_text(), str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) in LOGGERS:
            skip.update(id(arg) for arg in node.args)

    def visit(node: ast.AST, runtime: bool) -> Iterator[Edge]:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, False)
            for child in node.orelse:
                yield from visit(child, runtime)
            return
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules)
                if target:
                    yield Edge(line, target, runtime)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            for alias in node.names:
                # "from driversdk import convert" imports the module driversdk.convert; a name that is
                # not a module comes from the package's __init__.
                submodule = f"{base}.{alias.name}"
                target = submodule if submodule in modules else _resolve(base, modules)
                if target:
                    yield Edge(line, target, runtime)
        elif isinstance(node, ast.Call) and _called_name(node) in IMPORTERS:
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                skip.add(id(first))
                target = _resolve(first.value, modules)
                if target:
                    yield Edge(line, target, runtime)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if DOTTED.fullmatch(node.value) and node.value in modules:
                yield Edge(line, node.value, runtime)  # a lazy table's entry, imported later by name
            for found in CODE_IMPORT.finditer(node.value):
                target = _resolve(found.group(1), modules)
                if target:
                    yield Edge(line, target, False)  # runs in a child interpreter
        for child in ast.iter_child_nodes(node):
            yield from visit(child, runtime)

    for edge in visit(tree, True):
        if edge.target != name:
            yield edge


@functools.cache  # one parse of the tree for all the tests
def import_graph(root: Path) -> dict[str, list[Edge]]:
    modules = modules_of(root)
    return {name: list(edges_of(name, path, modules)) for name, path in modules.items()}


def layer_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for layer, (prefixes, _) in LAYERS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    return best[1] if best else None


def layer_violations(root: Path) -> list[str]:
    found = []
    modules = modules_of(root)
    for module, edges in import_graph(root).items():
        mine = layer_of(module)
        allowed = {mine, *LAYERS[mine][1]} if mine else set()
        for edge in edges:
            theirs = layer_of(edge.target)
            if theirs not in allowed:
                where = modules[module].relative_to(root)
                found.append(f"{where}:{edge.line} ({mine}) imports {edge.target} ({theirs})")
    return sorted(set(found))


def import_cycles(root: Path, runtime_only: bool = True) -> list[frozenset[str]]:
    """Strongly connected components of more than one hand-written module: over runtime imports, or
    over every import (``TYPE_CHECKING`` ones too) with ``runtime_only=False``."""
    graph = {
        module: sorted({e.target for e in edges if (e.runtime or not runtime_only) and not _generated(e.target)})
        for module, edges in import_graph(root).items()
        if not _generated(module)
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.add(member)
                if member == module:
                    break
            if len(members) > 1:
                found.append(frozenset(members))

    for module in graph:
        if module not in index:
            connect(module)
    return found


def _generated(module: str) -> bool:
    return any(module == g or module.startswith(g + ".") for g in GENERATED)


def _cycle_report(cycles: list[frozenset[str]], allowed: dict[frozenset[str], str]) -> list[str]:
    problems = []
    for cycle in sorted(cycles, key=sorted):
        if cycle not in allowed:
            problems.append(f"import cycle of {len(cycle)} modules not allowlisted: {sorted(cycle)}")
    for cycle in sorted(allowed, key=sorted):
        if cycle not in cycles:
            problems.append(f"allowlisted import cycle is gone or changed, update the allowlist: {sorted(cycle)}")
    return problems


def test_the_layers_hold() -> None:
    assert layer_violations(ROOT) == []


def test_no_runtime_import_cycle_in_hand_written_code() -> None:
    problems = _cycle_report(import_cycles(ROOT), {})
    assert not problems, "\n".join(problems)


def test_type_level_import_cycles_are_only_the_known_ones() -> None:
    problems = _cycle_report(import_cycles(ROOT, runtime_only=False), TYPE_LEVEL_CYCLES)
    assert not problems, "\n".join(problems)


def test_every_package_is_on_the_layer_map() -> None:
    """A new package is given a layer on purpose, not by falling into the core's catch-all."""
    named = {prefix for prefixes, _ in LAYERS.values() for prefix in prefixes}
    packages = {
        ".".join(init.parent.relative_to(ROOT).parts) for tree in TREES for init in (ROOT / tree).glob("*/__init__.py")
    }
    assert packages - named == set()


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_sees_every_way_of_importing(tmp_path: Path) -> None:
    """Each way of reaching another layer is reported, so the layer test cannot pass vacuously."""
    _write(
        tmp_path,
        {
            "driversdk/__init__.py": "",
            "driversdk/errors.py": "",
            "driversdk/core1.py": "def f():\n    from driversdk.agent import api\n",
            "driversdk/core2.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import driversdk.cli\n",
            "driversdk/core3.py": "import importlib\nimportlib.import_module('driversdk.jobspec.x')\n",
            "driversdk/core4.py": "_LAZY = {'thing': 'driversdk.jobspec.x'}\n",
            "driversdk/core5.py": "import logging\nlog = logging.getLogger('driversdk.jobspec')\n",
            "driversdk/plugin/__init__.py": "from .. import service\n",
            "driversdk/plugin/ok.py": "from driversdk.errors import E\nfrom . import handshake\n",
            "driversdk/plugin/handshake.py": "",
            "driversdk/service.py": "",
            "driversdk/jobspec/__init__.py": "",
            "driversdk/jobspec/x.py": "from ..agent import api\n",
            "driversdk/agent/__init__.py": "",
            "driversdk/agent/api.py": "CMD = 'python -c \"from driversdk.cli import main\"'\n",
            "driversdk/cli/__init__.py": "from driversdk.agent import api\nfrom drivers.exec import driver\n",
            "drivers/__init__.py": "",
            "drivers/exec/__init__.py": "",
            "drivers/exec/driver.py": "from drivers import docker\n",
            "drivers/docker/__init__.py": "from driversdk import core1\n",
        },
    )
    found = [line.split(" (", 1)[0] + " -> " + line.rsplit(" imports ", 1)[1] for line in layer_violations(tmp_path)]
    assert found == [
        "drivers/exec/driver.py:1 -> drivers.docker (drivers.docker)",
        "driversdk/agent/api.py:1 -> driversdk.cli (cli)",
        "driversdk/cli/__init__.py:2 -> drivers.exec.driver (drivers.exec)",
        "driversdk/core1.py:2 -> driversdk.agent.api (agent)",
        "driversdk/core2.py:3 -> driversdk.cli (cli)",
        "driversdk/core3.py:2 -> driversdk.jobspec.x (jobspec)",
        "driversdk/core4.py:1 -> driversdk.jobspec.x (jobspec)",
        "driversdk/jobspec/x.py:1 -> driversdk.agent.api (agent)",
        "driversdk/plugin/__init__.py:1 -> driversdk.service (core)",
    ]


def test_the_checker_finds_cycles_of_each_kind(tmp_path: Path) -> None:
    """A cycle through a function-level import or a lazy name table is a runtime cycle; one through a
    TYPE_CHECKING import is a type-level cycle only; an implicit parent-package import and a generated
    module make none; the allowlist matches exactly."""
    _write(
        tmp_path,
        {
            "driversdk/__init__.py": "_LAZY = {'serve': 'driversdk.serving'}\n",
            "driversdk/serving.py": "def f():\n    from driversdk import __version__\n",
            "driversdk/a.py": "from driversdk import b\n",
            "driversdk/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from driversdk.a import A\n",
            "driversdk/c.py": "from driversdk.pkg import d\n",
            "driversdk/pkg/__init__.py": "from driversdk.pkg import d\n",
            "driversdk/pkg/d.py": "import driversdk.pb.x\n",
            "driversdk/pb/__init__.py": "",
            "driversdk/pb/x.py": "import driversdk.c\n",
        },
    )
    cycles = import_cycles(tmp_path)
    assert cycles == [frozenset({"driversdk", "driversdk.serving"})]
    type_level = sorted(import_cycles(tmp_path, runtime_only=False), key=sorted)
    assert type_level == [frozenset({"driversdk", "driversdk.serving"}), frozenset({"driversdk.a", "driversdk.b"})]
    assert _cycle_report(cycles, {frozenset({"driversdk", "driversdk.serving"}): "why"}) == []
    grown = _cycle_report(cycles, {frozenset({"driversdk.serving", "driversdk.a"}): "why"})
    assert grown == [
        "import cycle of 2 modules not allowlisted: ['driversdk', 'driversdk.serving']",
        "allowlisted import cycle is gone or changed, update the allowlist: ['driversdk.a', 'driversdk.serving']",
    ]
