"""Layering of the process-driver kit: ``driversdk/taskkit`` is SDK code and imports no bundled
driver (``drivers.*``), neither the jobspec nor the agent (``driversdk.jobspec``,
``driversdk.agent``); ``drivers/raw_exec`` is built on the kit and imports nothing from
``drivers/exec``.

The source is read with ``ast``: imports at module level and inside functions, relative imports,
``importlib.import_module`` / ``__import__`` strings and module names in code strings handed to a
child interpreter (``python -c "from drivers.exec ... import"``) all count.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = {
    "driversdk/taskkit": ("drivers", "driversdk.jobspec", "driversdk.agent"),
    "drivers/raw_exec": ("drivers.exec",),
}
CODE_IMPORT = re.compile(r"(?:^|[\s;])(?:from|import)\s+([A-Za-z_][\w.]*)")
IMPORTERS = {"import_module", "__import__"}


def _module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every module ``path`` imports or names for an import."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_of(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            yield node.lineno, base
            for alias in node.names:  # "from drivers import exec" imports drivers.exec
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in IMPORTERS and node.args and isinstance(node.args[0], ast.Constant):
                yield node.lineno, str(node.args[0].value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for found in CODE_IMPORT.finditer(node.value):
                yield node.lineno, found.group(1)
            if re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", node.value):
                yield node.lineno, node.value  # a dotted module name kept for a later import


def _forbidden(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layering_violations(root: Path) -> list[str]:
    found = []
    for folder, prefixes in RULES.items():
        for path in sorted((root / folder).rglob("*.py")):
            for line, module in imported_names(path, root):
                if _forbidden(module, prefixes):
                    found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return sorted(set(found))


def test_the_kit_and_raw_exec_import_only_what_their_layer_allows() -> None:
    assert layering_violations(ROOT) == []


def test_the_checker_sees_every_way_of_importing(tmp_path: Path) -> None:
    """Each way a module can reach a forbidden one is reported (the checker cannot pass vacuously)."""
    kit = tmp_path / "driversdk" / "taskkit"
    raw = tmp_path / "drivers" / "raw_exec"
    kit.mkdir(parents=True)
    raw.mkdir(parents=True)
    (kit / "a.py").write_text("def f():\n    from drivers.exec.cgroups import TaskCgroup\n")
    (kit / "b.py").write_text("import importlib\nimportlib.import_module('driversdk.agent.run')\n")
    (kit / "c.py").write_text("from ..jobspec import hcl\n")
    (raw / "d.py").write_text("from drivers import exec\n")
    (raw / "e.py").write_text("BOOT = 'import sys; from drivers.exec.launch import main; main()'\n")
    (raw / "f.py").write_text("MODULE = 'drivers.exec.ids'\n__import__('os')\n")
    (raw / "g.py").write_text("from drivers.raw_exec import launch\nimport driversdk.taskkit\n")
    assert layering_violations(tmp_path) == [
        "drivers/raw_exec/d.py:1 imports drivers.exec",
        "drivers/raw_exec/e.py:1 imports drivers.exec.launch",
        "drivers/raw_exec/f.py:1 imports drivers.exec.ids",
        "driversdk/taskkit/a.py:2 imports drivers.exec.cgroups",
        "driversdk/taskkit/a.py:2 imports drivers.exec.cgroups.TaskCgroup",
        "driversdk/taskkit/b.py:2 imports driversdk.agent.run",
        "driversdk/taskkit/c.py:1 imports driversdk.jobspec",
        "driversdk/taskkit/c.py:1 imports driversdk.jobspec.hcl",
    ]
