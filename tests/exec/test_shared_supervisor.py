"""One shared supervisor per plugin state dir runs every exec task, and no runc process stays per
task: the container's init is the supervisor's child (a subreaper), and its real wait status is
recorded. Real runc, real plugin processes; the tests kill the plugin and the supervisor."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from drivers.exec.store import DriverState
from driversdk.model import TaskEvent, TaskHandle
from driversdk.taskkit.owner import ProcessIdentity, stat_fields
from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import PLUGIN, Tracker, sh

pytestmark = pytest.mark.root

TIMEOUT = 120
TASKS = 20
SERVE = "launch.py\0serve\0"


def _state(handle: TaskHandle) -> DriverState:
    return DriverState.decode(handle.driver_state, handle.version)


def _cmdlines() -> dict[int, bytes]:
    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            found[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
    return found


def _supervisors(state_dir: Path) -> list[int]:
    """Task supervisors of this state dir: the shared one, or per-task ones naming a spec in it."""
    needle = str(state_dir).encode()
    return [pid for pid, argv in _cmdlines().items() if b"launch.py" in argv and needle in argv]


def _runc_naming(container_ids: set[str]) -> list[int]:
    return [
        pid
        for pid, argv in _cmdlines().items()
        if os.path.basename(argv.split(b"\0")[0]) == b"runc" and {a.decode() for a in argv.split(b"\0")} & container_ids
    ]


def _parent(pid: int) -> int:
    fields = stat_fields(pid)
    assert fields is not None, f"pid {pid} is gone"
    return int(fields[1])


def _wait_until(predicate: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not reached"
        time.sleep(0.05)


def _waiting(i: int) -> dict[str, object]:
    return sh(f"echo ready; while [ ! -e /alloc/data/go ]; do sleep 0.2; done; exit {i}")


def test_exec_twenty_tasks_run_under_one_supervisor_and_no_runc_process(harness: DriverHarness, track: Tracker) -> None:
    names = [f"t{i}" for i in range(TASKS)]
    alloc = AllocDir.create(track.base / "allocs", tasks=names)
    track.alloc_ids.add(alloc.alloc_id)
    try:
        tasks = [alloc.task_config(n, driver_config=_waiting(i)) for i, n in enumerate(names)]
        states = [_state(harness.start(t)) for t in tasks]
        for name in names:
            alloc.wait_for_output(name, b"ready\n", timeout=TIMEOUT)
        assert _supervisors(track.base / "state") == [states[0].supervisor_pid]
        assert {s.supervisor_pid for s in states} == {states[0].supervisor_pid}
        assert _runc_naming({s.container_id for s in states}) == []
        for s in states:
            # The container's init is the supervisor's child, and the state names it by identity.
            assert _parent(s.task_pid) == s.supervisor_pid
            assert ProcessIdentity(s.task_pid, s.task_start_time).alive()
        (alloc.path / "alloc" / "data" / "go").touch()
        for i, task in enumerate(tasks):
            task_id = task.id
            result = harness.client.wait_task(task_id, timeout=TIMEOUT)
            assert (result.exit_code, result.signal) == (i, 0)
            harness.client.destroy_task(task_id)
            harness.forget(task_id)
    finally:
        alloc.close()


def test_exec_detached_container_records_its_real_exit(harness: DriverHarness, alloc: AllocDir) -> None:
    # Containers that exit at once: the supervisor may reap the init before runc wrote and left
    # its pid file; the exit is matched to the task all the same.
    quick = [alloc.task_config("web", driver_config=sh(f"exit {3 + i}")) for i in range(5)]
    for task in quick:
        harness.start(task)
    for i, task in enumerate(quick):
        assert (r := harness.client.wait_task(task.id, timeout=TIMEOUT)).exit_code == 3 + i and r.signal == 0
    # A task that exits 137 by itself was not killed: no 128 + N guessing for the init's status.
    exits137 = alloc.task_config("web", driver_config=sh("exit 137"))
    harness.start(exits137)
    assert (r := harness.client.wait_task(exits137.id, timeout=TIMEOUT)).exit_code == 137 and r.signal == 0
    killed = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["120"]})
    state = _state(harness.start(killed))
    os.kill(state.task_pid, signal.SIGKILL)
    result = harness.client.wait_task(killed.id, timeout=TIMEOUT)
    assert (result.exit_code, result.signal) == (128 + signal.SIGKILL, signal.SIGKILL)
    assert Path(state.status_file).read_text() == f"{128 + signal.SIGKILL} {int(signal.SIGKILL)}\n"


def test_exec_relaunched_plugin_recovers_tasks_through_the_same_supervisor(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    tasks = [alloc.task_config("web", driver_config=_waiting(i + 5)) for i in range(3)]
    handles = [harness.start(t) for t in tasks]
    alloc.wait_for_output("web", b"ready\nready\nready\n", timeout=TIMEOUT)
    sup = _state(handles[0]).supervisor_pid
    client = harness.restart_plugin()  # SIGKILL, like a crash
    for handle in handles:
        client.recover_task(handle)
    assert _supervisors(track.base / "state") == [sup]
    # A task started now goes to the adopted supervisor, not a new one.
    later = alloc.task_config("web", driver_config=sh("exit 9"))
    assert _state(harness.start(later)).supervisor_pid == sup
    assert client.wait_task(later.id, timeout=TIMEOUT).exit_code == 9
    (alloc.path / "alloc" / "data" / "go").touch()
    for i, task in enumerate(tasks):
        result = client.wait_task(task.id, timeout=TIMEOUT)
        assert (result.exit_code, result.signal) == (i + 5, 0)


def test_exec_supervisor_killed_ends_its_tasks_with_unknown_status_and_the_next_start_gets_a_new_one(
    harness: DriverHarness, alloc: AllocDir, track: Tracker
) -> None:
    events: list[TaskEvent] = []
    stream = harness.client.task_events()
    threading.Thread(target=lambda: events.extend(stream), daemon=True).start()
    tasks = [alloc.task_config("web", driver_config=sh("echo ready; sleep 300")) for _ in range(2)]
    states = [_state(harness.start(t)) for t in tasks]
    alloc.wait_for_output("web", b"ready\nready\n", timeout=TIMEOUT)
    sup = states[0].supervisor_pid
    os.kill(sup, signal.SIGKILL)
    for task in tasks:
        result = harness.client.wait_task(task.id, timeout=TIMEOUT)  # no hang: the plugin ends them
        assert result.exit_code == -1
    _wait_until(
        lambda: sum("exit status unknown because the task supervisor" in e.message for e in events) == 2,
        "an 'exit status unknown' event per task",
    )
    assert all(e.annotations.get("exit_status") == "unknown" for e in events if "unknown" in e.message)
    for s in states:
        assert not ProcessIdentity(s.task_pid, s.task_start_time).alive()
    fresh = alloc.task_config("web", driver_config=sh("exit 4"))
    new_sup = _state(harness.start(fresh)).supervisor_pid
    assert new_sup != sup
    assert harness.client.wait_task(fresh.id, timeout=TIMEOUT).exit_code == 4
    for task in [*tasks, fresh]:
        harness.client.destroy_task(task.id)
        harness.forget(task.id)
    assert not track.leftovers()


def test_exec_task_cannot_reach_the_supervisor_socket(harness: DriverHarness, alloc: AllocDir, track: Tracker) -> None:
    # Looks for any unix socket (and the state dir) from inside the container, as root in it.
    probe = "find / -xdev -type s 2>/dev/null; ls -d {state} 2>&1; echo done".format(state=track.base / "state")
    task = alloc.task_config("web", driver_config=sh(probe))
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
    out = alloc.wait_for_output("web", b"done\n", timeout=TIMEOUT).decode()
    assert "supervisor.sock" not in out and "No such file" in out
    sock = track.base / "state" / "supervisor.sock"
    st = os.stat(sock)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
    # Another host user cannot connect either.
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            os._exit(1)
        except PermissionError:
            os._exit(0)
        except BaseException:
            os._exit(2)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _ask(sock: Path, spec: str) -> str:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(sock))
        r, w = os.pipe()
        try:
            socket.send_fds(conn, [f"spawn {spec}\n".encode()], [w, w])
        finally:
            os.close(r)
            os.close(w)
        return conn.recv(4096).decode()


def test_exec_supervisor_refuses_a_spec_outside_the_state_dir(
    harness: DriverHarness, alloc: AllocDir, track: Tracker, tmp_path: Path
) -> None:
    task = alloc.task_config("web", driver_config=sh("echo ready; sleep 300"))
    harness.start(task)  # brings the supervisor up
    alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
    sock = track.base / "state" / "supervisor.sock"
    marker = tmp_path / "ran"
    outside = tmp_path / "evil"
    outside.mkdir()
    spec = {
        "path": "/bin/touch",
        "argv": ["touch", str(marker)],
        "env": {},
        "cwd": "/",
        "switch_user": False,
        "uid": 0,
        "gid": 0,
        "groups": [],
        "oom_score_adj": None,
        "cgroup_procs": [],
        "netns": "",
        "status_file": str(outside / "exit_status"),
        "signal_in_exit_code": False,
        "pid_file": "",
    }
    (outside / "launch.json").write_text(json.dumps(spec))
    reply = _ask(sock, str(outside / "launch.json"))
    assert reply.startswith("err ") and "is not a launch spec in this state dir" in reply
    # A path that climbs out of the tasks dir is refused the same way.
    climbing = f"{track.base}/state/tasks/../../evil/launch.json"
    assert "is not a launch spec in this state dir" in _ask(sock, climbing)
    # Inside the tasks dir but writing its status file elsewhere: refused too.
    inside = track.base / "state" / "tasks" / "planted"
    inside.mkdir()
    (inside / "launch.json").write_text(json.dumps(spec))
    assert "names a status file outside its task dir" in _ask(sock, str(inside / "launch.json"))
    (inside / "launch.json").unlink()
    inside.rmdir()
    time.sleep(0.2)  # the refused requests ran nothing; give a wrongly started touch time to show
    assert not marker.exists()
    harness.client.stop_task(task.id, timeout=5, signal="SIGKILL")
    assert harness.client.wait_task(task.id, timeout=TIMEOUT).signal == signal.SIGKILL


def _logged_runc(tmp_path: Path) -> tuple[Path, Path]:
    """runc behind a wrapper that writes down each command it is asked for: (the list, the wrapper)."""
    calls = tmp_path / "runc-calls"
    wrapper = tmp_path / "runc-logged"
    real = shutil.which("runc")
    assert real is not None
    wrapper.write_text(f'#!/bin/sh\necho "$1" >> {calls}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return calls, wrapper


def test_exec_stop_signals_the_container_init_without_a_runc_process(
    plugin_config: dict[str, Any], no_leaks: None, alloc: AllocDir, tmp_path: Path
) -> None:
    calls, wrapper = _logged_runc(tmp_path)
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, "runtime_path": str(wrapper)}) as h:
        # The container's init (pid 1 of its namespace) gets only the signals it handles.
        task = alloc.task_config("web", driver_config=sh('trap "exit 42" TERM; echo ready; while :; do sleep 1; done'))
        h.start(task)
        alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
        h.client.stop_task(task.id, timeout=20, signal="SIGTERM")
        assert h.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 42
        h.client.destroy_task(task.id, force=True)
    # The stop was a signal to the init, not a runc process (before: `runc kill` per stop, with
    # `runc delete` most of a 1000-task teardown). runc ran the container and removed it.
    asked = calls.read_text().split()
    assert "kill" not in asked and {"run", "delete"} <= set(asked), asked


def test_exec_kill_after_the_timeout_takes_the_whole_task_without_a_runc_process(
    plugin_config: dict[str, Any], no_leaks: None, alloc: AllocDir, tmp_path: Path
) -> None:
    # A task ignoring SIGTERM (sleep as its namespace's init has no handler) is killed once its
    # kill_timeout is out: SIGKILL to its init takes every process of its pid namespace, the
    # background one it forked too, without `runc kill` (a runc per stopped task at 1000 tasks).
    calls, wrapper = _logged_runc(tmp_path)
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, "runtime_path": str(wrapper)}) as h:
        task = alloc.task_config("web", driver_config=sh("sleep 300 & echo $! > /local/bg; echo ready; exec sleep 300"))
        h.start(task)
        alloc.wait_for_output("web", b"ready\n", timeout=TIMEOUT)
        before = set(_cmdlines())
        h.client.stop_task(task.id, timeout=0.5, signal="SIGTERM")
        result = h.client.wait_task(task.id, timeout=TIMEOUT)
        assert result.signal == signal.SIGKILL, result
        sleepers = [pid for pid, argv in _cmdlines().items() if pid in before and argv == b"sleep\x00300\x00"]
        assert sleepers == [], "the background sleep of the task outlived its init"
        h.client.destroy_task(task.id, force=True)
    asked = calls.read_text().split()
    assert "kill" not in asked and {"run", "delete"} <= set(asked), asked


def test_exec_destroy_ends_a_runc_exec_still_running_in_the_task(harness: DriverHarness, alloc: AllocDir) -> None:
    # DestroyTask looks for the task's runc processes among the plugin's and the supervisor's
    # children (not every process on the node) and kills the task's cgroup: a `runc exec` in
    # flight ends with it, and the ExecTask call answers.
    task = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["300"]})
    container = _state(harness.start(task)).container_id
    answered: list[object] = []

    def exec_long() -> None:
        try:
            answered.append(harness.client.exec_task(task.id, ["/bin/sleep", "300"], timeout=300))
        except Exception as err:  # the destroy ends it: an error answer is fine, a hang is not
            answered.append(err)

    caller = threading.Thread(target=exec_long, daemon=True)
    caller.start()
    deadline = time.monotonic() + TIMEOUT
    while not any(b"exec" in _cmdlines().get(pid, b"") for pid in _runc_naming({container})):
        assert time.monotonic() < deadline, "runc exec never started"
        time.sleep(0.05)
    harness.client.destroy_task(task.id, force=True)
    caller.join(60)
    assert answered, "ExecTask still hangs after its task was destroyed"
    assert _runc_naming({container}) == []
