"""The bundled drivers cannot be replaced by the caller's working directory or environment.

The attacker owns the directory an operator runs ``driversdk`` in (a checkout of someone's job
files) and what ends up on the operator's PYTHONPATH and user site: each holds a ``drivers``
package with hostile ``docker``, ``exec`` and ``raw_exec`` drivers (the working directory also a
hostile ``driversdk``), the PYTHONPATH directory a ``sitecustomize``, the user site a
``usercustomize``. Every hostile module writes a marker naming the process that imported it.

The CLI is started by the operator, so its own interpreter reads PYTHONPATH and the user site by
the operator's choice: its ``sitecustomize``/``usercustomize`` markers are allowed. The plugins it
launches as root must import none of it, and nothing (the CLI's in-process checks included) may
import a hostile driver: the jobs run with the real exec and raw_exec drivers.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.agent.runs import cgroup_parent, leaks

ROOT = Path(__file__).resolve().parents[2]
# The console script an operator runs; `python -m driversdk.cli` would put the working directory
# first on the CLI's own path, which is the operator's doing, not the plugins'.
CLI = Path(sys.executable).parent / "driversdk"

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason="driversdk is not installed with its console script")

MARK = (
    "import os as _os\n"
    "with open(_os.path.join({markers!r}, '{kind}-' + str(_os.getpid())), 'w') as _fh:\n"
    "    _fh.write(open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ').decode(errors='replace'))\n"
)


def _plant(base: Path, markers: Path, packages: tuple[str, ...], modules: tuple[str, ...] = ()) -> None:
    """Hostile packages (each module of each writes a marker) and top-level hook modules."""
    for package in packages:
        for sub in ("", "docker", "exec", "raw_exec") if package == "drivers" else ("", "cli", "runner"):
            where = base / package / sub
            where.mkdir(parents=True, exist_ok=True)
            for name in ("__init__", "__main__", "main") if sub else ("__init__",):
                kind = f"{package}.{sub}.{name}" if sub else package
                (where / f"{name}.py").write_text(MARK.format(markers=str(markers), kind=kind))
    for module in modules:
        (base / f"{module}.py").write_text(MARK.format(markers=str(markers), kind=module))


def _hostile_env(tmp_path: Path, markers: Path) -> tuple[Path, dict[str, str]]:
    cwd = tmp_path / "jobs"
    _plant(cwd, markers, ("drivers", "driversdk"))
    pythonpath = tmp_path / "pythonpath"
    # No hostile driversdk here: the CLI's own interpreter would import it, by the operator's choice.
    _plant(pythonpath, markers, ("drivers",), ("sitecustomize", "usercustomize"))
    userbase = tmp_path / "userbase"
    usersite = Path(sysconfig.get_path("purelib", "posix_user", vars={"userbase": str(userbase)}))
    _plant(usersite, markers, ("drivers",), ("usercustomize",))
    startup = tmp_path / "startup.py"
    startup.write_text(MARK.format(markers=str(markers), kind="startup"))
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(pythonpath),
        PYTHONUSERBASE=str(userbase),
        PYTHONSTARTUP=str(startup),
    )
    env.pop("PYTHONNOUSERSITE", None)
    return cwd, env


def _foreign_markers(markers: Path, cli_pid: int) -> list[str]:
    """Markers no operator's choice explains: any hostile driver or driversdk, and any hook run
    in a process other than the CLI itself."""
    found = []
    for marker in sorted(markers.iterdir()):
        kind, _, pid = marker.name.rpartition("-")
        if kind.startswith(("drivers", "driversdk")) or int(pid) != cli_pid:
            found.append(f"{marker.name}: {marker.read_text()[:300]}")
    return found


def _run(cwd: Path, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    proc = subprocess.Popen(
        [str(CLI), *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=180)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def _files(tmp_path: Path, driver: str) -> tuple[Path, Path]:
    job = tmp_path / f"{driver}.hcl"
    job.write_text(
        f'job "shadow" {{\n  type = "batch"\n  group "g" {{\n    task "t" {{\n      driver = "{driver}"\n'
        '      kill_timeout = "1s"\n      config {\n        command = "/bin/sh"\n'
        '        args = ["-c", "echo real-driver-ran"]\n      }\n    }\n  }\n}\n'
    )
    client = tmp_path / "client.hcl"
    client.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        f'plugin "exec" {{\n  config {{\n    state_dir = "{tmp_path / "exec-state"}"\n'
        f'    cgroup_parent = "{cgroup_parent(tmp_path)}"\n  }}\n}}\n'
        f'plugin "raw_exec" {{\n  config {{\n    enabled = true\n  }}\n}}\n'
    )
    return job, client


def _task_output(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in (tmp_path / "data" / "allocs").glob("*/alloc/logs/t.stdout.*"))


def test_the_hostile_modules_are_seen_by_a_plain_interpreter(tmp_path: Path) -> None:
    # Without this, markers that can never be written would make every test here pass.
    markers = tmp_path / "markers"
    markers.mkdir()
    cwd, env = _hostile_env(tmp_path, markers)
    subprocess.run([sys.executable, "-c", "import drivers.exec.main"], cwd=cwd, env=env, check=True)
    kinds = {m.name.rpartition("-")[0] for m in markers.iterdir()}
    assert {"sitecustomize", "drivers", "drivers.exec.main"} <= kinds


@pytest.mark.root
@pytest.mark.parametrize("driver", ["exec", "raw_exec"])
def test_run_launches_the_real_driver_whatever_the_cwd_and_environment(tmp_path: Path, driver: str) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    cwd, env = _hostile_env(tmp_path, markers)
    job, client = _files(tmp_path, driver)
    done, pid = _run(cwd, env, "run", str(job), "--client", str(client))
    assert _foreign_markers(markers, pid) == []
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'==> task "t" started ({driver}' in done.stdout
    assert "real-driver-ran" in _task_output(tmp_path)
    assert leaks(None, tmp_path) == []


@pytest.mark.parametrize("driver", ["exec", "raw_exec", "docker"])
def test_validate_asks_the_real_driver_whatever_the_cwd_and_environment(tmp_path: Path, driver: str) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    cwd, env = _hostile_env(tmp_path, markers)
    job, client = _files(tmp_path, driver)
    if driver == "docker":
        job.write_text(
            'job "shadow" {\n  group "g" {\n    task "t" {\n      driver = "docker"\n'
            '      config {\n        image = "busybox"\n      }\n    }\n  }\n}\n'
        )
    done, pid = _run(cwd, env, "validate", str(job), "--client", str(client))
    assert _foreign_markers(markers, pid) == []
    assert done.returncode == 0, done.stdout + done.stderr


def test_driversdk_names_no_driver_module_in_a_string() -> None:
    # Bundled drivers are found through their entry points (driversdk.bundled), never by
    # a module name that an import could resolve from somewhere else.
    found = []
    for path in sorted((ROOT / "driversdk").rglob("*.py")):
        if "pb" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("drivers."):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []


def test_validate_refuses_a_driver_package_already_imported_from_elsewhere(tmp_path: Path) -> None:
    # Something in the CLI's process imported a `drivers` package off its own path first: the
    # in-process checks refuse it with a sentence instead of asking the hostile driver.
    markers = tmp_path / "markers"
    markers.mkdir()
    hostile = tmp_path / "hostile"
    _plant(hostile, markers, ("drivers",))
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(hostile)!r})\n"
        "import drivers\n"
        "from driversdk.errors import PluginError\n"
        "from driversdk.agent.pluginmanager.inprocess import InProcessDriver\n"
        "try:\n"
        "    InProcessDriver('exec')\n"
        "except PluginError as err:\n"
        "    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"the bundled exec driver cannot be loaded: the 'drivers' package this process already imported is at "
        f"{hostile / 'drivers'}, not beside driversdk in {ROOT}; remove that directory from PYTHONPATH"
    )
    assert sorted(m.name.rpartition("-")[0] for m in markers.iterdir()) == ["drivers"]
