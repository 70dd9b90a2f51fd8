"""The README's "Write a driver" example runs as written and passes the conformance kit.

The snippet is taken from README.md by its marker (``<!-- example: readme_driver -->`` before the
fenced block), written to a file and served as a real plugin subprocess through the go-plugin
handshake: the README cannot drift from what works.
"""

from __future__ import annotations

import sys
from pathlib import Path

from driversdk.testing import DriverHarness
from driversdk.testing.conformance import run_conformance
from tests.sdk.readme import README, argv_task, readme_snippet

MARKER = "<!-- example: readme_driver -->"


def test_the_readme_driver_runs_and_passes_the_conformance_kit(tmp_path: Path) -> None:
    driver = tmp_path / "mydriver.py"
    driver.write_text(readme_snippet(MARKER))
    with DriverHarness([sys.executable, str(driver)]) as h:
        assert h.client.plugin_info().name == "mydriver"
        caps = h.client.capabilities()
        results = run_conformance(h, argv_task, str(tmp_path / "work"), timeout=30)
    failed = [str(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)
    # Nothing claimed that the example does not do.
    assert caps.mount_configs.name == "NONE" and caps.fs_isolation.name == "NONE"
    assert caps.send_signals and caps.exec


def test_the_readme_says_the_output_paths_are_fifos() -> None:
    text = README.read_text()
    section = text[text.index("## Write a driver") : text.index("## Load a driver into Nomad")]
    assert "stdout_path" in section and "fifos the host reads" in section
