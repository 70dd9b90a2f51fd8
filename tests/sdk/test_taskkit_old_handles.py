"""A ProcessDriver task started before the kit's one supervisor (under the shim that forwarded
signals and wrote a JSON exit file) is recovered, signalled, stopped and destroyed by today's."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driversdk.testing import AllocDir
from tests.process_drivers import ROOT, check_recovers_a_pre_kit_task


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[AllocDir]:
    a = AllocDir.create(tmp_path / "allocs", tasks=["web"])
    yield a
    a.close()


def _sh(script: str) -> dict[str, Any]:
    return {"command": "/bin/sh", "args": ["-c", script]}


def test_a_process_driver_recovers_a_task_its_pre_kit_version_started(alloc: AllocDir) -> None:
    old = [sys.executable, "{old}/examples/hello_driver.py"]
    new = [sys.executable, str(ROOT / "examples" / "hello_driver.py")]
    check_recovers_a_pre_kit_task(old, new, {}, alloc, _sh)
