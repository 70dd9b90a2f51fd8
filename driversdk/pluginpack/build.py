"""``driversdk plugin package``: one executable file holding a driver, driversdk and their
dependencies, which a Nomad client loads from its ``plugin_dir``.

The file is a shell preamble (it execs the chosen interpreter with ``-I -S``: neither the cwd,
``PYTHONPATH``/``PYTHONHOME`` nor site-packages can shadow the plugin's code) followed by a zip:
``__main__.py`` (:mod:`driversdk.pluginpack.boot`), ``driversdk-plugin.json`` (entry, interpreter)
and ``lib/`` (the driver's code, driversdk, and its dependencies pip-installed with ``--target``
at the versions installed here).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from driversdk.errors import DriverSDKError
from driversdk.pluginpack import boot

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_ENTRY = re.compile(rf"^({_IDENT}(?:\.{_IDENT})*)(?::({_IDENT}(?:\.{_IDENT})*))?$")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER = re.compile(r"""^\s*extra\s*==\s*["']([^"']+)["']\s*$""")
# A fixed timestamp makes the same inputs give the same file, hence the same cache dir.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
# What a project dir may hold besides its sources, left out of the copy that is built.
_SKIP_PROJECT = {"build", "dist", ".venv", "venv", ".tox"}

# What the import check prints about the entry, run by the target interpreter on the staged tree.
_CHECK = """
import importlib, json, sys
sys.path[:0] = [sys.argv[1]]
module, attr = sys.argv[2], sys.argv[3]
target = importlib.import_module(module)
for part in filter(None, attr.split(".")):
    target = getattr(target, part)
from driversdk.driver import DriverPlugin
kind = "module" if not attr else "class" if isinstance(target, type) and issubclass(target, DriverPlugin) \
    else "instance" if isinstance(target, DriverPlugin) else "callable" if callable(target) else "other"
name = getattr(target, "name", None) if kind in ("class", "instance") else None
version = getattr(target, "version", None) if kind in ("class", "instance") else None
print(json.dumps({"kind": kind, "name": name, "version": version}))
"""


class PackageError(DriverSDKError):
    """A driver that cannot be packaged: one sentence naming what is wrong and what to change."""


@dataclass(frozen=True)
class Entry:
    module: str
    attr: str | None = None

    @classmethod
    def parse(cls, text: str, what: str) -> Entry:
        match = _ENTRY.match(text.strip())
        if not match:
            raise PackageError(f"{what} {text!r} is not MODULE or MODULE:ATTR (e.g. examples.hello_driver:HelloDriver)")
        return cls(match.group(1), match.group(2))

    def __str__(self) -> str:
        return f"{self.module}:{self.attr}" if self.attr else self.module


@dataclass(frozen=True)
class Packaged:
    path: str
    entry: Entry
    name: str | None
    version: str | None
    python: dict[str, str]
    interpreter: str
    size: int


def _req_name(requirement: str) -> tuple[str, set[str]]:
    match = _REQ_NAME.match(requirement)
    if not match:
        raise PackageError(f"cannot read the requirement {requirement!r}")
    extras = {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
    return _normal(match.group(1)), extras


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sdk_requirements(extras: set[str]) -> list[str]:
    """driversdk's own runtime requirements, plus those of ``extras`` (with the marker taken off,
    since pip is not asked for driversdk itself)."""
    out = []
    for req in importlib.metadata.requires("driversdk") or []:
        text, _, marker = req.partition(";")
        wanted = _EXTRA_MARKER.match(marker) if marker else None
        if not marker:
            out.append(text.strip())
        elif wanted and wanted.group(1) in extras:
            name, more = _req_name(text)
            if name == "driversdk":  # driversdk[all] = driversdk[docker,exec,runner]
                out.extend(_sdk_requirements(more))
            else:
                out.append(text.strip())
    return out


def _split_requirements(requirements: Sequence[str]) -> tuple[list[str], set[str]]:
    """Requirements for pip, and the driversdk extras asked for (driversdk itself is copied)."""
    others, extras = [], set()
    for req in requirements:
        name, wanted = _req_name(req.partition(";")[0])
        if name == "driversdk":
            extras |= wanted
        else:
            others.append(req)
    return others, extras


def _pins(skip: set[str]) -> list[str]:
    """``name==version`` of every distribution installed here: pip picks the versions this
    environment runs with."""
    pins = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and _normal(name) not in skip:
            pins[_normal(name)] = f"{name}=={dist.version}"
    return sorted(pins.values())


def _copy_tree(source: Path, dest: Path, *, project: bool = False) -> None:
    def ignore(where: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in _SKIP_DIRS or n.endswith((".pyc", ".pyo", ".egg-info"))}
        if project and Path(where) == source:
            skipped |= _SKIP_PROJECT & set(names)
        return skipped

    shutil.copytree(source, dest, ignore=ignore, dirs_exist_ok=True)


def _copy_top_level(name: str, search: list[str], lib: Path, what: str) -> None:
    spec = importlib.machinery.PathFinder.find_spec(name, search)
    if spec is None:
        raise PackageError(f"{what}: no module {name!r} is importable here (nor from the current directory)")
    if spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            _copy_tree(Path(location), lib / name)
    elif spec.origin and spec.origin.endswith(".py"):
        shutil.copy2(spec.origin, lib / os.path.basename(spec.origin))
    else:
        raise PackageError(f"{what}: module {name!r} ({spec.origin}) is not Python source, which cannot be packaged")


def _dist_requirements(top: str) -> list[str]:
    """The requirements of the installed distribution that provides ``top``, if one does."""
    out: list[str] = []
    for dist in importlib.metadata.packages_distributions().get(top, []):
        if _normal(dist) != "driversdk":
            out.extend(importlib.metadata.requires(dist) or [])
    return out


def _project(directory: Path, lib: Path) -> tuple[Entry, list[str]]:
    """Install a project dir (pyproject.toml) into ``lib`` without its dependencies; its entry and
    its dependencies (read from the installed metadata)."""
    import tomllib

    pyproject = directory / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
    except FileNotFoundError:
        raise PackageError(f"{directory} has no pyproject.toml; give a project directory or MODULE[:ATTR]") from None
    except tomllib.TOMLDecodeError as err:
        raise PackageError(f"{pyproject} is not valid TOML ({err})") from None
    declared = data.get("tool", {}).get("driversdk", {}).get("driver")
    scripts = data.get("project", {}).get("scripts", {})
    if isinstance(declared, str):
        entry = Entry.parse(declared, f"[tool.driversdk] driver in {pyproject}")
    elif isinstance(scripts, dict) and len(scripts) == 1:
        entry = Entry.parse(str(next(iter(scripts.values()))), f"[project.scripts] in {pyproject}")
    else:
        raise PackageError(
            f"{pyproject} does not say which driver to serve; add [tool.driversdk] with "
            'driver = "yourpackage.module:YourDriver"'
        )
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds.
    copy = lib.parent / "project"
    _copy_tree(directory, copy, project=True)
    _pip(["--no-deps", str(copy)], lib, f"installing the project {directory}")
    requirements: list[str] = []
    for info in lib.glob("*.dist-info"):
        meta = importlib.metadata.PathDistribution(info)
        requirements.extend(meta.requires or [])
    return entry, requirements


def _pip(args: Sequence[str], lib: Path, what: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-input",
        "--disable-pip-version-check",
        "--no-compile",
        "--no-warn-script-location",
        "--target",
        str(lib),
        *args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        errors = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("ERROR")]
        last = (errors or [line for line in done.stderr.splitlines() if line.strip()] or ["no output"])[-1]
        raise PackageError(f"pip failed {what}: {last.removeprefix('ERROR: ')}")


def _describe(python: str) -> dict[str, str]:
    done = subprocess.run(
        [python, "-I", "-S", "-c", "import json, sys; sys.path[:0] = [sys.argv[1]]; "
         "import boot; print(json.dumps(boot.interpreter()))", os.path.dirname(boot.__file__)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        raise PackageError(f"--python {python} does not run ({(done.stderr.strip().splitlines() or ['?'])[-1]})")
    described: dict[str, str] = json.loads(done.stdout)
    return described


def _check_entry(python: str, lib: Path, entry: Entry) -> dict[str, str | None]:
    done = subprocess.run(
        [python, "-I", "-S", "-c", _CHECK, str(lib), entry.module, entry.attr or ""],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=lib,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PackageError(
            f"the driver {entry} does not import from the packaged files ({last}); add what it needs to the "
            "project's dependencies, or pass --require NAME"
        )
    info: dict[str, str | None] = json.loads(done.stdout.strip().splitlines()[-1])
    if info["kind"] == "other":
        raise PackageError(f"{entry} is neither a DriverPlugin (class or instance) nor a function that serves one")
    return info


def preamble(python: str | None, built: dict[str, str], label: str) -> bytes:
    """The shell lines before the zip: find the interpreter, or say in one sentence which is
    missing, then exec it isolated on this file."""
    interp = python or f"python{built['version']}"
    quoted = shlex.quote(interp)
    need = f"{built['implementation']} {built['version']} ({built['platform']})"
    lines = [
        "#!/bin/sh",
        f"# {label}: a Nomad task-driver plugin packaged by driversdk for {need}.",
        f'command -v {quoted} >/dev/null 2>&1 || {{ echo "$0: this plugin needs {interp} ({need}), which is not '
        'found; install it, or build the plugin again with driversdk plugin package --python PATH" >&2; exit 1; }',
        f'exec {quoted} -I -S "$0" "$@"',
        "",
    ]
    return "\n".join(lines).encode()


def _files(lib: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(lib.rglob("*")):
        if path.is_file() and not path.is_symlink():
            yield f"{boot.LIB_PREFIX}{path.relative_to(lib).as_posix()}", path


def _write(output: Path, head: bytes, meta: dict[str, object], lib: Path) -> int:
    """Write the archive next to ``output`` and rename it into place (a plugin a Nomad client is
    loading at that moment sees the old file or the new one)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    try:
        with os.fdopen(fd, "wb") as fp:
            fp.write(head)
            with zipfile.ZipFile(fp, "w", compression=zipfile.ZIP_DEFLATED) as zf:

                def add(name: str, data: bytes, mode: int = 0o644) -> None:
                    info = zipfile.ZipInfo(name, _EPOCH)
                    info.external_attr = mode << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    zf.writestr(info, data)

                add("__main__.py", Path(boot.__file__).read_bytes())
                add(boot.META_NAME, json.dumps(meta, indent=2, sort_keys=True).encode())
                for name, path in _files(lib):
                    add(name, path.read_bytes())
        os.chmod(tmp, 0o755)
        os.replace(tmp, output)
    except BaseException:
        os.unlink(tmp)
        raise
    return output.stat().st_size


def package(
    target: str,
    output: str,
    *,
    python: str | None = None,
    requires: Sequence[str] = (),
    cwd: str | None = None,
) -> Packaged:
    """Package ``target`` (a project directory, or ``MODULE[:ATTR]`` importable here or from
    ``cwd``) into the executable file ``output``."""
    import driversdk

    here = os.path.abspath(cwd or os.getcwd())
    out = Path(here, output)
    if out.is_dir():
        raise PackageError(f"-o {output} is a directory; give the file to write, e.g. -o {output}/mydriver")
    if not out.parent.is_dir():
        raise PackageError(f"-o {output}: the directory {out.parent} does not exist")
    built = boot.interpreter()
    interp = sys.executable
    if python is not None:
        if not os.path.isabs(python):
            raise PackageError(f"--python {python} must be an absolute path (Nomad's PATH is not yours)")
        theirs = _describe(python)
        if {k: theirs[k] for k in ("implementation", "version", "ext_suffix")} != {
            k: built[k] for k in ("implementation", "version", "ext_suffix")
        }:
            raise PackageError(
                f"--python {python} is {theirs['implementation']} {theirs['version']} ({theirs['ext_suffix']}) but "
                f"this environment is {built['implementation']} {built['version']} ({built['ext_suffix']}), whose "
                "compiled dependencies it could not load; run driversdk plugin package from an environment of "
                "that interpreter"
            )
        interp = python
    staging = Path(tempfile.mkdtemp(prefix="driversdk-package-"))
    try:
        lib = staging / "lib"
        lib.mkdir()
        source = Path(here, target)
        if source.is_dir():
            entry, requirements = _project(source, lib)
        else:
            entry = Entry.parse(target, "the driver")
            top = entry.module.split(".")[0]
            if top not in ("driversdk", "drivers"):
                _copy_top_level(top, [here, *sys.path], lib, f"the driver {entry}")
            requirements = _dist_requirements(top)
        others, extras = _split_requirements([*requirements, *requires])
        sdk_dir = Path(driversdk.__file__).parent
        _copy_tree(sdk_dir, lib / "driversdk")
        if (sdk_dir.parent / "drivers" / "__init__.py").is_file():
            _copy_tree(sdk_dir.parent / "drivers", lib / "drivers")
        wanted = [*_sdk_requirements(extras), *others]
        if wanted:
            skip = {"driversdk"} | {_normal(p.name.split("-")[0]) for p in lib.glob("*.dist-info")}
            constraints = staging / "constraints.txt"
            constraints.write_text("\n".join(_pins(skip)) + "\n")
            _pip(["--constraint", str(constraints), *wanted], lib, "installing the dependencies")
        shutil.rmtree(lib / "bin", ignore_errors=True)
        info = _check_entry(interp, lib, entry)
        meta: dict[str, object] = {
            "entry": {"module": entry.module, "attr": entry.attr},
            "python": built,
            "driversdk": driversdk.__version__,
            "name": info.get("name"),
        }
        label = info.get("name") or out.name
        size = _write(out, preamble(python, built, label), meta, lib)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Packaged(str(out), entry, info.get("name"), info.get("version"), built, interp, size)
