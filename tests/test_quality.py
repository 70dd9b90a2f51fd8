"""The project's own standards, enforced: ruff clean, formatted, mypy --strict clean, and test
modules that share helpers through helper modules, never through each other."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ["driversdk", "drivers"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_is_clean() -> None:
    done = _run("ruff", "check", *CODE, "tests", "examples", "bench")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean() -> None:
    done = _run("ruff", "format", "--check", *CODE, "tests", "examples", "bench")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_is_clean() -> None:
    done = _run("mypy", "--strict", *CODE)
    assert done.returncode == 0, done.stdout + done.stderr


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imported(path: Path) -> list[tuple[int, str]]:
    """Every module name ``path`` imports, with its line: ``import`` and ``from ... import`` at any
    depth (function-local ones too), relative imports resolved, each ``from m import n`` giving both
    ``m`` and ``m.n`` (``n`` may be a module), and the constant argument of ``import_module``."""
    package = _module_of(path).rsplit(".", 1)[0].split(".")
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def test_no_test_module_imports_another() -> None:
    # A helper two test modules share lives in a helper module (tests/agent/runs.py,
    # tests/csi/hostpathvol.py, ...): importing a test module runs its collection-time code and
    # couples one suite's helpers to another suite's tests.
    tests = {_module_of(p): p for p in (ROOT / "tests").rglob("test_*.py")}
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for module, path in sorted(tests.items())
        for line, name in _imported(path)
        if name in tests and name != module
    ]
    assert found == [], "\n".join(found)
