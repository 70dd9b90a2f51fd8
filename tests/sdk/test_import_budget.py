"""What a plugin process has imported when it answers its first RPC: a structural check, no timer.

The plugin is launched as a host launches it (``driversdk.launch``, which returns once PluginInfo
has answered); a ``sitecustomize`` on its PYTHONPATH makes SIGUSR1 write ``sys.modules`` to a
file, and the test sends it right after. Start-up cost is the modules loaded before the first
answer, so pinning which ones are not loaded keeps start-up fast without measuring it here
(bench/bench_launch.py measures it).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from driversdk.client import launch
from driversdk.errors import PluginCallError

ROOT = Path(__file__).resolve().parents[2]
HELLO = [sys.executable, str(ROOT / "examples" / "hello_driver.py")]
DEFERRED = [sys.executable, str(ROOT / "tests" / "sdk" / "plugins" / "deferred_driver.py")]

SITECUSTOMIZE = textwrap.dedent(
    """
    import os
    import signal
    import sys

    if os.environ.get("DRIVERSDK_TEST_NO_PRELOAD"):
        # What a preloading plugin (the docker one) loads before its first answer, without the
        # build its preload thread starts right after the handshake racing the dump.
        import driversdk.service

        driversdk.service.DriverSource.preload = lambda self: None

    _DUMP = os.environ.get("DRIVERSDK_MODULES_DUMP")
    if _DUMP:

        def _dump(signum, frame):
            with open(_DUMP + ".tmp", "w") as fh:
                fh.write("\\n".join(sorted(sys.modules)))
            os.replace(_DUMP + ".tmp", _DUMP)

        signal.signal(signal.SIGUSR1, _dump)
    """
)

# Loaded by the first call that needs them, never before the first answer: the schema classes and
# their parser, the msgpack codec, the model <-> protobuf conversion, the error-status messages,
# the host and runner sides, and every driver's heavy dependency.
NEVER_BEFORE_FIRST_RPC = (
    "driversdk.hclspec.spec",
    "driversdk.hclspec.codec",
    "driversdk.hclspec.literals",
    "driversdk.hclspec.types",
    "msgpack",
    "driversdk.convert",
    "grpc_status",
    "google.rpc",
    "driversdk.client",
    "driversdk.jobspec",
    "driversdk.agent",
    "driversdk.csi",
    "driversdk.testing",
    "pyroute2",
    "docker",
    "requests",
    "hcl2",
    "lark",
)


def _env(tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    dump = tmp_path / "modules.txt"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["DRIVERSDK_MODULES_DUMP"] = str(dump)
    env.update(extra)
    return env, dump


def _wait_for_dump(dump: Path) -> set[str]:
    deadline = time.monotonic() + 15
    while not dump.exists():
        assert time.monotonic() < deadline, "the plugin never wrote its module list"
        time.sleep(0.02)
    return set(dump.read_text().split())


def modules_at_first_rpc(cmd: list[str], tmp_path: Path, **extra: str) -> set[str]:
    env, dump = _env(tmp_path, **extra)
    client = launch(cmd, env=env, name="budget")  # returns once PluginInfo has answered
    try:
        os.kill(client.process.pid, signal.SIGUSR1)
        return _wait_for_dump(dump)
    finally:
        client.kill()


def _loaded(modules: set[str], package: str) -> list[str]:
    return sorted(m for m in modules if m == package or m.startswith(package + "."))


def _assert_none_loaded(modules: set[str], packages: tuple[str, ...]) -> None:
    leaked = {p: _loaded(modules, p) for p in packages if _loaded(modules, p)}
    assert not leaked, f"loaded before the first RPC was answered: {leaked}"


def test_the_dump_sees_what_the_plugin_loaded(tmp_path: Path) -> None:
    # Without this, a hook that never ran would make every other test here pass.
    modules = modules_at_first_rpc(HELLO, tmp_path)
    assert {"grpc", "driversdk.plugin.server", "driversdk.service", "driversdk.model"} <= modules


def test_the_example_driver_loads_only_what_serving_needs(tmp_path: Path) -> None:
    modules = modules_at_first_rpc(HELLO, tmp_path)
    _assert_none_loaded(modules, NEVER_BEFORE_FIRST_RPC)


@pytest.mark.parametrize(
    ("driver", "also_not"),
    [
        # Each bundled driver is built after the handshake (on its preload thread, held back
        # here): neither it nor the data model is loaded before the first answer.
        ("docker", ("drivers.docker.driver", "drivers.docker.config", "driversdk.model")),
        ("exec", ("drivers.exec.driver", "drivers.exec.bundle", "driversdk.taskkit.cgroups", "driversdk.model")),
        ("raw_exec", ("drivers.raw_exec.driver", "driversdk.taskkit.cgroups", "driversdk.model")),
    ],
)
def test_a_bundled_driver_defers_its_heavy_imports(tmp_path: Path, driver: str, also_not: tuple[str, ...]) -> None:
    extra = {"DRIVERSDK_TEST_NO_PRELOAD": "1"}
    modules = modules_at_first_rpc([sys.executable, "-m", f"drivers.{driver}"], tmp_path, **extra)
    assert f"drivers.{driver}.main" in modules
    _assert_none_loaded(modules, NEVER_BEFORE_FIRST_RPC + also_not)


def test_a_deferred_driver_is_built_once_by_the_first_call_that_needs_it(tmp_path: Path) -> None:
    builds = tmp_path / "builds"
    env, _ = _env(tmp_path, DEFERRED_BUILDS=str(builds))
    client = launch(DEFERRED, env=env, name="deferred")
    try:
        info = client.plugin_info()
        assert (info.name, info.plugin_version) == ("hello", "0.1.0")
        assert not builds.exists(), "PluginInfo must be answered without building the driver"
        client.set_config({"greeting": "hi"})
        assert client.capabilities().exec
        client.task_config_schema()
        assert builds.read_text() == "built\n"
    finally:
        client.kill()


def test_a_preloaded_driver_is_built_after_the_handshake_without_a_call(tmp_path: Path) -> None:
    builds = tmp_path / "builds"
    env, _ = _env(tmp_path, DEFERRED_BUILDS=str(builds), DEFERRED_PRELOAD="1")
    client = launch(DEFERRED, env=env, name="deferred")  # PluginInfo answers, which builds nothing
    try:
        deadline = time.monotonic() + 15
        while not builds.exists():
            assert time.monotonic() < deadline, "serve(preload=True) never built the driver on its own"
            time.sleep(0.02)
        client.set_config({"greeting": "hi"})
        assert client.capabilities().exec
        assert builds.read_text() == "built\n", "the calls used the preloaded driver, not a second build"
    finally:
        client.kill()


def test_a_preloaded_driver_that_cannot_be_built_answers_every_call_with_why(tmp_path: Path) -> None:
    builds = tmp_path / "builds"
    env, _ = _env(tmp_path, DEFERRED_BUILDS=str(builds), DEFERRED_MODE="fail", DEFERRED_PRELOAD="1")
    client = launch(DEFERRED, env=env, name="deferred")
    try:
        for call in (client.capabilities, lambda: client.set_config({})):
            with pytest.raises(PluginCallError) as caught:
                call()
            assert "the hello driver could not be loaded: No module named 'heavy_sdk'" in str(caught.value)
        assert builds.read_text() == "built\n"
        assert client.plugin_info().name == "hello"
    finally:
        client.kill()


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("fail", "the hello driver could not be loaded: No module named 'heavy_sdk'"),
        ("mismatch", "it calls itself hello 0.1.0, but serve() declared hello 9.9.9 in PluginInfo"),
    ],
)
def test_a_deferred_driver_that_cannot_be_built_fails_every_call_with_why(tmp_path: Path, mode: str, why: str) -> None:
    builds = tmp_path / "builds"
    env, _ = _env(tmp_path, DEFERRED_BUILDS=str(builds), DEFERRED_MODE=mode)
    client = launch(DEFERRED, env=env, name="deferred")
    try:
        for call in (client.capabilities, client.init, lambda: client.set_config({})):
            with pytest.raises(PluginCallError) as caught:
                call()
            assert why in str(caught.value)
        assert builds.read_text() == "built\n", "a failed build is reported again, not retried"
        assert client.plugin_info().name == "hello"
    finally:
        client.kill()


@pytest.mark.parametrize(("driver", "extra"), [("docker", "docker"), ("exec", "pyroute2"), ("raw_exec", None)])
def test_each_bundled_plugin_declares_the_name_and_version_its_driver_has(driver: str, extra: str | None) -> None:
    # PluginInfo answers with what main.py declares before the driver is built; the SDK refuses a
    # driver that disagrees once it is.
    if extra is not None:
        pytest.importorskip(extra)
    main = importlib.import_module(f"drivers.{driver}.main")
    built = main.build(for_checks=True)
    try:
        assert (built.name, built.version) == (main.NAME, main.VERSION)
    finally:
        built.shutdown()
