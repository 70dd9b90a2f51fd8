"""One owner of ``state.db`` (issue 28 item 5): a process holds the file open once for writing and
once for reading, whichever tables it uses (runs, jobs, tokens, CSI, volumes); records come back as
frozen dataclasses with enum states; files written by earlier versions open and read as before.

The descriptors are counted in ``/proc/<pid>/fd``: every SQLite connection keeps one descriptor
of the database file itself (its WAL and shm files have other names)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from driversdk.agent.acl import TokenStore
from driversdk.agent.allocrunner.allocrunner import NodeServices
from driversdk.agent.csi.state import StateStore
from driversdk.agent.csi.volumes import VolumeStore
from driversdk.agent.state.jobstore import JobStatus, JobStore
from driversdk.agent.state.runstate import AllocStatus, RunState, TaskStart, TaskStatus
from driversdk.agent.state.store import Store
from tests.agent.agentproc import AgentProcess, api_job, free_port, write_config

FIXTURES = Path(__file__).parent / "fixtures"
# tests/agent/fixtures/state-v8.db: every table written by the code before the one store (schema
# version 8, commit badc5ce), through its own stores; this is the secret of the token it bootstrapped.
V8_TOKEN = "4c5b9ff7-99db-418f-b89a-4ba20f82e049"
V8_ALLOC = "11111111-1111-1111-1111-111111111111"


def _opens_of(db: Path, pid: int | str = "self") -> int:
    """How many descriptors of process ``pid`` are open on the file ``db``."""
    target = os.path.realpath(db)
    fd_dir = f"/proc/{pid}/fd"
    count = 0
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(os.path.join(fd_dir, fd)) == target:
                count += 1
        except FileNotFoundError:
            continue  # closed meanwhile (the listing's own descriptor)
    return count


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir(mode=0o700)
    return path


def test_a_node_and_the_agents_tables_open_state_db_once_each_way(data_dir: Path) -> None:
    db = data_dir / "state.db"
    node = NodeServices.open(str(data_dir))
    jobs = JobStore(str(data_dir))  # by data dir, as the CLI builds one: the same owner
    tokens = TokenStore(node.state.store)
    try:
        tables = (node.state, node.volumes, node.csi_state, jobs, tokens)
        assert {id(t.store) for t in tables} == {id(node.state.store)}
        assert _opens_of(db) == 2  # one writer, one reader (was 7: two per runs and jobs, one per other table)
        store = node.state.store
        assert {id(t._lock) for t in tables} == {id(store.write_lock)}
        # Every table writes through the one writer and reads through the one reader.
        jobs.put("web", {"ID": "web", "Name": "web", "Type": "service"})
        node.state.alloc_started("a" * 36, "web", "g", 0, str(data_dir / "allocs" / ("a" * 36)))
        assert jobs.get("web") is not None and node.state.alloc_count() == 1
        assert tokens.bootstrap().type == "management"
        assert _opens_of(db) == 2
    finally:
        node.close()
        assert _opens_of(db) == 2  # jobs and tokens still hold the store
        jobs.close()
        tokens.close()
    assert _opens_of(db) == 0  # the last holder closed the file
    assert node.state.store.closed
    # A one-off table nobody closes lets go of the store when it is collected.
    listed = VolumeStore(str(db)).list()
    assert listed == [] and _opens_of(db) == 0


def test_the_agent_process_holds_state_db_open_once_each_way(agent_dir: Path) -> None:
    config = write_config(agent_dir, free_port(), acl=True)  # with ACLs: the tokens table too
    agent = AgentProcess(agent_dir / "data", config=config).start()
    try:
        assert agent.proc is not None
        client = agent.client()
        client.request("POST", "/v1/acl/bootstrap")
        client.request("PUT", "/v1/jobs", body={"Job": api_job("one", "service", "exec sleep 300")})
        agent.wait_allocs("one", "running")
        client.get("/v1/volumes", type="csi")
        # Runs, tasks, events, jobs, tokens and the CSI and volume tables are all in use by now.
        assert _opens_of(agent.data_dir / "state.db", agent.proc.pid) == 2, agent.log()
    finally:
        agent.close()


def test_a_task_record_round_trips_as_a_dataclass_with_enum_states(data_dir: Path) -> None:
    store = Store.open(str(data_dir))
    runs = RunState(store)
    store.close()  # the table holds it
    alloc = "b" * 36
    try:
        runs.alloc_started(alloc, "web", "g", 3, str(data_dir / "allocs" / alloc))
        start = TaskStart(alloc, "web", "g", "main", "exec", f"{alloc}/main/0", str(data_dir / "allocs" / alloc), 42, 1)
        runs.starting(start)
        [record] = runs.tasks(alloc)
        assert record.state is TaskStatus.STARTING and record.handle is None
        runs.started(start, b"the handle")
        [record] = runs.tasks(alloc)
        assert record.state is TaskStatus.RUNNING and record.state == "running"
        assert (record.alloc_id, record.job, record.group, record.task, record.driver, record.task_id) == (
            start.alloc_id, start.job, start.group, start.task, start.driver, start.task_id,
        )  # fmt: skip
        assert (record.alloc_dir, record.logmon_pid, record.restarts, record.handle) == (
            start.alloc_dir, 42, 1, b"the handle",
        )  # fmt: skip
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.state = TaskStatus.LOST  # type: ignore[misc]
        runs.finished(alloc, "main", 0, 0, False)
        assert runs.tasks(alloc)[0].state is TaskStatus.COMPLETE
        runs.alloc_update(alloc, state=AllocStatus.STOPPED)
        [(alloc_record, _)] = runs.allocs("web")
        assert alloc_record.state is AllocStatus.STOPPED and alloc_record.index == 3
        # A state the file never holds is refused before anything is written.
        with pytest.raises(ValueError, match="done"):
            runs.alloc_update(alloc, state="done")
        assert runs.alloc_by_id(alloc) is not None
        assert runs.alloc_by_id(alloc)[0].state is AllocStatus.STOPPED  # type: ignore[index]
    finally:
        runs.close()
    # On disk the states are the plain strings earlier versions wrote and read.
    raw = sqlite3.connect(data_dir / "state.db")
    try:
        assert raw.execute("SELECT state FROM run_tasks").fetchall() == [("complete",)]
        assert raw.execute("SELECT state FROM run_allocs").fetchall() == [("stopped",)]
    finally:
        raw.close()


def test_every_table_the_previous_code_wrote_reads_through_the_one_store(data_dir: Path) -> None:
    shutil.copy(FIXTURES / "state-v8.db", data_dir / "state.db")
    os.chmod(data_dir / "state.db", 0o600)
    store = Store.open(str(data_dir))
    runs, jobs, tokens = RunState(store), JobStore(store), TokenStore(store)
    volumes, csi = VolumeStore(store), StateStore(store)
    store.close()
    try:
        states = {r.task: r.state for r in runs.tasks(V8_ALLOC)}
        assert states == {s.value: s for s in TaskStatus}  # one task in each state, each an enum member
        assert all(type(s) is TaskStatus for s in states.values())
        assert {r.alloc_id[0]: r.state for r, _ in runs.allocs()} == {
            "1": AllocStatus.RUNNING, "2": AllocStatus.FAILED, "3": AllocStatus.STOPPED,
        }  # fmt: skip
        [running] = [r for r in runs.tasks(V8_ALLOC) if r.task == "running"]
        assert (running.handle, running.logmon_pid, running.task_id) == (
            b"handle-running",
            101,
            f"{V8_ALLOC}/running/0",
        )
        assert [e["Message"] for e in runs.task_events(V8_ALLOC, "failed")] == ["failed started"]
        [job] = jobs.all()
        assert (job.id, job.status, job.version) == ("web", JobStatus.RUNNING, 0)
        assert tokens.valid(V8_TOKEN) and not tokens.valid(V8_TOKEN[:-1] + "0")
        [volume] = volumes.list()
        assert volume.id == "vol0" and [c.alloc_id for c in volumes.claims("vol0")] == [V8_ALLOC]
        assert [u.phase for u in csi.usages("hostpath")] == ["mounted"]
        assert csi.staged("hostpath", "default", "vol0", "rw-fs")
        assert [p["id"] for p in csi.load_plugins()] == ["hostpath"]
        # and the tables write on as before
        runs.lost(V8_ALLOC, "running")
        assert {r.task: r.state for r in runs.tasks(V8_ALLOC)}["running"] is TaskStatus.LOST
    finally:
        for table in (runs, jobs, tokens, volumes, csi):
            table.close()
    assert _opens_of(data_dir / "state.db") == 0


def test_the_first_state_file_reads_with_enum_states(data_dir: Path) -> None:
    shutil.copy(FIXTURES / "state-v0.db", data_dir / "state.db")
    runs = RunState(str(data_dir))
    try:
        [record] = runs.tasks()
        assert record.state is TaskStatus.RUNNING
        [(alloc, _)] = runs.allocs()
        assert alloc.state is AllocStatus.RUNNING
    finally:
        runs.close()
