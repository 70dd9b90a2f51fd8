"""Settings for the whole suite, and the guard that nothing a test module started outlives it.

A detached process (a log collector, a task supervisor, a plugin a killed run left) is no child of
pytest, so nothing else would notice it staying behind. Every process a test starts inherits this
session's token and the test's PYTEST_CURRENT_TEST; at the end of each module, one carrying both
that is still alive and no descendant of pytest is a leak, and fails the module's last test with
its command line (after which it is killed, so the next module starts clean).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

SESSION_ENV = "DRIVERSDK_TEST_SESSION"
# Processes that are exiting (a collector draining, a plugin shutting down) get this long to go.
EXIT_GRACE = 5.0
# Long-lived host services a test may (re)start; they are the machine's, not the test's.
HOST_SERVICES = frozenset({"dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "docker-proxy"})


@dataclass(frozen=True)
class Leftover:
    pid: int
    start: int  # clock ticks since boot, so a reused pid is never taken for the process
    cmdline: str
    test: str  # the PYTEST_CURRENT_TEST it was started under


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[0], int(fields[1]), int(fields[19])


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def _text(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _descends_from(pid: int, ancestor: int) -> bool:
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        info = _stat(pid)
        if info is None:
            return False
        pid, seen = info[1], seen + 1
    return False


def _uptime_ticks() -> int:
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def leftovers(test: Callable[[str], bool], token: str, since: int = 0) -> list[Leftover]:
    """Live processes this session started (after ``since``) during a test ``test`` accepts (by the
    PYTEST_CURRENT_TEST they were started under) that pytest no longer parents."""
    me = os.getpid()
    found: list[Leftover] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        info = _stat(pid)
        if info is None or info[0] in ("Z", "X") or info[2] < since:
            continue
        env = _environ(pid)
        started_by = env.get("PYTEST_CURRENT_TEST", "")
        if env.get(SESSION_ENV) != token or not test(started_by.rpartition(" ")[0]):
            continue
        if _text(pid, "comm") in HOST_SERVICES or _descends_from(pid, me):
            continue
        found.append(Leftover(pid, info[2], _text(pid, "cmdline"), started_by))
    return found


def _still(leftover: Leftover) -> bool:
    info = _stat(leftover.pid)
    return info is not None and info[0] not in ("Z", "X") and info[2] == leftover.start


def _kill(found: list[Leftover]) -> None:
    for p in found:
        if _still(p):
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.failed:
        item.stash[_FAILED] = True


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def kill_orphans_if_failed(request: pytest.FixtureRequest, session_token: str) -> Iterator[None]:
    """For a test that kills a run on purpose: when it fails before the next run has recovered what
    the killed one left (collectors, task supervisors, plugins), those are killed here instead of
    outliving the session. A test that passes is left to the module's guard, so a product leak
    still fails."""
    yield
    if request.node.stash.get(_FAILED, False):
        _kill(leftovers(request.node.nodeid.__eq__, session_token))


@pytest.fixture(scope="session")
def session_token() -> Iterator[str]:
    """Marks every process this session starts, so a concurrent session's are never counted here."""
    token = uuid.uuid4().hex
    before = os.environ.get(SESSION_ENV)
    os.environ[SESSION_ENV] = token
    yield token
    if before is None:
        os.environ.pop(SESSION_ENV, None)
    else:
        os.environ[SESSION_ENV] = before


@pytest.fixture(scope="module", autouse=True)
def module_leaves_no_process(request: pytest.FixtureRequest, session_token: str) -> Iterator[None]:
    since = _uptime_ticks()
    yield
    module = request.node.nodeid
    found = leftovers(lambda test: test.startswith(module + "::"), session_token, since)
    deadline = time.monotonic() + EXIT_GRACE
    while found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = [p for p in found if _still(p)]
    _kill(found)  # recorded below; killed so the next module starts clean
    if found:
        lines = "\n".join(f"  pid {p.pid} (from {p.test}): {p.cmdline}" for p in found)
        pytest.fail(f"{module} left {len(found)} process(es) running after its tests:\n{lines}", pytrace=False)
