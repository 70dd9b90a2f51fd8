"""The README's driver examples as tests take them: the python block a marker
(``<!-- example: NAME -->``) sits right before, and the task config of an argv for those drivers."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_snippet(marker: str) -> str:
    """The one python block of README.md marked with ``marker``."""
    text = README.read_text()
    assert text.count(marker) == 1, f"README.md must mark exactly one block with {marker}"
    found = re.search(re.escape(marker) + r"\n```python\n(.*?)\n```", text, re.S)
    assert found is not None, f"{marker} must sit right before a ```python block"
    return found.group(1)


def argv_task(argv: Sequence[str]) -> Mapping[str, Any]:
    return {"command": argv[0], "args": list(argv[1:])}
