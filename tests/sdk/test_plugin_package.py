"""``driversdk plugin package`` / ``plugin probe --plugin-dir``: a Python driver as one executable
file in a Nomad client's plugin_dir, loaded through the real go-plugin handshake.

Each package is built once per module (pip and a zip of ~9 MB take a few seconds)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.client import launch
from driversdk.pluginpack.boot import META_NAME
from driversdk.testing import AllocDir, DriverHarness

ROOT = Path(__file__).resolve().parents[2]
PROJECT = Path(__file__).resolve().parent / "plugins" / "packproject"
SYSTEM_PY = "/usr/bin/python3.11"
NOBODY = 65534


def cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driversdk.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300, env=env
    )


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every plugin started here extracts into a cache of this module's, not the user's ~/.cache."""
    before = os.environ.get("DRIVERSDK_PLUGIN_CACHE")
    os.environ["DRIVERSDK_PLUGIN_CACHE"] = str(tmp_path_factory.mktemp("plugin-cache") / "cache")
    yield
    if before is None:
        del os.environ["DRIVERSDK_PLUGIN_CACHE"]
    else:
        os.environ["DRIVERSDK_PLUGIN_CACHE"] = before


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A client's plugin_dir holding the packaged hello example (run by python3.11 from PATH)."""
    where = tmp_path_factory.mktemp("plugins")
    done = cli("plugin", "package", "examples.hello_driver:HelloDriver", "-o", str(where / "hello"))
    assert done.returncode == 0, done.stderr
    assert "driver 'hello' 0.1.0" in done.stdout
    return where


@pytest.fixture(scope="module")
def greet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project in tests/sdk/plugins/packproject (its own dependency, idna), packaged for the
    system's /usr/bin/python3.11, in which neither grpc nor driversdk nor idna is installed."""
    if not os.access(SYSTEM_PY, os.X_OK):
        pytest.skip(f"{SYSTEM_PY} is not installed")
    where = tmp_path_factory.mktemp("greet") / "greet"
    done = cli("plugin", "package", str(PROJECT), "-o", str(where), "--python", SYSTEM_PY)
    assert done.returncode == 0, done.stderr
    return where


@pytest.fixture
def cache() -> Iterator[Path]:
    """A cache dir of this test's own, in a world-writable sticky dir as /tmp is (pytest's own
    tmp dirs are closed to other uids)."""
    shared = Path(tempfile.mkdtemp(prefix="driversdk-pkgtest-"))
    shared.chmod(0o1777)
    yield shared / "cache"
    shutil.rmtree(shared)


def env_with(cache: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "DRIVERSDK_PLUGIN_CACHE": str(cache), **more}


def run_plain(path: Path, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the file as an operator would by hand (no handshake cookie): it prepares its files,
    then says it is a plugin, or says in one sentence why it cannot run."""
    return subprocess.run([str(path)], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def as_nobody(action: object) -> None:
    """Run ``action()`` in a forked child that is uid/gid 65534: the attacker."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            action()  # type: ignore[operator]
            os._exit(0)
        except BaseException as err:
            print(f"attacker failed: {err!r}", file=sys.stderr)
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# --- (a) probe, as Nomad's catalog loads it ------------------------------------------------------


def test_probe_loads_and_describes_the_packaged_hello(plugin_dir: Path) -> None:
    done = cli("plugin", "probe", "--plugin-dir", str(plugin_dir), "--name", "hello", "--config", '{"greeting": "hey"}')
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("hello 0.1.0 (api v0.1.0)")
    assert "type:         driver" in out
    assert "health:       HEALTHY" in out
    assert "driver.hello.greeting = hey" in out  # SetConfig reached the plugin
    assert 'greeting = attr(string) default "hello"' in out
    assert "command = attr(string, required)" in out
    as_json = cli("plugin", "probe", "--json", "--plugin-dir", str(plugin_dir), "--name", "hello")
    report = json.loads(as_json.stdout)
    assert report["plugin_api_versions"] == ["v0.1.0"]
    assert report["path"] == str(plugin_dir / "hello")
    assert report["attributes"] == {"driver.hello.greeting": "hello"}


def test_probe_finds_the_file_as_nomad_does(plugin_dir: Path, tmp_path: Path) -> None:
    """.exe stripped, a symlink followed; a non-executable file, a directory or another name is
    not loaded, each with the sentence saying why."""
    nomad = tmp_path / "plugins"
    nomad.mkdir()
    (nomad / "hello.exe").symlink_to(plugin_dir / "hello")
    (nomad / "other").write_text("#!/bin/sh\n")
    (nomad / "other").chmod(0o755)
    assert cli("plugin", "probe", "--plugin-dir", str(nomad), "--name", "hello").returncode == 0
    (nomad / "hello.exe").unlink()
    shutil.copy(plugin_dir / "hello", nomad / "hello")
    (nomad / "hello").chmod(0o644)
    (nomad / "dirdriver").mkdir()
    cases = [
        ("hello", "is not executable (mode 644), so Nomad skips it; chmod +x it"),
        ("dirdriver", "is a directory, which Nomad skips"),
        ("nosuch", 'has no executable file named "nosuch" (it holds other)'),
    ]
    for name, sentence in cases:
        done = cli("plugin", "probe", "--plugin-dir", str(nomad), "--name", name)
        assert done.returncode == 1, done.stdout
        assert sentence in done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert cli("plugin", "probe", "--plugin-dir", str(nomad)).returncode == 2


def test_probe_of_an_unhealthy_plugin_exits_1(tmp_path: Path) -> None:
    """Loaded but not healthy: described, then one sentence and exit 1."""
    nomad = tmp_path / "plugins"
    nomad.mkdir()
    script = nomad / "sick"
    script.write_text(
        f"#!{sys.executable}\n"
        "from driversdk import serve, hclspec as hs\n"
        "from driversdk.model import Fingerprint, HealthState\n"
        "from driversdk.taskkit.processdriver import ProcessDriver\n"
        "class Sick(ProcessDriver):\n"
        "    name = 'sick'\n"
        "    version = '0.1.0'\n"
        "    def fingerprint(self):\n"
        "        return Fingerprint(HealthState.UNHEALTHY, 'no widgets on this host', {})\n"
        "    def task_config_schema(self):\n"
        "        return hs.obj({})\n"
        "    def command(self, task):\n"
        "        return ['true']\n"
        "serve(Sick())\n"
    )
    script.chmod(0o755)
    done = cli("plugin", "probe", "--plugin-dir", str(nomad), "--name", "sick")
    assert done.returncode == 1
    assert "health:       UNHEALTHY" in done.stdout
    assert done.stderr == (
        f"error: plugin 'sick' ({script}) would not run tasks on a Nomad client: it fingerprints UNHEALTHY "
        "(no widgets on this host)\n"
    )


# --- (b) our own host runs a task through the file -----------------------------------------------


def test_harness_starts_a_task_through_the_packaged_file(plugin_dir: Path, tmp_path: Path) -> None:
    alloc = AllocDir.create(tmp_path)
    try:
        with DriverHarness([str(plugin_dir / "hello")], plugin_config={"greeting": "howdy"}) as harness:
            task = alloc.task_config("task", driver_config={"command": "/bin/echo", "args": ["from", "the", "zip"]})
            harness.start(task)
            assert harness.client.wait_task(task.id, timeout=30).exit_code == 0
            assert b"from the zip" in alloc.wait_for_output("task", b"from the zip")
    finally:
        alloc.close()


def test_a_project_with_its_own_dependency_runs_under_a_bare_system_python(greet: Path, tmp_path: Path) -> None:
    """/usr/bin/python3.11 has no grpc, driversdk or idna: all come from the file."""
    head = greet.read_bytes()[:400].decode(errors="replace")
    assert f"exec {SYSTEM_PY} -I -S" in head
    nomad = tmp_path / "plugins"
    nomad.mkdir()
    shutil.copy(greet, nomad / "greet")
    done = cli("plugin", "probe", "--json", "--plugin-dir", str(nomad), "--name", "greet")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["name"] == "greet" and report["plugin_version"] == "0.2.0"
    import idna

    assert report["attributes"]["driver.greet.idna"] == idna.__version__
    assert report["attributes"]["driver.greet.file"].startswith(os.environ["DRIVERSDK_PLUGIN_CACHE"] + "/")
    alloc = AllocDir.create(tmp_path)
    try:
        with DriverHarness([str(nomad / "greet")]) as harness:
            task = alloc.task_config("task", driver_config={"command": "/bin/echo", "args": ["greeted"]})
            harness.start(task)
            assert harness.client.wait_task(task.id, timeout=30).exit_code == 0
            assert b"greeted" in alloc.wait_for_output("task", b"greeted")
    finally:
        alloc.close()
    assert not (PROJECT / "build").exists() and not list(PROJECT.glob("*.egg-info")), "the project tree is untouched"


# --- (c) neither the cwd nor PYTHONPATH can shadow the plugin's code -----------------------------


HOSTILE = "import os\nopen(os.environ['MARKER_DIR'] + '/{name}', 'w').close()\n"


def plant(where: Path, marker_name: str) -> None:
    for module in ("driversdk/__init__.py", "examples/__init__.py", "examples/hello_driver.py", "grpc/__init__.py"):
        path = where / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HOSTILE.format(name=f"{marker_name}-{module.replace('/', '.')}"))
    (where / "sitecustomize.py").write_text(HOSTILE.format(name=f"{marker_name}-sitecustomize"))
    (where / "usercustomize.py").write_text(HOSTILE.format(name=f"{marker_name}-usercustomize"))


def test_hostile_cwd_and_pythonpath_are_never_imported(
    plugin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    cwd, pythonpath = tmp_path / "cwd", tmp_path / "pythonpath"
    plant(cwd, "cwd")
    plant(pythonpath, "pythonpath")
    env = {
        **os.environ,
        "MARKER_DIR": str(markers),
        "PYTHONPATH": f"{pythonpath}:.",
        "PYTHONHOME": str(pythonpath),  # a python honouring it would not even start
        "PYTHONSTARTUP": str(pythonpath / "sitecustomize.py"),
    }
    monkeypatch.chdir(cwd)
    client = launch([str(plugin_dir / "hello")], env=env)
    try:
        assert client.plugin_info().name == "hello"
        client.set_config({"greeting": "safe"})
        assert next(iter(client.fingerprint())).attributes["driver.hello.greeting"].value == "safe"
    finally:
        client.kill()
    assert sorted(os.listdir(markers)) == []


# --- (d) the extraction cache ---------------------------------------------------------------------


def test_cache_dir_is_private_and_extracted_once(plugin_dir: Path, cache: Path) -> None:
    """0700, owned by us; two first runs at once both start and leave one tree, no temp dir."""
    procs = [
        subprocess.Popen([str(plugin_dir / "hello")], env=env_with(cache), stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert "This binary is a plugin" in err, err
    info = os.lstat(cache)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
    entries = os.listdir(cache)
    assert len(entries) == 1 and re.fullmatch(r"[0-9a-f]{32}", entries[0]), entries
    tree = cache / entries[0]
    assert stat.S_IMODE(os.lstat(tree).st_mode) == 0o700
    assert (tree / "lib" / "examples" / "hello_driver.py").is_file()


def test_a_symlink_planted_at_the_cache_path_is_refused(plugin_dir: Path, cache: Path) -> None:
    lure = cache.parent / "lure"
    lure.mkdir()
    lure.chmod(0o777)
    as_nobody(lambda: os.symlink(lure, cache))
    done = run_plain(plugin_dir / "hello", env_with(cache))
    assert done.returncode == 1
    assert done.stderr == (
        f"hello: the plugin cache dir {cache} is a symlink, which could point anywhere; remove it, or set "
        "DRIVERSDK_PLUGIN_CACHE to a directory of your own\n"
    )
    assert os.listdir(lure) == [], "nothing was written through the symlink"
    os.unlink(cache)
    assert "This binary is a plugin" in run_plain(plugin_dir / "hello", env_with(cache)).stderr


def test_a_cache_dir_owned_by_another_uid_is_refused(plugin_dir: Path, cache: Path) -> None:
    def squat() -> None:
        os.mkdir(cache, 0o777)
        os.chmod(cache, 0o777)
        # What the attacker hopes the plugin runs: a tree under the key it will compute.
        (cache / ("0" * 32)).mkdir()

    as_nobody(squat)
    done = run_plain(plugin_dir / "hello", env_with(cache))
    assert done.returncode == 1
    assert done.stderr == (
        f"hello: the plugin cache dir {cache} is owned by uid {NOBODY}, not by uid {os.geteuid()} that runs the "
        "plugin, so its contents cannot be trusted; remove it, or set DRIVERSDK_PLUGIN_CACHE to a directory of "
        "your own\n"
    )
    assert sorted(os.listdir(cache)) == ["0" * 32], "nothing extracted into the squatted dir"


def test_a_group_writable_cache_dir_of_ours_is_refused(plugin_dir: Path, cache: Path) -> None:
    cache.mkdir()
    cache.chmod(0o770)
    done = run_plain(plugin_dir / "hello", env_with(cache))
    assert done.returncode == 1
    assert "is writable by others (mode 770), so its contents cannot be trusted" in done.stderr
    assert os.listdir(cache) == []


# --- (e) a different interpreter ------------------------------------------------------------------


def with_meta(source: Path, dest: Path, change: dict[str, str]) -> None:
    """A copy of the packaged file whose recorded interpreter is changed (as if built elsewhere)."""
    data = source.read_bytes()
    start = data.index(b"PK\x03\x04")
    with zipfile.ZipFile(source) as old, open(dest, "wb") as fp:
        fp.write(data[:start])
        with zipfile.ZipFile(fp, "w", compression=zipfile.ZIP_DEFLATED) as new:
            for item in old.infolist():
                body = old.read(item)
                if item.filename == META_NAME:
                    meta = json.loads(body)
                    meta["python"].update(change)
                    body = json.dumps(meta).encode()
                new.writestr(item, body)
    dest.chmod(0o755)


def test_a_mismatched_interpreter_is_one_sentence(plugin_dir: Path, tmp_path: Path, cache: Path) -> None:
    faked = tmp_path / "hello"
    with_meta(plugin_dir / "hello", faked, {"version": "3.99", "ext_suffix": ".cpython-399-x86_64-linux-gnu.so"})
    done = run_plain(faked, env_with(cache))
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("hello: this plugin was built for cpython 3.99 (linux-x86_64, extensions ")
    assert "install python3.99 or build the plugin again with `driversdk plugin package --python PATH`" in lines[0]
    assert not cache.exists(), "nothing extracted for an interpreter that cannot load it"


def test_a_missing_interpreter_is_one_sentence(plugin_dir: Path, tmp_path: Path) -> None:
    """The default preamble looks python3.11 up on PATH, as Nomad's environment gives it."""
    done = subprocess.run(
        [str(plugin_dir / "hello")], capture_output=True, text=True, env={"PATH": str(tmp_path)}, timeout=30
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "this plugin needs python3.11 (cpython 3.11 (linux-x86_64)), which is not found" in done.stderr


# --- bad input loses nothing ----------------------------------------------------------------------


def staging_dirs() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("driversdk-package-")}


@pytest.mark.parametrize(
    ("target", "extra", "sentence"),
    [
        ("no_such_module:Driver", [], "no module 'no_such_module' is importable here"),
        ("examples.hello_driver:Nope", [], "does not import from the packaged files (AttributeError"),
        ("examples.hello_driver:log", [], "is neither a DriverPlugin (class or instance) nor a function"),
        ("not a module", [], "is not MODULE or MODULE:ATTR"),
        ("examples.hello_driver", ["--python", "python3"], "must be an absolute path"),
        ("examples.hello_driver", ["--python", "/usr/bin/false"], "--python /usr/bin/false does not run"),
    ],
)
def test_a_driver_that_cannot_be_packaged_leaves_nothing(
    target: str, extra: list[str], sentence: str, tmp_path: Path
) -> None:
    before = staging_dirs()
    out = tmp_path / "out"
    done = cli("plugin", "package", target, "-o", str(out), *extra)
    assert done.returncode == 1, done.stdout
    assert sentence in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert os.listdir(tmp_path) == []
    assert staging_dirs() - before == set(), "the staging dir is removed"


# --- README ---------------------------------------------------------------------------------------


def readme_block(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- example: {marker} -->\s*```(?:sh|shell|bash)\n(.*?)```", text, re.S)
    assert match, f"README.md has no block marked <!-- example: {marker} -->"
    return match.group(1)


def test_readme_package_and_probe_commands_work(tmp_path: Path) -> None:
    block = readme_block("package")
    assert "driversdk plugin package" in block and "driversdk plugin probe" in block
    script = block.replace("/opt/nomad/plugins", str(tmp_path))
    bindir = Path(sys.executable).parent
    done = subprocess.run(
        ["sh", "-ec", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "health:       HEALTHY" in done.stdout
    hcl = re.search(r"<!-- example: client -->\s*```hcl\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert hcl and 'plugin_dir = "/opt/nomad/plugins"' in hcl.group(1) and 'plugin "hello"' in hcl.group(1)
