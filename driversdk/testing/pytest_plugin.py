"""pytest fixtures for driver authors, loaded through the ``pytest11`` entry point.

A third-party driver's conformance test is then a few lines::

    @pytest.fixture
    def driver_command() -> list[str]:
        return [sys.executable, "mydriver.py"]

    def test_claims_hold(conformance: Conformance) -> None:
        conformance(lambda argv: {"command": argv[0], "args": list(argv[1:])})

The plugin defines fixtures and command-line/ini options only, and no hooks that act on
tests: a project that installs driversdk but never asks for these fixtures sees no change.

Fixtures:

- ``driver_command`` / ``plugin_config``: what to launch and the plugin ``config {}`` sent in
  SetConfig. Override them in a conftest, or set ``--driver-command`` (or the ini key
  ``driversdk_driver_command``, shlex-split) and the ini key ``driversdk_plugin_config`` (JSON).
- ``driver_harness``: a :class:`DriverHarness` for the test; shut down after it, and the test
  fails if the plugin printed a Python traceback on its stderr.
- ``alloc_dir`` / ``task_config_factory``: an allocation directory with a task ``"task"`` and
  its log fifos under ``tmp_path``, removed after the test; TaskConfigs built in it.
- ``leak_tracker``: fails the test if it left anything behind (processes, mounts, fifos);
  the other fixtures use it, so every test with a harness is checked.
- ``conformance``: runs :func:`run_conformance` and asserts every check passed.

A failure found after the test body ran (a leak, a traceback) is reported by pytest as an
error in the test's teardown; either way the run fails and names the test.

Every pytest run in an environment with driversdk installed imports this module, so it imports
only the light part of the SDK at load time; the rest is imported by the fixtures that need it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shlex
import signal
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from driversdk.testing import AllocDir, DriverHarness

if TYPE_CHECKING:
    from driversdk.model import TaskConfig
    from driversdk.testing.conformance import CheckResult, TaskFactory

__all__ = ["Conformance", "LeakTracker", "StderrTracebacks", "TaskConfigFactory"]

_COMMAND_INI = "driversdk_driver_command"
_CONFIG_INI = "driversdk_plugin_config"
_TRACEBACK = "Traceback (most recent call last):"
_MNT_DETACH = 2


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("driversdk", "driversdk driver testing")
    group.addoption(
        "--driver-command",
        dest=_COMMAND_INI,
        default=None,
        help="command line of the driver plugin under test (shlex-split); overrides the ini key",
    )
    parser.addini(_COMMAND_INI, "command line of the driver plugin under test (shlex-split)", default="")
    parser.addini(_CONFIG_INI, "the plugin config {} sent in SetConfig, as a JSON object", default="")


# --- leaks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Process:
    pid: int
    ppid: int
    started: str  # /proc starttime: with the pid, it names one process even if the pid is reused
    cmdline: str
    cwd: str
    zombie: bool


def _read_process(pid: int) -> _Process | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(") ", 1)[1].split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
        return None
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = ""
    return _Process(pid, int(fields[1]), fields[19], cmdline, cwd, fields[0] in ("Z", "X"))


def _all_processes() -> dict[int, _Process]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (proc := _read_process(int(name))) is not None:
            found[proc.pid] = proc
    return found


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class LeakTracker:
    """What a test leaves on the host under its own directory, compared before and after.

    A process counts as the test's when it descends from this pytest process, or its command
    line mentions ``root``, or its working directory is under ``root`` (a task started in an
    alloc dir and orphaned when its plugin died). Mounts and fifos count when under ``root``.
    """

    def __init__(self, root: str | os.PathLike[str], *, grace: float = 5.0) -> None:
        self.root = os.path.realpath(root)
        # Things that exit or unmount asynchronously (a task killed with its plugin) get this long.
        self.grace = grace
        self._before_processes: set[tuple[int, str]] = set()
        self._before_mounts: set[str] = set()
        self._before_fifos: set[str] = set()

    def _ours(self) -> dict[tuple[int, str], _Process]:
        table = _all_processes()
        me = os.getpid()

        def descends(proc: _Process) -> bool:
            seen: set[int] = set()
            while proc.ppid > 1 and proc.ppid not in seen:
                if proc.ppid == me:
                    return True
                seen.add(proc.ppid)
                parent = table.get(proc.ppid)
                if parent is None:
                    return False
                proc = parent
            return False

        return {
            (p.pid, p.started): p
            for p in table.values()
            if p.pid != me
            and not p.zombie  # an exited child not yet reaped holds nothing but its pid
            and (self.root in p.cmdline or _under(p.cwd, self.root) or descends(p))
        }

    def _mounts(self) -> set[str]:
        from driversdk.mountinfo import read_mountinfo

        return {e.mount_point for e in read_mountinfo() if _under(e.mount_point, self.root)}

    def _fifos(self) -> set[str]:
        found: set[str] = set()
        try:
            root_dev = os.stat(self.root).st_dev
        except FileNotFoundError:
            return found
        for top, dirs, files in os.walk(self.root):
            # Do not walk into what is mounted under the test dir (an image rootfs, a host volume).
            dirs[:] = [d for d in dirs if _same_device(os.path.join(top, d), root_dev)]
            for name in files:
                path = os.path.join(top, name)
                with contextlib.suppress(OSError):
                    if stat.S_ISFIFO(os.lstat(path).st_mode):
                        found.add(path)
        return found

    def start(self) -> None:
        self._before_processes = set(self._ours())
        self._before_mounts = self._mounts()
        self._before_fifos = self._fifos()

    def _new_processes(self) -> list[_Process]:
        return [p for key, p in sorted(self._ours().items()) if key not in self._before_processes]

    def leaks(self) -> list[str]:
        """Everything new since :meth:`start`, one line each; waits up to ``grace`` for it to go."""
        deadline = time.monotonic() + self.grace
        while True:
            processes = self._new_processes()
            mounts = sorted(self._mounts() - self._before_mounts)
            if (not processes and not mounts) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        fifos = sorted(self._fifos() - self._before_fifos)
        return (
            [f"process {p.pid} ({p.cmdline or '?'}, cwd {p.cwd or '?'})" for p in processes]
            + [f"mount {m}" for m in mounts]
            + [f"fifo {f}" for f in fifos]
        )

    def clean_up(self) -> None:
        """Kill the leaked processes and detach the leaked mounts, so one leaky test does not
        break the next, and pytest's later removal of old tmp dirs never descends into a mount."""
        for proc in self._new_processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
        libc = ctypes.CDLL(None, use_errno=True)
        for mount in sorted(self._mounts() - self._before_mounts, key=len, reverse=True):
            libc.umount2(mount.encode(), _MNT_DETACH)

    def check(self) -> None:
        left = self.leaks()
        if left:
            self.clean_up()
            pytest.fail(
                f"the test left {len(left)} thing(s) behind under {self.root} (now cleaned up):\n  "
                + "\n  ".join(left),
                pytrace=False,
            )


def _same_device(path: str, dev: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_dev == dev


def verbose() -> bool:
    """DRIVERSDK_VERBOSE=1: show every line the plugin logged (grpc's debug lines too)."""
    return os.environ.get("DRIVERSDK_VERBOSE", "") not in ("", "0")


# --- plugin stderr ---------------------------------------------------------------------------


class StderrTracebacks(logging.Handler):
    """Collects the plugin stderr lines the host logs (driversdk.plugin.*) and finds tracebacks.

    A plugin prints one either as a raw block (an exception in a thread, a crash before logging
    was set up) or inside one hclog JSON message (``log.exception``, an unexpected error in a
    driver call). Both mean the driver hit an exception it did not turn into a sentence.
    """

    LOGGER = "driversdk.plugin"
    EXCERPT_LINES = 40

    def __init__(self) -> None:
        super().__init__(level=1)
        self.lines: list[str] = []
        self._saved_level = logging.NOTSET
        self._saved_propagate = True

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        # The plugin's DEBUG chatter (grpc, the handshake) would bury a failing check in pytest's
        # captured log: only warnings and errors go on, everything with DRIVERSDK_VERBOSE=1.
        if record.levelno >= logging.WARNING or verbose():
            logging.getLogger("driversdk").handle(record)

    def __enter__(self) -> StderrTracebacks:
        logger = logging.getLogger(self.LOGGER)
        self._saved_level = logger.level
        self._saved_propagate = logger.propagate
        # The host logs raw stderr lines at DEBUG; the logger must let them through to us.
        logger.setLevel(1)
        logger.propagate = False
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger(self.LOGGER)
        logger.removeHandler(self)
        logger.setLevel(self._saved_level)
        logger.propagate = self._saved_propagate

    def tracebacks(self) -> list[str]:
        """Each traceback seen, as text."""
        found: list[str] = []
        lines = list(self.lines)
        for i, line in enumerate(lines):
            at = line.find(_TRACEBACK)
            if at < 0:
                continue
            if "\n" in line:
                found.append(line[at:])
                continue
            block = [line]
            for follow in lines[i + 1 : i + self.EXCERPT_LINES]:
                block.append(follow)
                if not follow.startswith(" "):
                    break  # the exception line ends the block
            found.append("\n".join(block))
        return found


def _wait_stderr_drained(harness: DriverHarness, timeout: float = 2.0) -> None:
    """The host reads plugin stderr in a thread; once the plugin has exited, wait (briefly) until
    that thread reached end-of-file, so a traceback printed while shutting down is seen."""
    popen = getattr(harness.client.process, "_popen", None)
    stream = getattr(popen, "stderr", None)
    deadline = time.monotonic() + timeout
    while stream is not None and not stream.closed and time.monotonic() < deadline:
        time.sleep(0.02)


# --- fixtures --------------------------------------------------------------------------------


class TaskConfigFactory(Protocol):
    def __call__(
        self, driver_config: Mapping[str, Any] | None = None, *, task: str = "task", **kwargs: Any
    ) -> TaskConfig: ...


class Conformance(Protocol):
    def __call__(self, factory: TaskFactory, *, timeout: float = 60.0) -> list[CheckResult]: ...


@pytest.fixture
def driver_command(request: pytest.FixtureRequest) -> Sequence[str]:
    """The driver plugin's command line. Override this fixture, or set --driver-command or the
    ini key driversdk_driver_command."""
    text = request.config.getoption(_COMMAND_INI) or request.config.getini(_COMMAND_INI)
    if not text:
        pytest.fail(
            "no driver to test: override the driver_command fixture (return the plugin's argv), "
            f"or pass --driver-command, or set {_COMMAND_INI} in the pytest ini",
            pytrace=False,
        )
    return shlex.split(str(text))


@pytest.fixture
def plugin_config(request: pytest.FixtureRequest) -> Mapping[str, Any]:
    """The plugin's config {} as SetConfig sends it. Override this fixture, or set the ini key
    driversdk_plugin_config to a JSON object. Empty by default."""
    text = str(request.config.getini(_CONFIG_INI) or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        pytest.fail(f"{_CONFIG_INI} is not JSON: {err}", pytrace=False)
    if not isinstance(value, dict):
        pytest.fail(f"{_CONFIG_INI} must be a JSON object, not {type(value).__name__}", pytrace=False)
    return value


@pytest.fixture
def leak_tracker(tmp_path: Path) -> Iterator[LeakTracker]:
    """Fails the test if it leaves processes, mounts or fifos of its own behind."""
    tracker = LeakTracker(tmp_path)
    tracker.start()
    yield tracker
    tracker.check()


@pytest.fixture
def driver_harness(
    driver_command: Sequence[str], plugin_config: Mapping[str, Any], leak_tracker: LeakTracker
) -> Iterator[DriverHarness]:
    """The driver plugin launched as Nomad launches it; every task the test started through
    ``harness.start`` is destroyed after it, then the plugin is shut down."""
    with StderrTracebacks() as stderr:
        harness = DriverHarness(driver_command, plugin_config=plugin_config)
        try:
            yield harness
        finally:
            harness.close()
            _wait_stderr_drained(harness)
    if found := stderr.tracebacks():
        pytest.fail(
            f"the driver plugin printed {len(found)} Python traceback(s) on its stderr; a driver should "
            "turn failures into DriverError sentences:\n\n" + "\n\n".join(found),
            pytrace=False,
        )


@pytest.fixture
def alloc_dir(tmp_path: Path, leak_tracker: LeakTracker) -> Iterator[AllocDir]:
    """An allocation directory with a task named "task" and its log fifos; removed after."""
    alloc = AllocDir.create(tmp_path / "allocs", tasks=["task"])
    yield alloc
    alloc.remove()


@pytest.fixture
def task_config_factory(alloc_dir: AllocDir) -> TaskConfigFactory:
    """``make(driver_config, task="task", **AllocDir.task_config options) -> TaskConfig``;
    a fresh task id per call."""

    def make(driver_config: Mapping[str, Any] | None = None, *, task: str = "task", **kwargs: Any) -> TaskConfig:
        return alloc_dir.task_config(task, driver_config=driver_config, **kwargs)

    return make


@pytest.fixture
def conformance(driver_harness: DriverHarness, tmp_path: Path) -> Conformance:
    """``conformance(factory)`` runs every conformance check against the driver and fails the
    test with each failed check's own sentence; returns the results."""

    def run(factory: TaskFactory, *, timeout: float = 60.0) -> list[CheckResult]:
        from driversdk.testing.conformance import run_conformance

        workdir = tmp_path / "conformance"
        workdir.mkdir(exist_ok=True)
        results = run_conformance(driver_harness, factory, str(workdir), timeout=timeout)
        failed = [str(r) for r in results if not r.passed]
        assert not failed, "what the driver advertises does not hold:\n" + "\n".join(failed)
        return results

    return run
