"""driversdk.taskkit.recorded and .fields: the start sequence every recorded driver (exec,
raw_exec) shares, driven by a small real driver whose tasks run under the real supervisor, and
the JSON reader of records and handles older plugin versions wrote."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from drivers.exec.owner import TaskRecord as ExecRecord
from drivers.exec.store import DriverState
from driversdk import hclspec as hs
from driversdk.errors import ConfigError, DriverError
from driversdk.hclspec import Spec
from driversdk.model import ExitResult, TaskConfig, TaskHandle
from driversdk.taskkit import owner
from driversdk.taskkit.hostcfg import HostPluginConfig
from driversdk.taskkit.recorded import RecordedDriver, Start
from driversdk.taskkit.shared import SharedRunState, Spawned
from driversdk.taskkit.streaming import exit_result
from driversdk.taskkit.supervisor import SPEC_FILE, STATUS_FILE, Launch
from driversdk.testing import AllocDir


@dataclass(frozen=True)
class State(SharedRunState):
    key: str
    home: str
    started_at: float

    @property
    def status_file(self) -> str:
        return os.path.join(self.home, STATUS_FILE)

    @property
    def spec_file(self) -> str:
        return os.path.join(self.home, SPEC_FILE)

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()


@dataclass(frozen=True)
class Record(owner.TaskRecord):
    name: str
    home: str

    @property
    def key(self) -> str:
        return self.name

    @property
    def directory(self) -> str:
        return self.home


class Tiny(RecordedDriver[State, Record]):
    """A recorded driver with no cgroup limits: runs ``program`` from the task config."""

    name = "tiny"
    record_type = Record

    def __init__(self, state_dir: str, cgroup_parent: str) -> None:
        super().__init__()
        self.config = HostPluginConfig(state_dir, cgroup_parent)
        self.built: list[str] = []

    def prepare(self, task: TaskConfig) -> Start[State]:
        key = "tiny-" + task.id.replace("/", "-")
        state = State(key, os.path.join(self.config.state_dir, "tasks", key), 1.0, supervisor_pid=0)

        def build() -> Launch:
            self.built.append("not empty" if os.listdir(state.home) else "empty")
            if task.driver_config.get("fail_build"):
                raise DriverError(f"task {task.name!r}: build refused")
            return Launch(path=task.driver_config["program"], argv=["prog"], env={}, cwd="/")

        return Start(state, build)

    def record_of(self, state: State) -> Record:
        return Record("started", 0, 0, state.started_at, True, self.config.cgroup_parent, state.key, state.home)

    def started(self, state: State, run: Spawned) -> State:
        return dataclasses.replace(
            state,
            supervisor_pid=run.supervisor.pid,
            supervisor_start_time=run.supervisor.start_time,
            task_pid=run.task.pid,
            task_start_time=run.task.start_time,
        )

    def task_config_schema(self) -> Spec:
        return hs.obj({"program": hs.attr("string"), "fail_build": hs.attr("bool")})

    def task_cgroup(self, state: State) -> None:
        return None

    def send_signal(self, state: State, sig: str, *, stopping: bool) -> bool:
        return False

    def kill_all(self, state: State) -> None:
        pass


@pytest.fixture
def alloc(tmp_path: Path) -> Any:
    a = AllocDir.create(tmp_path / "allocs", tasks=["web"])
    yield a
    a.close()


def _left(state_dir: Path) -> list[str]:
    tasks = state_dir / "tasks"
    return sorted(os.listdir(tasks)) if tasks.is_dir() else []


@pytest.mark.parametrize(
    "config",
    [{"fail_build": True}, {"program": "/no/such/program"}],
    ids=["build fails", "exec fails in the supervisor"],
)
def test_a_failed_start_leaves_no_record_dir_or_process(
    alloc: AllocDir, tmp_path: Path, config: dict[str, Any]
) -> None:
    driver = Tiny(str(tmp_path / "state"), "driversdk-test-tiny")
    task = alloc.task_config("web", driver_config=config)
    with pytest.raises(DriverError):
        driver.start_task(task)
    assert driver.built == ["empty"]  # the build ran in the fresh dir, after the record was written
    assert _left(tmp_path / "state") == []
    assert not driver.tasks.has(task.id)


def test_a_start_then_destroy_leaves_nothing_and_a_second_start_of_a_live_id_is_refused(
    alloc: AllocDir, tmp_path: Path
) -> None:
    driver = Tiny(str(tmp_path / "state"), "driversdk-test-tiny")
    task = alloc.task_config("web", driver_config={"program": sys.executable})
    handle = driver.start_task(task)
    key = "tiny-" + task.id.replace("/", "-")
    record = owner.load(str(tmp_path / "state" / "tasks" / f"{key}.json"), Record.decode)
    assert record is not None and record.phase == "started" and record.owner.pid == os.getpid()
    assert driver.wait_task(task.id) == ExitResult(exit_code=0)  # python with no input exits 0

    other = Tiny(str(tmp_path / "state"), "driversdk-test-tiny")  # a second plugin in this (live) process
    with pytest.raises(DriverError, match="already exists"):
        other.start_task(task)
    assert _left(tmp_path / "state") == [key, f"{key}.json"]  # the refused start took nothing away

    driver.destroy_task(task.id, force=False)
    assert _left(tmp_path / "state") == []
    assert isinstance(handle, TaskHandle)


def test_an_exec_record_and_handle_of_the_previous_layout_decode_and_keep_their_fields() -> None:
    # As the exec driver before the kit's record base wrote them (sorted keys, no runc_root yet).
    old_record = {
        "cgroup_parent": "driversdk-exec", "cgroup_v2": True, "container_id": "dsx-1", "owner_pid": 7,
        "owner_start_time": 9, "phase": "starting", "runc_path": "runc", "since": 1.5, "task_dir": "/s/tasks/dsx-1",
    }  # fmt: skip
    record = ExecRecord.decode(json.dumps(old_record).encode())
    assert (record.key, record.directory, record.runc_root, record.path) == (
        "dsx-1",
        "/s/tasks/dsx-1",
        "",
        "/s/tasks/dsx-1.json",
    )
    assert json.loads(record.encode()) == {**old_record, "runc_root": ""}

    old_state = {"version": 1, "container_id": "dsx-1", "task_dir": "/s/tasks/dsx-1", "supervisor_pid": 42,
                 "cgroup_v2": False, "started_at": 1.5, "runc_path": "runc"}  # fmt: skip
    state = DriverState.decode(json.dumps(old_state).encode(), 1)
    assert (state.cgroup_parent, state.host_pid_mode, state.supervisor_pid) == ("driversdk-exec", False, 42)
    with pytest.raises(ConfigError, match="exec driver's task state"):
        DriverState.decode(json.dumps({**old_state, "supervisor_pid": "42; rm"}).encode(), 1)
    with pytest.raises(ConfigError, match="task_dir"):
        DriverState.decode(json.dumps({k: v for k, v in old_state.items() if k != "task_dir"}).encode(), 1)


def test_runc_reports_a_command_killed_by_a_signal_as_128_plus_n() -> None:
    assert exit_result(137, signal_in_exit_code=True) == ExitResult(exit_code=137, signal=9)
    assert exit_result(137) == ExitResult(exit_code=137)
    assert exit_result(-9) == ExitResult(exit_code=137, signal=9)
