"""Which extra of ``driversdk`` installs a package, so a failed import of one is said as the
extra to install (``pip install 'driversdk[runner]'``), never as a fault of the file being read."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Top-level module -> the extra that installs it (pyproject.toml's optional-dependencies).
EXTRA_OF = {
    "hcl2": "runner",
    "lark": "runner",
    "hcl": "runner",
    "docker": "docker",
    "requests": "docker",
    "pyroute2": "exec",
}


@dataclass(frozen=True)
class MissingExtra:
    extra: str
    module: str

    def sentence(self) -> str:
        return (
            f"needs the {self.extra!r} extra, which is not installed or does not import (module {self.module!r}): "
            f"pip install 'driversdk[{self.extra}]'"
        )


def extra_of(err: ImportError) -> MissingExtra | None:
    """The extra whose package failed to import in ``err``; None for any other import error."""
    names = [err.name or "", *re.findall(r"'([A-Za-z_][A-Za-z0-9_.]*)'", str(err))]
    for name in names:
        top = name.split(".")[0]
        if top in EXTRA_OF:
            return MissingExtra(EXTRA_OF[top], top)
    return None
