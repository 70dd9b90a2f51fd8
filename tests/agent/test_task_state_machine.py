"""The task runner's lifecycle is one state machine: a state changes only through its transition
function, which refuses a move its table does not allow; and a driver plugin killed with -9 under
running tasks is each task runner's to handle (it asks for the driver's plugin again and recovers
its own task), with one new plugin for all of them, not the driver manager's."""

from __future__ import annotations

import ast
import json
import os
import queue
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from driversdk.agent.allocrunner import taskrunner, taskstate
from driversdk.agent.allocrunner.taskstate import ALLOWED, IllegalTransition, TaskState, TaskStateMachine
from driversdk.agent.pluginmanager import drivermanager
from tests.agent.driverplugins import alive, exec_client, exec_plugins, sleeping_exec_job, start
from tests.agent.runs import cli, db_rows, leaks, wait_for

# --- the machine ---------------------------------------------------------------------------------


def test_every_state_has_its_row_and_dead_is_final() -> None:
    assert set(ALLOWED) == set(TaskState)
    assert ALLOWED[TaskState.DEAD] == frozenset()
    for state, targets in ALLOWED.items():
        assert state not in targets, f"{state} moves to itself: no change to record"


def test_an_illegal_transition_is_refused_and_changes_nothing() -> None:
    machine = TaskStateMachine("web")
    machine.transition(TaskState.PRESTART, "start")
    machine.transition(TaskState.STARTING, "hooks ran")
    machine.transition(TaskState.RUNNING, "StartTask returned")
    kept = list(machine.history)
    # Running straight to restarting skips the exit the restart policy decides on.
    with pytest.raises(IllegalTransition, match=r'task "web".*from running to restarting'):
        machine.transition(TaskState.RESTARTING, "a bug")
    assert machine.state is TaskState.RUNNING
    assert list(machine.history) == kept, "a refused move is not recorded"
    machine.transition(TaskState.DEAD, "its wait ended")
    for after in TaskState:
        with pytest.raises(IllegalTransition):
            machine.transition(after, "after the end")
    assert [(t.before, t.after) for t in machine.history] == [
        (TaskState.PENDING, TaskState.PRESTART),
        (TaskState.PRESTART, TaskState.STARTING),
        (TaskState.STARTING, TaskState.RUNNING),
        (TaskState.RUNNING, TaskState.DEAD),
    ]


def test_a_guarded_transition_moves_only_from_what_it_expects() -> None:
    machine = TaskStateMachine("web")
    running = (TaskState.RUNNING, TaskState.KILLING)
    assert not machine.transition_if(running, TaskState.KILLING, "kill requested"), "nothing runs yet: no StopTask"
    assert machine.state is TaskState.PENDING
    for after in (TaskState.PRESTART, TaskState.STARTING, TaskState.RUNNING):
        machine.transition(after, "start")
    assert machine.transition_if(running, TaskState.KILLING, "kill requested")
    assert machine.transition_if(running, TaskState.KILLING, "kill requested again"), "a second kill is sent again"
    assert machine.is_(TaskState.KILLING)
    assert sum(t.after is TaskState.KILLING for t in machine.history) == 1


def _assignments_to(attr: str, path: str) -> list[str]:
    """``Class.function`` of every assignment to ``<something>.<attr>`` in the module at ``path``."""
    tree = ast.parse(Path(path).read_text())
    found: list[str] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = where
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{where}.{child.name}" if where else child.name
            if isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Attribute) and sub.attr == attr:
                            found.append(where)
            visit(child, name)

    visit(tree, "")
    return found


def test_the_state_is_written_in_one_function_and_the_runner_keeps_no_lifecycle_flags() -> None:
    assert _assignments_to("_state", taskstate.__file__) == [
        "TaskStateMachine.__init__",
        "TaskStateMachine._move",
    ]
    source = Path(taskrunner.__file__).read_text()
    assert "_state =" not in source and "machine._move" not in source
    for flag in ("started", "_between", "state"):
        assert _assignments_to(flag, taskrunner.__file__) == [], f"the task runner sets {flag} itself"
    assert isinstance(taskrunner.TaskRunner.state, property) and isinstance(taskrunner.TaskRunner.started, property)


# --- a plugin's death, handled by each task's runner ---------------------------------------------


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    out: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.put(line)
        out.put("")

    threading.Thread(target=read, daemon=True).start()
    return out


def _objects(text: str) -> list[dict[str, Any]]:
    """The event objects of ``run --json`` output (two stopping tasks' lines may share a line)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) >= 0:
        obj, at = decoder.raw_decode(text, at)
        found.append(obj)
    return found


@pytest.mark.usefixtures("kill_orphans_if_failed")
def test_a_plugin_killed_with_9_is_dispensed_again_once_and_each_task_runner_recovers_its_task(
    tmp_path: Path,
) -> None:
    client, data = exec_client(tmp_path)
    run = cli("run", str(sleeping_exec_job(tmp_path, "web", 2)), "--client", str(client), "--json")
    proc = start(run)
    events: list[dict[str, Any]] = []
    try:
        lines = _lines(proc)
        wait_for("two running tasks", lambda: len(db_rows(data, "SELECT 1 FROM run_tasks WHERE state='running'")) == 2)
        [dead] = exec_plugins(proc.pid)
        os.kill(dead, signal.SIGKILL)

        def recovered() -> list[dict[str, Any]]:
            return [e for e in events if e["kind"] == "task" and e["message"].startswith("recovered (")]

        while len(recovered()) < 2:
            line = lines.get(timeout=60)
            assert line, "the run ended before both tasks were recovered: " + json.dumps(events)
            events += _objects(line)
        new = exec_plugins(proc.pid)
        assert len(new) == 1 and new[0] != dead, f"one new plugin for both tasks, found {new}"
        assert not alive(dead)
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
        events += _objects(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err  # interrupted
    assert "Traceback" not in err
    # Each task's own runner said what it did, once per task: its recovery event is its own (typed,
    # with its count of the plugin's deaths under it), not a line the driver manager wrote for it.
    relaunching = [e for e in events if "exited; relaunching it and recovering the task" in e["message"]]
    assert sorted(e["alloc"] for e in relaunching) == sorted({e["alloc"] for e in relaunching}), relaunching
    assert len(relaunching) == 2, relaunching
    for event in recovered():
        assert event["type"] == "recovered" and event["details"] == {"plugin_relaunches": "1"}, event
    assert len({e["alloc"] for e in recovered()}) == 2 and len(recovered()) == 2, recovered()
    assert all(not e.get("fails_task") for e in events if e["kind"] == "task"), "no task was lost"
    assert db_rows(data, "SELECT * FROM run_plugins") == []
    assert leaks(None, tmp_path) == []
    # And the driver manager no longer recovers tasks itself.
    assert "recover_task" not in Path(drivermanager.__file__).read_text()
