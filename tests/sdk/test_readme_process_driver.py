"""The README's second driver example (a ProcessDriver with its own ``launch``) runs as written
and passes the conformance kit.

The snippet is taken from README.md by its marker (``<!-- example: readme_process_driver -->``
before the fenced block), written to a file and served as a real plugin subprocess through the
go-plugin handshake; its tasks show they run with the niceness and locale it chose.
"""

from __future__ import annotations

import sys
from pathlib import Path

from driversdk.testing import AllocDir, DriverHarness
from driversdk.testing.conformance import run_conformance
from tests.sdk.readme import argv_task, readme_snippet

MARKER = "<!-- example: readme_process_driver -->"


def test_the_snippet_is_a_small_driver() -> None:
    assert len(readme_snippet(MARKER).splitlines()) <= 35


def test_the_readme_process_driver_runs_its_launch_and_passes_the_conformance_kit(tmp_path: Path) -> None:
    driver = tmp_path / "nicedriver.py"
    driver.write_text(readme_snippet(MARKER))
    with DriverHarness([sys.executable, str(driver)]) as h:
        assert h.client.plugin_info().name == "nicedriver"
        alloc = AllocDir.create(tmp_path / "allocs", tasks=["web"])
        try:
            task = alloc.task_config("web", driver_config={**argv_task(["/bin/sh", "-c", 'nice; echo "$LC_ALL"'])})
            h.start(task)
            assert h.client.wait_task(task.id, timeout=30).exit_code == 0
            # The task's niceness is the default 10 (the plugin's own is 0) and its locale the one chosen.
            assert alloc.wait_for_output("web", b"C.UTF-8\n", 30) == b"10\nC.UTF-8\n"
            h.client.destroy_task(task.id, force=False)
            h.forget(task.id)
        finally:
            alloc.close()
        results = run_conformance(h, argv_task, str(tmp_path / "work"), timeout=30)
    failed = [str(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)
