"""The drivers that ship with driversdk, found through one registry: driversdk's own entry points.

Each bundled driver is an entry point of the ``driversdk.drivers`` group in driversdk's
distribution metadata (pyproject.toml), naming its plugin's ``main``; that module also has the
``build`` that ``driversdk validate`` asks in process. Only driversdk's own distribution is read:
a package installed beside it cannot add or replace a bundled driver.

Where the code comes from is pinned, not looked up again on the way: the driver's module must be
a file under the directory this process's own ``driversdk`` package was imported from (the
driversdk and drivers packages ship together), and

- a plugin process is started as ``python -I -c`` with that directory first on ``sys.path``:
  isolated mode ignores every ``PYTHON*`` variable (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP,
  PYTHONUSERBASE), the user site and its ``usercustomize``, and puts no working directory on
  ``sys.path``, so neither the directory the run was started in nor the caller's environment can
  replace the code a plugin runs as root (site-packages stays: its dependencies, and an editable
  install's finder, live there);
- in process, the driver's top-level package is imported from that directory only, so a
  ``drivers`` package earlier on this process's own ``sys.path`` is never the one asked.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import keyword
import os
import sys
from dataclasses import dataclass
from types import ModuleType

from driversdk.errors import PluginError

GROUP = "driversdk.drivers"
# The drivers pyproject.toml registers; a name of these that the registry lacks means a bad install.
SHIPPED = ("docker", "exec", "raw_exec")
_DISTRIBUTION = "driversdk"


@dataclass(frozen=True)
class BundledDriver:
    """One bundled driver: its plugin's entry point and the directory its code was verified in."""

    name: str
    module: str  # the entry point's module, e.g. the driver's ``main``
    attr: str  # the plugin's entry function in ``module``
    root: str  # the directory holding this process's driversdk package, and this driver's package

    def command(self) -> list[str]:
        """argv of the plugin process (see the module docstring for why ``-I`` and the path)."""
        code = f"import sys; sys.path[:0] = [{self.root!r}]; from {self.module} import {self.attr}; {self.attr}()"
        return [sys.executable, "-I", "-c", code]

    def load(self) -> ModuleType:
        """``module``, imported in this process from ``root`` only."""
        top = self.module.partition(".")[0]
        package = sys.modules.get(top)
        if package is None:
            spec = importlib.machinery.PathFinder.find_spec(top, [self.root])
            if spec is None or spec.loader is None:
                raise self._missing()
            package = importlib.util.module_from_spec(spec)
            sys.modules[top] = package
            try:
                spec.loader.exec_module(package)
            except BaseException:
                del sys.modules[top]
                raise
        where = [os.path.abspath(p) for p in getattr(package, "__path__", [])]
        if where != [os.path.join(self.root, top)]:
            raise PluginError(
                f"the bundled {self.name} driver cannot be loaded: the {top!r} package this process "
                f"already imported is at {', '.join(where) or '?'}, not beside driversdk in {self.root}; "
                "remove that directory from PYTHONPATH"
            )
        return importlib.import_module(self.module)

    def _missing(self) -> PluginError:
        return PluginError(
            f"the bundled {self.name} driver ({self.module}) is not in {self.root}, where driversdk is; "
            "reinstall driversdk (pip install driversdk)"
        )


def _dotted(text: str) -> bool:
    return bool(text) and all(part.isidentifier() and not keyword.iskeyword(part) for part in text.split("."))


def _file_of(root: str, module: str) -> str | None:
    base = os.path.join(root, *module.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def sdk_root() -> str:
    """The directory this process's driversdk package was imported from."""
    import driversdk

    return os.path.dirname(os.path.dirname(os.path.abspath(driversdk.__file__)))


@functools.cache
def bundled_drivers() -> dict[str, BundledDriver]:
    """Every bundled driver by name; empty when driversdk's metadata is not installed (a source
    tree that was never ``pip install``-ed)."""
    # Only here: ~10 ms of imports that no other command needs.
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        points = distribution(_DISTRIBUTION).entry_points.select(group=GROUP)
    except PackageNotFoundError:
        return {}
    root = sdk_root()
    found: dict[str, BundledDriver] = {}
    for point in points:
        module, _, attr = point.value.partition(":")
        module, attr = module.strip(), attr.strip()
        # Checked before it goes into the plugin's -c code; the file must be where driversdk is.
        if not (_dotted(module) and _dotted(attr) and "." not in attr) or _file_of(root, module) is None:
            continue
        found[point.name] = BundledDriver(point.name, module, attr, root)
    return found


def bundled_driver(name: str) -> BundledDriver | None:
    return bundled_drivers().get(name)


def reinstall_hint(driver: str) -> str:
    """What to add to "no plugin is configured for driver X" when X should have been bundled: a
    checkout that was never installed (or whose pyproject changed since) has no entry points."""
    if driver in SHIPPED and not bundled_drivers():
        return (
            f"; driversdk's install lists no bundled drivers, so {driver!r} is not found: install it again "
            "(pip install -e '.[all]' in its checkout)"
        )
    return ""
