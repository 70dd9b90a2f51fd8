"""The agent's recovery and faults, with real components: a ``kill -9`` of the agent under a docker
task, an exec task and a mounted CSI volume (the reference hostpath plugin as a csi_plugin task)
is recovered by the next agent on the data dir with nothing duplicated; a job stopped while the
agent was down is stopped when it comes back; a SIGTERM leaves the tasks and takes the plugins; a
full data dir refuses a registration with a sentence and corrupts nothing; an update replaces
allocations, an unchanged re-register keeps them. Every test ends with nothing of it left."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from drivers.docker.container import LABEL_TASK_ID
from driversdk.agent.state.jobstore import JobStore
from driversdk.cli.apiclient import AgentClient, APIRequestError
from driversdk.mountinfo import read_mountinfo
from tests.agent.agentproc import AgentProcess
from tests.agent.csienv import Env, demo, plugin_group
from tests.agent.runs import IMAGE
from tests.hostcheck import labelled_containers, processes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="exec tasks, CSI mounts and tmpfs need root")


class Host(Env):
    """What a test sees of the host under its own directory ``work``: the CSI env's data dir, client
    config, claims and volume registration, and the containers, mounts and processes of an agent."""

    def agent(self) -> AgentProcess:
        return AgentProcess(self.data, config=self.client)

    def container_states(self) -> list[dict[str, Any]]:
        return [c for c in labelled_containers(self.engine, LABEL_TASK_ID)
                if any(str(self.work) in b for b in c["HostConfig"].get("Binds") or [])]  # fmt: skip

    def running_containers(self) -> list[str]:
        return sorted(c["Id"] for c in self.container_states() if c["State"]["Running"])

    def mounts(self) -> list[str]:
        return [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(self.work))]

    def pids(self, needle: str) -> list[int]:
        return [int(line.split(":", 1)[0]) for line in processes(needle)]

    def exec_pid(self) -> int:
        """The exec task's process (runc starts it a moment after StartTask answers)."""
        deadline = time.monotonic() + 30
        while not (found := self.pids(f"sleep {SLEEP_EXEC}")) and time.monotonic() < deadline:
            time.sleep(0.05)
        [pid] = found
        return pid

    def leftovers(self) -> list[str]:
        """Everything of the test still on the host (empty when clean)."""
        left = [f"container {c['Name']}" for c in self.container_states()]
        left += [f"mount {m}" for m in self.mounts()]
        left += [f"process {p}" for p in processes(str(self.work))]
        left += [f"process {p}" for p in processes(f"sleep {SLEEP_EXEC}")]
        return left

    def clean_up(self) -> None:
        """The last resort of a failed test: remove what it left (the assertions said what)."""
        for c in self.container_states():
            with contextlib.suppress(docker.errors.APIError):
                self.engine.api.remove_container(c["Id"], force=True)
        for needle in (str(self.work), f"sleep {SLEEP_EXEC}"):
            for pid in self.pids(needle):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        for mount in sorted(self.mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


SLEEP_EXEC = 3171  # an exec task's sleep, found by its command line


@pytest.fixture
def host(agent_dir: Path) -> Iterator[Host]:
    engine = docker.from_env()
    (agent_dir / "backing" / "volumes").mkdir(parents=True)
    demo.client_config(agent_dir, docker_extra='infra_image = "driversdk-test/pause:local"',
                       exec_extra=f'state_dir = "{agent_dir / "exec-state"}"\n{demo.ROOT_TASKS}')  # fmt: skip
    h = Host(agent_dir, engine)
    try:
        yield h
    finally:
        h.clean_up()
        engine.close()


@contextlib.contextmanager
def running(host: Host, *agents: AgentProcess) -> Iterator[None]:
    """Whatever the test does, every agent it started is gone after (jobs stopped by the last
    one that answers) and nothing is left on the host."""
    try:
        yield
    finally:
        for proc in agents:
            with contextlib.suppress(Exception):
                proc.close()


def _parse(client: AgentClient, hcl: str) -> dict[str, Any]:
    job: dict[str, Any] = client.request("POST", "/v1/jobs/parse", body={"JobHCL": hcl})[0]
    return job


def _register(client: AgentClient, hcl: str) -> dict[str, Any]:
    job = _parse(client, hcl)
    client.request("PUT", "/v1/jobs", body={"Job": job})
    return job


DOCKER_SERVICE = f"""
job "web" {{
  type = "service"
  group "g" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    task "t" {{
      driver       = "docker"
      kill_timeout = "1s"
      config {{
        image   = "{IMAGE}"
        command = "/bin/sh"
        args    = ["-c", "echo up; exec sleep 3172"]
      }}
    }}
  }}
}}
"""

EXEC_SERVICE = f"""
job "ex" {{
  type = "service"
  group "g" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    task "t" {{
      driver       = "exec"
      kill_timeout = "1s"
      config {{
        command = "/bin/sleep"
        args    = ["{SLEEP_EXEC}"]
      }}
    }}
  }}
}}
"""


def _storage_job() -> str:
    return f"""
job "storage" {{
  type = "service"
  {plugin_group()}
  group "app" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    volume "data" {{
      type            = "csi"
      source          = "vol"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }}
    task "app" {{
      driver       = "docker"
      kill_timeout = "1s"
      config {{
        image   = "{IMAGE}"
        command = "/bin/sh"
        args    = ["-c", "echo kept > /data/greeting; exec sleep 3173"]
      }}
      volume_mount {{
        volume           = "data"
        destination      = "/data"
        propagation_mode = "host-to-task"
      }}
    }}
  }}
}}
"""


def _events(client: AgentClient, alloc_id: str) -> dict[str, list[str]]:
    alloc = client.get(f"/v1/allocation/{alloc_id}")
    return {task: [e["Type"] for e in state["Events"]] for task, state in alloc["TaskStates"].items()}


def _recovered(client: AgentClient, alloc_id: str, timeout: float = 60) -> None:
    """Until every task of the allocation has its "recovered" event (the allocation's records say
    running from before the restart, before the new agent has taken each task back)."""
    deadline = time.monotonic() + timeout
    while True:
        events = _events(client, alloc_id)
        if all("recovered" in types for types in events.values()):
            return
        assert time.monotonic() < deadline, f"not recovered: {events}"
        time.sleep(0.1)


def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _csi_mounts(host: Host) -> list[str]:
    return [m for m in host.mounts() if "per-alloc" in m]


def test_kill9_recovers_docker_exec_and_csi_tasks_without_duplicates(host: Host) -> None:
    host.register()
    first, second = host.agent(), host.agent()
    with running(host, first, second):
        first.start()
        client = first.client()
        for hcl in (DOCKER_SERVICE, EXEC_SERVICE, _storage_job()):
            _register(client, hcl)
        allocs = {job: first.wait_allocs(job, "running") for job in ("web", "ex", "storage")}
        containers = host.running_containers()
        assert len(containers) == 2, containers  # web's task and storage's app
        exec_pid = host.exec_pid()
        mounts = _csi_mounts(host)
        assert len(mounts) == 1, host.mounts()
        claims = host.claims()
        assert len(claims) == 1

        first.kill9()
        assert host.running_containers() == containers and host.pids(f"sleep {SLEEP_EXEC}") == [exec_pid]

        second.start()
        client = second.client()
        again = {job: second.wait_allocs(job, "running") for job in ("web", "ex", "storage")}
        assert {j: sorted(a["ID"] for a in v) for j, v in again.items()} == {
            j: sorted(a["ID"] for a in v) for j, v in allocs.items()
        }, "the same allocations, recovered"
        for job in ("web", "ex", "storage"):
            for alloc in again[job]:
                _recovered(client, alloc["ID"])
        time.sleep(2)  # anything duplicated (a second start) would be running by now
        assert host.running_containers() == containers, "the same containers, none added"
        assert host.pids(f"sleep {SLEEP_EXEC}") == [exec_pid], "the same exec process, none added"
        assert _csi_mounts(host) == mounts, "the volume is mounted once, as before"
        assert host.claims() == claims
        greeting = host.work / "backing" / "volumes" / "vol" / "greeting"
        assert greeting.read_text() == "kept\n"

        second.stop_jobs()
        assert host.running_containers() == [] and host.pids(f"sleep {SLEEP_EXEC}") == []
        assert _csi_mounts(host) == [] and host.claims() == []
    assert host.leftovers() == []


def test_job_stopped_while_the_agent_is_down_is_stopped_when_it_returns(host: Host) -> None:
    first, second = host.agent(), host.agent()
    with running(host, first, second):
        first.start()
        _register(first.client(), EXEC_SERVICE)
        _register(first.client(), DOCKER_SERVICE)
        [alloc] = first.wait_allocs("ex", "running")
        first.wait_allocs("web", "running")
        first.kill9()
        store = JobStore(str(host.data))
        try:
            store.mark_stopped("ex")
        finally:
            store.close()
        second.start()
        [ended] = second.wait_allocs("ex", "complete", "failed")
        assert ended["ID"] == alloc["ID"] and ended["ClientStatus"] == "complete", ended
        job = second.client().get("/v1/job/ex")
        assert job["Stop"] is True and job["Status"] == "dead"
        assert host.pids(f"sleep {SLEEP_EXEC}") == []
        second.wait_allocs("web", "running")  # the other job is recovered, not stopped
        assert len(host.running_containers()) == 1
    assert host.leftovers() == []


def _plugins(pid: int) -> set[int]:
    """The live driver plugins of agent ``pid``: its children but the tasks' log collectors (which
    outlive the agent on purpose, as the tasks do, and are adopted by the next one)."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid and b"logmon/collector.py" not in cmdline:
            found.add(int(entry))
    return found


def _alive(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def test_sigterm_leaves_the_tasks_and_takes_the_plugins(host: Host) -> None:
    first, second = host.agent(), host.agent()
    with running(host, first, second):
        first.start()
        _register(first.client(), DOCKER_SERVICE)
        _register(first.client(), EXEC_SERVICE)
        first.wait_allocs("web", "running")
        first.wait_allocs("ex", "running")
        assert first.proc is not None
        plugins = _plugins(first.proc.pid)
        assert len(plugins) >= 2, "the agent runs its plugins (docker, exec, ...)"
        containers = host.running_containers()
        exec_pid = host.exec_pid()
        assert first.stop() == 0
        assert _alive(plugins) == set(), "no plugin of the agent is left"
        assert host.running_containers() == containers and host.pids(f"sleep {SLEEP_EXEC}") == [exec_pid]
        second.start()
        for job in ("web", "ex"):
            [alloc] = second.wait_allocs(job, "running")
            _recovered(second.client(), alloc["ID"])
            # The plugins' end was not recorded as the task's: nothing says it was lost or failed.
            state = second.client().get(f"/v1/allocation/{alloc['ID']}")["TaskStates"]["t"]
            assert state["Failed"] is False and state["State"] == "running", state
        assert host.running_containers() == containers and host.pids(f"sleep {SLEEP_EXEC}") == [exec_pid]
    assert host.leftovers() == []


def test_update_replaces_the_allocations_and_an_unchanged_job_keeps_them(host: Host) -> None:
    agent = host.agent()
    with running(host, agent):
        agent.start()
        client = agent.client()
        _register(client, DOCKER_SERVICE)
        [alloc] = agent.wait_allocs("web", "running")
        [container] = host.running_containers()
        _register(client, DOCKER_SERVICE)
        time.sleep(1)  # a restart (the thing refused here) would have begun
        assert [a["ID"] for a in agent.wait_allocs("web", "running")] == [alloc["ID"]]
        assert host.running_containers() == [container]
        assert client.get("/v1/job/web")["Version"] == 0

        _register(client, DOCKER_SERVICE.replace("sleep 3172", "sleep 3174"))
        deadline = time.monotonic() + 90
        allocs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            allocs = client.get("/v1/job/web/allocations")
            old = [a for a in allocs if a["ID"] == alloc["ID"]]
            new = [a for a in allocs if a["ID"] != alloc["ID"]]
            if old and old[0]["ClientStatus"] == "complete" and new and new[0]["ClientStatus"] == "running":
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the update did not replace the allocation: {allocs}\n{agent.log()}")
        assert len(new) == 1
        [now] = host.running_containers()
        assert now != container
        assert "sleep 3174" in " ".join(host.engine.api.inspect_container(now)["Config"]["Cmd"])
        assert client.get("/v1/job/web")["Version"] == 1
    assert host.leftovers() == []


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[None]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path: Path) -> Path:
    """A file taking every byte left on the file system of ``path``."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def test_full_data_dir_refuses_a_registration_with_a_sentence_and_keeps_serving(host: Host) -> None:
    agent = host.agent()
    with _tmpfs(host.data, "24m"), running(host, agent):
        agent.start()
        client = agent.client()
        _register(client, DOCKER_SERVICE)
        [alloc] = agent.wait_allocs("web", "running")
        [container] = host.running_containers()
        jobs_before = client.get("/v1/jobs")
        ex = _parse(client, EXEC_SERVICE)
        filler = _fill(host.data)
        try:
            with pytest.raises(APIRequestError) as err:
                client.request("PUT", "/v1/jobs", body={"Job": ex})
            message = str(err.value)
            assert err.value.status == 500, message
            assert "\n" not in message and "Traceback" not in message
            assert str(host.data / "state.db") in message and "full" in message, message
            assert 'job "ex"' in message, message
            # Reads are served; nothing stopped because one registration could not be written.
            assert client.get("/v1/jobs") == jobs_before
            assert client.get(f"/v1/allocation/{alloc['ID']}")["ClientStatus"] == "running"
            assert host.running_containers() == [container]
        finally:
            filler.unlink()
        assert client.get("/v1/jobs") == jobs_before, "nothing half-registered"
        db = sqlite3.connect(str(host.data / "state.db"))
        try:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        finally:
            db.close()
        client.request("PUT", "/v1/jobs", body={"Job": ex})
        agent.wait_allocs("ex", "running")
        assert host.running_containers() == [container]
        agent.stop_jobs()
        agent.stop()
    assert host.leftovers() == []


DOCKER_BATCH = f"""
job "once" {{
  type = "batch"
  group "g" {{
    task "t" {{
      driver = "docker"
      config {{
        image   = "{IMAGE}"
        command = "/bin/sh"
        args    = ["-c", "echo ran"]
      }}
    }}
  }}
}}
"""


def test_recovered_job_whose_allocations_ended_is_dead_and_not_run_again(host: Host) -> None:
    """An agent killed between a batch allocation's end and the job's status (both recorded, one
    after the other) leaves a job that says running with nothing running: the next agent marks it
    dead and does not run the batch job a second time."""
    first, second = host.agent(), host.agent()
    with running(host, first, second):
        first.start()
        _register(first.client(), DOCKER_BATCH)
        [alloc] = first.wait_allocs("once", "complete", "failed")
        assert alloc["ClientStatus"] == "complete"
        assert first.stop() == 0
        # The state a kill -9 between the two writes leaves (the window is too short to hit).
        db = sqlite3.connect(str(host.data / "state.db"))
        try:
            with db:
                db.execute("UPDATE agent_jobs SET status='running' WHERE id='once'")
        finally:
            db.close()
        second.start()
        client = second.client()
        deadline = time.monotonic() + 60
        while client.get("/v1/job/once")["Status"] != "dead" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.get("/v1/job/once")["Status"] == "dead", second.log()
        time.sleep(1)  # a second run (the thing refused here) would have been recorded by now
        assert [a["ID"] for a in client.get("/v1/job/once/allocations")] == [alloc["ID"]]
        _until(lambda: host.container_states() == [], "the ended task's container is removed")
    assert host.leftovers() == []


PAIR = f"""
job "pair" {{
  type = "service"
  group "g" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    task "bad" {{
      driver       = "docker"
      kill_timeout = "1s"
      config {{
        image   = "{IMAGE}"
        command = "/bin/sh"
        args    = ["-c", "sleep 1; exit 3"]
      }}
    }}
    task "good" {{
      driver       = "docker"
      kill_timeout = "1s"
      config {{
        image   = "{IMAGE}"
        command = "/bin/sh"
        args    = ["-c", "exec sleep 3176"]
      }}
    }}
  }}
}}
"""


def test_a_task_whose_end_cannot_be_recorded_fails_its_job_and_not_the_agent(host: Host) -> None:
    """A full data dir when a task exits: its end cannot be written, that job fails with the
    sentence, and the agent goes on (the other job runs on, a later job runs once space is back)."""
    agent = host.agent()
    with _tmpfs(host.data, "24m"), running(host, agent):
        agent.start()
        client = agent.client()
        _register(client, DOCKER_SERVICE)
        _register(client, DOCKER_SERVICE.replace('job "web"', 'job "other"').replace("3172", "3175"))
        [web] = agent.wait_allocs("web", "running")
        agent.wait_allocs("other", "running")
        by_cmd = {" ".join(c["Config"]["Cmd"]): c["Id"] for c in host.container_states()}
        [web_container] = [cid for cmd, cid in by_cmd.items() if "3172" in cmd]
        [other_container] = [cid for cmd, cid in by_cmd.items() if "3175" in cmd]
        filler = _fill(host.data)
        try:
            host.engine.api.kill(other_container)
            deadline = time.monotonic() + 60
            while 'cannot record the exit of task "t" of job "other"' not in agent.log():
                assert time.monotonic() < deadline, agent.log()
                time.sleep(0.2)
            time.sleep(1)  # what a node-wide stop would do has begun by now
            assert host.running_containers() == [web_container], "the other job runs on"
        finally:
            filler.unlink()
        assert client.get(f"/v1/allocation/{web['ID']}")["ClientStatus"] == "running"
        # The agent goes on as before (nothing node-wide was set off): a later job runs, and a
        # task of it that fails stops its sibling, as Nomad's alloc runner does.
        _register(client, PAIR)
        [pair] = agent.wait_allocs("pair", "failed", timeout=60)
        states = client.get(f"/v1/allocation/{pair['ID']}")["TaskStates"]
        assert states["bad"]["Failed"] is True and states["good"]["State"] == "dead", states
        assert "Sibling Task Failed" in [e["Type"] for e in states["good"]["Events"]], states["good"]["Events"]
        assert host.running_containers() == [web_container]
        agent.stop_jobs()
        agent.stop()
    assert host.leftovers() == []


def test_task_that_ends_while_the_agent_is_down_ends_its_job_on_return(host: Host) -> None:
    """A batch task that finishes while no agent follows it: the next agent recovers it, records
    its exit (complete), marks the job dead and starts nothing again."""
    first, second = host.agent(), host.agent()
    with running(host, first, second):
        first.start()
        _register(first.client(), DOCKER_BATCH.replace('"echo ran"', '"sleep 2; echo ran"'))
        [alloc] = first.wait_allocs("once", "running")
        [container] = host.running_containers()
        first.kill9()
        assert host.engine.api.wait(container, timeout=60)["StatusCode"] == 0
        second.start()
        [ended] = second.wait_allocs("once", "complete", "failed")
        assert ended["ID"] == alloc["ID"] and ended["ClientStatus"] == "complete", ended
        client = second.client()
        deadline = time.monotonic() + 60
        while client.get("/v1/job/once")["Status"] != "dead" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.get("/v1/job/once")["Status"] == "dead"
        assert [a["ID"] for a in client.get("/v1/job/once/allocations")] == [alloc["ID"]]
        _until(lambda: host.container_states() == [], "the ended task's container is removed")
    assert host.leftovers() == []
