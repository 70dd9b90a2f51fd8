"""Entry point of the ``driversdk-exec`` plugin binary."""

from __future__ import annotations

import importlib.util
import sys

from driversdk import serve

# Installed by the `exec` extra, not by `pip install driversdk`.
_EXTRA_MODULES = ("pyroute2",)


def main() -> None:
    try:
        # pyroute2 itself is imported with the first network; check now that it is installed.
        for module in _EXTRA_MODULES:
            if importlib.util.find_spec(module) is None:
                raise ModuleNotFoundError(f"No module named {module!r}", name=module)
        from drivers.exec.driver import ExecDriver
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] not in _EXTRA_MODULES:
            raise
        # A sentence on stderr, which the host shows, instead of a traceback.
        sys.exit(f"driversdk-exec needs the exec extra ({err.name} is missing): pip install 'driversdk[exec]'")
    serve(ExecDriver())


if __name__ == "__main__":
    main()
