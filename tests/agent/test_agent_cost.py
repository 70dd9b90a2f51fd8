"""What a running task costs the agent in threads (issue 31): following a task's exit holds a
pending WaitTask call, not a thread, and its collector's reports are read by one poller for all.
A real agent runs a count = 20 exec job; its thread count (``/proc/<pid>/status``) is compared
with the count before, and the tasks' exits are still recorded once they are stopped."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.agent.agentproc import AgentProcess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="exec tasks need root")

COUNT = 20


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no Threads line for pid {pid}")


def sleep_job(name: str, count: int) -> str:
    return (
        f'job "{name}" {{\n  group "g" {{\n    count = {count}\n    task "t" {{\n      driver = "exec"\n'
        '      kill_timeout = "1s"\n      resources {\n        memory = 16\n      }\n'
        '      config {\n        command = "/bin/sleep"\n        args = ["600"]\n      }\n    }\n  }\n}\n'
    )


def register(agent: AgentProcess, hcl: str) -> None:
    client = agent.client()
    job = client.request("POST", "/v1/jobs/parse", body={"JobHCL": hcl})[0]
    client.request("PUT", "/v1/jobs", body={"Job": job})


def test_running_tasks_hold_no_thread_each_and_their_exits_are_still_recorded(agent: AgentProcess) -> None:
    assert agent.proc is not None
    register(agent, sleep_job("probe", 1))  # the exec plugin and the per-node services are up first
    agent.wait_allocs("probe", "running")
    idle = threads(agent.proc.pid)
    register(agent, sleep_job("sleepers", COUNT))
    allocs = agent.wait_allocs("sleepers", "running", timeout=180)
    assert len(allocs) == COUNT
    # Poststart hooks run just after a task is recorded running: the most seen over a moment counts.
    busy = max(threads(agent.proc.pid) for _ in range(20) if time.sleep(0.1) is None)
    # Before: a wait thread and a collector-report thread per task (2 * COUNT more).
    assert busy - idle < COUNT // 2, f"{busy - idle} more threads with {COUNT - 1} more running tasks"

    client = agent.client()
    client.request("DELETE", "/v1/job/sleepers")
    stopped = agent.wait_allocs("sleepers", "complete", timeout=180)
    for alloc in stopped:
        state = client.get(f"/v1/allocation/{alloc['ID']}")["TaskStates"]["t"]
        assert state["State"] == "dead" and not state["Failed"], state
        assert any(e["Type"] == "Killed" for e in state["Events"]), state["Events"]


def plugin_processes(agent_pid: int) -> list[str]:
    """The command lines of the agent's child processes that are driver plugins."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        line = " ".join(a.decode(errors="replace") for a in argv)
        if ppid == agent_pid and "drivers." in line:
            found.append(line)
    return found


def test_a_disabled_driver_keeps_no_plugin_process_and_still_refuses_its_jobs(agent: AgentProcess) -> None:
    assert agent.proc is not None
    node = agent.client().get("/v1/nodes")[0]
    drivers = agent.client().get(f"/v1/node/{node['ID']}")["Drivers"]
    assert drivers["raw_exec"]["Healthy"] is False and drivers["exec"]["Healthy"] is True
    plugins = plugin_processes(agent.proc.pid)
    # Before: docker, exec and raw_exec plugins, raw_exec holding ~45 MiB for no task.
    assert not any("raw_exec" in line for line in plugins), plugins
    assert any("drivers.exec" in line for line in plugins), plugins
    hcl = (
        'job "raw" {\n  group "g" {\n    task "t" {\n      driver = "raw_exec"\n'
        '      config {\n        command = "/bin/true"\n      }\n    }\n  }\n}\n'
    )
    client = agent.client()
    job = client.request("POST", "/v1/jobs/parse", body={"JobHCL": hcl})[0]
    client.request("PUT", "/v1/jobs", body={"Job": job})
    failed = agent.wait_allocs("raw", "failed")[0]
    sentences = [e["DisplayMessage"] for e in failed["TaskStates"]["t"]["Events"]]
    assert any("the raw_exec driver is disabled on this client" in s for s in sentences), sentences
    agent.stop_jobs()
    assert not any("raw_exec" in line for line in plugin_processes(agent.proc.pid))


def test_no_log_line_is_lost_while_the_agent_is_killed_and_comes_back(agent_dir: Path) -> None:
    """The data dir's one log collector outlives a kill -9 of the agent and serves the task on; the
    next agent adopts it (no second collector), and every line the task wrote is in its log."""
    lines = 3000
    script = f"i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo line-$i; sleep 0.001; done"
    hcl = (
        'job "talker" {\n  type = "batch"\n  group "g" {\n    task "t" {\n      driver = "exec"\n'
        f'      config {{\n        command = "/bin/sh"\n        args = ["-c", "{script}"]\n      }}\n'
        "    }\n  }\n}\n"
    )
    first = AgentProcess(agent_dir / "data").start()
    second = AgentProcess(agent_dir / "data")
    try:
        register(first, hcl)
        [alloc] = first.wait_allocs("talker", "running")
        first.kill9()
        time.sleep(1.0)  # the task writes on with no agent
        second.start()
        collectors = [p for p in _collector_pids(agent_dir / "data")]
        assert len(collectors) == 1, collectors
        [done] = second.wait_allocs("talker", "complete", "failed", timeout=180)
        assert done["ID"] == alloc["ID"] and done["ClientStatus"] == "complete", done
        stream = second.client().stream(f"/v1/client/fs/logs/{alloc['ID']}", task="t", type="stdout", plain="true")
        text = b"".join(stream).decode()
    finally:
        second.close()
        first.close()
    written = [f"line-{i}" for i in range(1, lines + 1)]
    assert text.split() == written


def _collector_pids(data: Path) -> list[int]:
    socket_path = str(data / "logmon.sock")
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--serve" in argv and socket_path.encode() in argv:
            found.append(int(name))
    return found
