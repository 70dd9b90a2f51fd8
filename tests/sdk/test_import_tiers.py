"""The SDK tier really needs only the core dependencies (pyproject's `dependencies`).

A driver author installs `pip install driversdk` without the docker, exec or runner extras, so
importing the SDK, testing a driver and serving one must never reach docker, requests, pyroute2,
hcl2 or lark. Each check runs in a fresh interpreter whose `sys.meta_path` refuses those
packages; the refusal is installed through a `sitecustomize` on PYTHONPATH so the plugin
process that `driversdk.launch` starts is bound by it too, and every refused import is logged
to a file (an `except ImportError` somewhere would otherwise hide it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = ("docker", "requests", "pyroute2", "hcl2", "lark")

SITECUSTOMIZE = textwrap.dedent(
    """
    import os
    import sys

    BLOCKED = frozenset(os.environ["DRIVERSDK_BLOCKED"].split(","))
    LOG = os.environ["DRIVERSDK_BLOCKED_LOG"]


    class RefuseExtras:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                with open(LOG, "a") as fh:
                    fh.write(f"{os.getpid()} {sys.argv[0] or '-c'}: import {name}\\n")
                # What a missing package raises, so code that handles one is exercised as it would be.
                raise ModuleNotFoundError(f"{name} belongs to an extra, not to the SDK tier", name=name)
            return None


    sys.meta_path.insert(0, RefuseExtras())
    """
)

CORE_SCRIPT = textwrap.dedent(
    """
    import sys

    import driversdk
    import driversdk.client
    import driversdk.driver
    import driversdk.errors
    import driversdk.hclspec
    import driversdk.model
    import driversdk.mounts
    import driversdk.plugin
    import driversdk.serving
    import driversdk.service
    import driversdk.testing
    import driversdk.testing.conformance
    import driversdk.testing.pytest_plugin  # loaded by every pytest run where driversdk is installed
    from driversdk import DriverClient, DriverPlugin, ExecSession, launch, reattach, serve

    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in sys.argv[1].split(","))
    assert not leaked, leaked
    """
)

LAUNCH_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import driversdk
    from driversdk.testing import AllocDir

    hello, workdir, blocked = sys.argv[1], Path(sys.argv[2]), sys.argv[3].split(",")
    client = driversdk.launch([sys.executable, hello], name="hello")
    try:
        client.set_config({"greeting": "hi"})
        alloc = AllocDir.create(workdir, tasks=["web"])
        try:
            task = alloc.task_config("web", driver_config={"command": "/bin/echo", "args": ["tiers"]})
            client.start_task(task)
            assert client.wait_task(task.id, timeout=30).exit_code == 0
            assert b"tiers" in alloc.wait_for_output("web", b"tiers", timeout=10)
            client.destroy_task(task.id, force=True)
        finally:
            alloc.close()
    finally:
        client.kill()
    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in blocked)
    assert not leaked, leaked
    """
)


def _run_blocked(tmp_path: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "refused.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["DRIVERSDK_BLOCKED"] = ",".join(EXTRAS_ONLY)
    env["DRIVERSDK_BLOCKED_LOG"] = str(log)
    done = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    return done, log.read_text() if log.exists() else ""


def test_the_blocker_refuses_the_extras(tmp_path: Path) -> None:
    # Without this, a blocker that silently never loaded would make the other tests pass.
    done, refused = _run_blocked(tmp_path, "import docker")
    assert done.returncode != 0
    assert "belongs to an extra" in done.stderr
    assert "import docker" in refused


def test_core_modules_import_without_the_extras(tmp_path: Path) -> None:
    done, refused = _run_blocked(tmp_path, CORE_SCRIPT, ",".join(EXTRAS_ONLY))
    assert done.returncode == 0, done.stderr
    assert refused == ""


def test_launching_and_running_hello_driver_needs_no_extra(tmp_path: Path) -> None:
    hello = str(ROOT / "examples" / "hello_driver.py")
    done, refused = _run_blocked(tmp_path, LAUNCH_SCRIPT, hello, str(tmp_path / "alloc"), ",".join(EXTRAS_ONLY))
    assert done.returncode == 0, done.stderr
    # The plugin process logs here too: nothing in the host or the plugin tried an extra.
    assert refused == ""


@pytest.mark.parametrize(("driver", "missing"), [("docker", "docker"), ("exec", "pyroute2")])
def test_a_bundled_driver_without_its_extra_says_which_to_install(tmp_path: Path, driver: str, missing: str) -> None:
    done, refused = _run_blocked(tmp_path, f"import runpy; runpy.run_module('drivers.{driver}', run_name='__main__')")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"driversdk-{driver} needs the {driver} extra ({missing} is missing): pip install 'driversdk[{driver}]'"
    )
    assert f"import {missing}" in refused


def test_validate_without_the_runner_extra_names_the_extra_to_install(tmp_path: Path) -> None:
    job = tmp_path / "job.hcl"
    job.write_text('job "j" {\n  group "g" {\n    task "t" {\n      driver = "exec"\n    }\n  }\n}\n')
    script = "import sys; from driversdk.cli import main; sys.exit(main(sys.argv[1:]))"
    done, refused = _run_blocked(tmp_path, script, "validate", str(job))
    assert done.returncode == 1, done.stderr
    assert (
        "`driversdk validate` needs the 'runner' extra, which is not installed or does not import (module 'hcl2'): "
        "pip install 'driversdk[runner]'" in done.stderr
    ), done.stderr
    assert "pip install 'driversdk[runner]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert "import hcl2" in refused
