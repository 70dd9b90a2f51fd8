"""driversdk's pytest plugin, as a driver author meets it: each case runs pytest in a subprocess on
a small test file, with the plugin found through the installed ``pytest11`` entry point."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.hostcheck import processes

REPO = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).resolve().parent / "plugins"
HELLO = REPO / "examples" / "hello_driver.py"


def run_pytest(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    # pytest prints its short summary untruncated when it thinks it runs in CI (CI or
    # BUILD_NUMBER set), which repeats each error's message; the inner run's output must
    # not depend on where the outer run happens.
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def outcomes(output: str) -> dict[str, int]:
    """pytest's last summary line ("1 passed, 2 errors in 3.1s") as {"passed": 1, "errors": 2}."""
    last = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last.split(" in ")[0])}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A driver author's project directory of its own (no pyproject of ours above it)."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    return root


def run_project(project: Path, test: str, *extra: str) -> subprocess.CompletedProcess[str]:
    (project / "test_it.py").write_text(textwrap.dedent(test))
    try:
        return run_pytest(["-q", "--basetemp", str(project.parent / "basetemp"), *extra, "test_it.py"], project)
    finally:
        # Whatever the plugin under test failed to clean up is ours to end.
        for line in processes(str(project.parent / "basetemp")):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)


def test_the_plugin_is_registered_and_loaded(pytestconfig: pytest.Config) -> None:
    assert "driversdk.testing.pytest_plugin" in {e.value for e in entry_points(group="pytest11")}
    assert pytestconfig.pluginmanager.hasplugin("driversdk")


def test_examples_conformance_passes_through_the_plugin() -> None:
    done = run_pytest(["-q", "examples/tests"], REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert outcomes(done.stdout) == {"passed": 2}, done.stdout


def test_leak_tracker_fails_a_test_that_leaves_things_behind(project: Path) -> None:
    done = run_project(
        project,
        """
        import os, subprocess

        def test_clean(leak_tracker, tmp_path):
            subprocess.run(["sh", "-c", f"sleep 0.1; : {tmp_path}"], check=True)
            fifo = tmp_path / "gone.fifo"
            os.mkfifo(fifo)
            fifo.unlink()

        def test_leaky(leak_tracker, tmp_path):
            leak_tracker.grace = 1.0
            subprocess.Popen(["sh", "-c", f"sleep 300; : {tmp_path}"], start_new_session=True)
            os.mkfifo(tmp_path / "left.fifo")
            if os.geteuid() == 0:
                (tmp_path / "mnt").mkdir()
                subprocess.run(["mount", "-t", "tmpfs", "leak", str(tmp_path / "mnt")], check=True)
        """,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    # pytest reports a failure found in teardown as an error of that test (its call had passed).
    assert outcomes(out) == {"passed": 2, "error": 1}, out
    assert "ERROR at teardown of test_leaky" in out
    assert re.search(r"process \d+ \(sh -c sleep 300; : \S+test_leaky0", out), out
    assert re.search(r"process \d+ \(sleep 300,", out), out
    assert re.search(r"fifo \S+test_leaky0/left.fifo", out), out
    if os.geteuid() == 0:
        assert re.search(r"mount \S+test_leaky0/mnt", out), out
    # The tracker ended what it reported, so one leaky test does not break the next.
    assert not processes("sleep 300; : " + str(project.parent / "basetemp"))
    assert not [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if "test_leaky0" in line]


def test_driver_harness_fails_a_test_whose_plugin_printed_a_traceback(project: Path) -> None:
    done = run_project(
        project,
        f"""
        import sys
        import pytest
        from driversdk.errors import PluginCallError

        @pytest.fixture
        def driver_command():
            return [sys.executable, {str(PLUGINS / "crashing_driver.py")!r}]

        @pytest.mark.parametrize("bug", ["raise", "thread"])
        def test_bug(driver_harness, task_config_factory, bug):
            with pytest.raises(PluginCallError):
                driver_harness.start(task_config_factory({{"command": bug}}))

        def test_no_bug(driver_harness, task_config_factory):
            task = task_config_factory({{"command": "/bin/true"}})
            driver_harness.start(task)
            assert driver_harness.client.wait_task(task.id, timeout=30).exit_code == 0
        """,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert outcomes(out) == {"passed": 3, "errors": 2}, out
    assert "ERROR at teardown of test_bug[raise]" in out and "ERROR at teardown of test_bug[thread]" in out
    assert "RuntimeError: crashing_driver: unexpected failure in start_task" in out
    assert "LookupError: crashing_driver: background thread died" in out
    assert out.count("printed 1 Python traceback(s)") == 2, out


def test_command_and_config_come_from_the_ini_or_the_command_line(project: Path) -> None:
    test = """
        def test_greeting(driver_harness):
            fingerprint = next(iter(driver_harness.client.fingerprint()))
            assert fingerprint.attributes["driver.hello.greeting"].value == "hey"
        """
    (project / "pytest.ini").write_text(
        f"[pytest]\ndriversdk_driver_command = {sys.executable} {HELLO}\n"
        'driversdk_plugin_config = {"greeting": "hey"}\n'
    )
    done = run_project(project, test)
    assert done.returncode == 0, done.stdout + done.stderr

    (project / "pytest.ini").write_text('[pytest]\ndriversdk_plugin_config = {"greeting": "hey"}\n')
    done = run_project(project, test, f"--driver-command={sys.executable} {HELLO}")
    assert done.returncode == 0, done.stdout + done.stderr

    done = run_project(project, test)
    assert outcomes(done.stdout) == {"error": 1}, done.stdout
    assert "no driver to test: override the driver_command fixture" in done.stdout


def test_a_failing_conformance_check_is_not_buried_under_the_plugins_debug_lines(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = f"""
        import os
        import sys
        import pytest

        os.environ["LIE"] = "signals"

        @pytest.fixture
        def driver_command():
            return [sys.executable, {str(PLUGINS / "lies_driver.py")!r}]

        def test_claims(conformance):
            conformance(lambda argv: {{"command": argv[0], "args": list(argv[1:])}})
        """
    monkeypatch.delenv("DRIVERSDK_VERBOSE", raising=False)
    done = run_project(project, test)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "FAIL send_signals: SignalTask(SIGUSR1) succeeded but the task's trap never ran" in out
    assert "advertised: send_signals=True" in out
    assert "DEBUG" not in out and "plugin started" not in out, out
    monkeypatch.setenv("DRIVERSDK_VERBOSE", "1")
    verbose = run_project(project, test)
    assert "plugin started" in verbose.stdout, "DRIVERSDK_VERBOSE=1 shows the plugin's log lines"
