"""Nomad's everyday verbs as the CLI's commands against a real agent: `job status`, `job stop`,
`alloc status` (every event, the reason a start failed, the exit code), `alloc logs` (-stderr,
-n, -f), `node status`, `acl bootstrap`; each run as an operator runs it (a subprocess finding
the agent through NOMAD_ADDR), with --json that parses, exit 1 and one sentence when the agent
or the thing asked for is not there, and a stop given while the agent is down that the agent
carries out when it starts again, leaving nothing running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest

from drivers.docker.labels import LABEL_ALLOC_ID
from tests.agent.agentproc import ROOT, AgentProcess, free_port
from tests.hostcheck import labelled_containers

BUSYBOX = "driversdk-test/busybox:local"


def _job(job_id: str, job_type: str, script: str, image: str = BUSYBOX) -> dict[str, Any]:
    """A one-task docker job; a task that ends is not restarted (its first exit is the answer)."""
    return {
        "ID": job_id,
        "Name": job_id,
        "Type": job_type,
        "TaskGroups": [
            {
                "Name": "g",
                "Count": 1,
                "RestartPolicy": {"Attempts": 0, "Mode": "fail", "Delay": 0, "Interval": 60_000_000_000},
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "docker",
                        "Config": {"image": image, "command": "sh", "args": ["-c", script]},
                        "Resources": {"CPU": 100, "MemoryMB": 64},
                    }
                ],
            }
        ],
    }


def cli(address: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOMAD_ADDR", "NOMAD_TOKEN")}
    env["NOMAD_ADDR"] = address
    if token is not None:
        env["NOMAD_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "driversdk.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=180)  # fmt: skip


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done.stdout


def _refused(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The command failed with ``code`` and one sentence, never a traceback."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    if code == 1:
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def _register(agent: AgentProcess, job: dict[str, Any]) -> None:
    agent.client().request("PUT", "/v1/jobs", body={"Job": job})


def _field(text: str, name: str) -> str:
    match = re.search(rf"^{re.escape(name)} +=  ?(.*)$", text, re.M)
    assert match, (name, text)
    return match.group(1).strip()


def test_job_and_alloc_status_show_tasks_events_and_exit_codes(agent: AgentProcess) -> None:
    _register(agent, _job("hello", "batch", "echo hi"))
    _register(agent, _job("exits", "batch", "echo no >&2; exit 3"))
    _register(agent, _job("svc", "service", "echo up; exec sleep 300"))
    [hello] = agent.wait_allocs("hello", "complete", "failed")
    [exits] = agent.wait_allocs("exits", "complete", "failed")
    agent.wait_allocs("svc", "running")

    listing = _ok(cli(agent.address, "job", "status"))
    assert re.search(r"^ID +Type +Priority +Status +Submit Date$", listing, re.M), listing
    assert re.search(r"^hello +batch +50 +dead ", listing, re.M), listing
    assert re.search(r"^svc +service +50 +running ", listing, re.M), listing
    listed = json.loads(_ok(cli(agent.address, "job", "status", "--json")))
    assert [j["ID"] for j in listed] == ["exits", "hello", "svc"]

    one = _ok(cli(agent.address, "job", "status", "hello"))
    assert _field(one, "Type") == "batch" and _field(one, "Status") == "dead"
    assert re.search(rf"^{hello['ID'][:8]} +\S+ +g +0 +\S+ +complete +\d+s ago +\d+s ago$", one, re.M), one
    [status] = json.loads(_ok(cli(agent.address, "job", "status", "-json", "hello")))
    assert status["Job"]["ID"] == "hello" and [a["ID"] for a in status["Allocations"]] == [hello["ID"]]
    assert status["Summary"]["Summary"]["g"]["Complete"] == 1

    shown = _ok(cli(agent.address, "alloc", "status", hello["ID"][:8]))
    assert _field(shown, "ID") == hello["ID"][:8] and _field(shown, "Client Status") == "complete"
    assert _field(shown, "Job ID") == "hello" and 'Task "t" is "dead"' in shown
    assert re.search(r"  Started +Task started by client$", shown, re.M), shown
    assert re.search(r"  Terminated +Exit Code: 0$", shown, re.M), shown
    events = [line.split()[1] for line in shown.split("Events:\n", 1)[1].splitlines()[1:]]
    assert events.index("Started") < events.index("Terminated")  # newest last

    failed = _ok(cli(agent.address, "alloc", "status", exits["ID"]))
    assert _field(failed, "Client Status") == "failed" and 'Task "t" is "dead" (failed)' in failed
    assert re.search(r"  Terminated +Exit Code: 3$", failed, re.M), failed
    full = json.loads(_ok(cli(agent.address, "alloc", "status", "--json", exits["ID"][:8])))
    assert full["ID"] == exits["ID"] and full["TaskStates"]["t"]["Failed"] is True


def test_a_start_that_fails_shows_its_reason(agent: AgentProcess) -> None:
    _register(agent, _job("missing", "batch", "true", image="driversdk-test/does-not-exist:local"))
    [alloc] = agent.wait_allocs("missing", "complete", "failed")
    shown = _ok(cli(agent.address, "alloc", "status", alloc["ID"][:8]))
    assert _field(shown, "Client Status") == "failed"
    failure = re.search(r"^\S+ +Driver Failure +(.*)$", shown, re.M)
    assert failure and "driversdk-test/does-not-exist:local" in failure.group(1), shown
    assert docker.from_env().api.containers(all=True, filters={"label": f"{LABEL_ALLOC_ID}={alloc['ID']}"}) == []


def test_alloc_logs_stdout_stderr_tail_and_follow(agent: AgentProcess) -> None:
    _register(agent, _job("talk", "batch", "echo one; echo two; echo three; echo oops >&2"))
    [alloc] = agent.wait_allocs("talk", "complete", "failed")
    short = alloc["ID"][:8]
    assert _ok(cli(agent.address, "alloc", "logs", short)) == "one\ntwo\nthree\n"
    assert _ok(cli(agent.address, "alloc", "logs", "-stderr", short, "t")) == "oops\n"
    assert _ok(cli(agent.address, "alloc", "logs", "-n", "1", short)) == "three\n"
    assert _ok(cli(agent.address, "alloc", "logs", "-n", "2", short, "t")) == "two\nthree\n"
    assert _ok(cli(agent.address, "alloc", "logs", "-n", "9", short)) == "one\ntwo\nthree\n"
    frames = [json.loads(line) for line in _ok(cli(agent.address, "alloc", "logs", "--json", short)).splitlines()]
    assert frames and all(f["File"] == "alloc/logs/t.stdout" for f in frames)
    assert "not in allocation" in _refused(cli(agent.address, "alloc", "logs", short, "nope"))

    # Followed while the task runs: everything it writes, and the command ends when the task does.
    _register(agent, _job("slow", "batch", "echo a; sleep 3; echo b"))
    [running] = agent.wait_allocs("slow", "running")
    assert _ok(cli(agent.address, "alloc", "logs", "-f", running["ID"])) == "a\nb\n"
    assert agent.wait_allocs("slow", "complete", "failed")[0]["ClientStatus"] == "complete"

    # -f -n 1: the last line written so far, then what follows.
    _register(agent, _job("slow2", "batch", "echo x; echo y; sleep 4; echo z"))
    [running] = agent.wait_allocs("slow2", "running")
    while b"y\n" not in b"".join(agent.client().stream(f"/v1/client/fs/logs/{running['ID']}", task="t",
                                                        type="stdout", plain="true")):  # fmt: skip
        assert agent.wait_allocs("slow2", "running")
    assert _ok(cli(agent.address, "alloc", "logs", "-f", "-n", "1", running["ID"])) == "y\nz\n"


def test_job_stop_is_a_stop_and_purge_forgets_the_job(agent: AgentProcess) -> None:
    _register(agent, _job("svc", "service", "echo up; exec sleep 300"))
    [alloc] = agent.wait_allocs("svc", "running")
    stopped = _ok(cli(agent.address, "job", "stop", "svc"))
    assert 'Job "svc" stopped' in stopped and f'Allocation "{alloc["ID"][:8]}" (group "g"): complete' in stopped
    shown = _ok(cli(agent.address, "alloc", "status", alloc["ID"]))
    assert _field(shown, "Client Status") == "complete" and _field(shown, "Desired Status") == "stop"
    assert "(failed)" not in shown
    types = {line.split()[1] for line in shown.split("Events:\n", 1)[1].splitlines()[1:]}
    assert {"Killing", "Killed"} <= types, shown
    assert _field(_ok(cli(agent.address, "job", "status", "svc")), "Status") == "dead"
    engine = docker.from_env()
    assert engine.api.containers(filters={"label": f"{LABEL_ALLOC_ID}={alloc['ID']}"}) == []

    purged = _ok(cli(agent.address, "job", "stop", "-purge", "svc"))
    assert 'Job "svc" stopped and purged' in purged
    assert 'job "svc" not found' in _refused(cli(agent.address, "job", "status", "svc"))
    assert agent.client().get("/v1/jobs") == []

    _register(agent, _job("quick", "service", "exec sleep 300"))
    agent.wait_allocs("quick", "running")
    answer = json.loads(_ok(cli(agent.address, "job", "stop", "-detach", "-json", "quick")))
    assert answer["EvalID"]
    assert agent.wait_allocs("quick", "complete", "failed")[0]["ClientStatus"] == "complete"


def test_node_status_lists_the_drivers_and_their_health(agent: AgentProcess) -> None:
    shown = _ok(cli(agent.address, "node", "status"))
    assert _field(shown, "Status") == "ready"
    assert re.search(r"^docker +true +true +Healthy$", shown, re.M), shown
    assert re.search(r"^exec +true +true +Healthy$", shown, re.M), shown
    assert "driver.docker " not in shown
    verbose = _ok(cli(agent.address, "node", "status", "-verbose"))
    assert _field(verbose, "driver.docker") == "true" and _field(verbose, "kernel.name") == "linux"
    [node] = json.loads(_ok(cli(agent.address, "node", "status", "--json")))
    assert node["Drivers"]["docker"]["Healthy"] is True and node["Drivers"]["exec"]["Healthy"] is True
    one = json.loads(_ok(cli(agent.address, "node", "status", "-json", node["ID"][:8])))
    assert one["ID"] == node["ID"] and one["Attributes"]["driver.exec"] == "true"
    assert "not found" in _refused(cli(agent.address, "node", "status", "ffffffff-nope"))


def test_unknown_things_and_bad_command_lines(agent: AgentProcess) -> None:
    assert 'job "nope" not found' in _refused(cli(agent.address, "job", "status", "nope"))
    assert 'job "nope" not found' in _refused(cli(agent.address, "job", "stop", "nope"))
    assert 'allocation "abcdef12" not found' in _refused(cli(agent.address, "alloc", "status", "abcdef12"))
    assert 'allocation "abcdef12" not found' in _refused(cli(agent.address, "alloc", "logs", "abcdef12"))
    assert "ACLs disabled" in _refused(cli(agent.address, "acl", "bootstrap"))
    _refused(cli(agent.address, "job", "stop"), code=2)
    _refused(cli(agent.address, "alloc", "logs", "-n", "-3", "abcdef12"), code=2)
    _refused(cli(agent.address, "alloc", "logs", "-json", "-n", "3", "abcdef12"), code=2)
    assert agent.client().get("/v1/jobs") == []


@pytest.mark.parametrize("address", ["unix:///nonexistent/agent.sock", "http://127.0.0.1:{port}"])
def test_agent_unreachable_is_one_sentence(address: str) -> None:
    address = address.format(port=free_port())
    for args in (("job", "status"), ("job", "stop", "web"), ("alloc", "status", "abc"), ("node", "status"),
                 ("alloc", "logs", "abc"), ("acl", "bootstrap")):  # fmt: skip
        stderr = _refused(cli(address, *args))
        assert f"cannot reach the driversdk agent at {address}" in stderr, stderr


def test_acl_bootstrap_prints_the_token_once(agent_dir: Path) -> None:
    port = free_port()
    data = agent_dir / "data"
    config = agent_dir / "agent.hcl"
    config.write_text(f'data_dir = "{data}"\nbind_addr = "127.0.0.1"\nports {{\n  http = {port}\n}}\n'
                      "acl {\n  enabled = true\n}\n")  # fmt: skip
    process = AgentProcess(data, config=config).start()
    try:
        address = f"http://127.0.0.1:{port}"
        assert "Permission denied" in _refused(cli(address, "job", "status"))
        shown = _ok(cli(address, "acl", "bootstrap"))
        accessor, secret = _field(shown, "Accessor ID"), _field(shown, "Secret ID")
        assert re.fullmatch(r"[0-9a-f-]{36}", accessor) and re.fullmatch(r"[0-9a-f-]{36}", secret)
        assert _field(shown, "Type") == "management"
        assert "bootstrapped already" in _refused(cli(address, "acl", "bootstrap"))
        assert _ok(cli(address, "job", "status", token=secret)) == "No running jobs\n"
        assert _ok(cli(address, "job", "status", "-token", secret)) == "No running jobs\n"
        assert "Permission denied" in _refused(cli(address, "node", "status", "-token", accessor))
    finally:
        process.stop()


def test_stop_while_the_agent_is_down_is_carried_out_when_it_starts(agent_dir: Path) -> None:
    data = agent_dir / "data"
    first, second = AgentProcess(data), AgentProcess(data)
    engine = docker.from_env()
    try:
        first.start()
        _register(first, _job("web", "service", "echo up; exec sleep 300"))
        _register(first, _job("other", "service", "exec sleep 300"))
        [alloc] = first.wait_allocs("web", "running")
        first.wait_allocs("other", "running")
        first.stop()  # SIGTERM: the tasks keep running
        assert engine.api.containers(filters={"label": f"{LABEL_ALLOC_ID}={alloc['ID']}"}) != []

        missing = f"unix://{data}/agent.sock"  # the stopped agent's socket: nothing answers there
        assert 'job "nope" not found' in _refused(cli(missing, "job", "stop", "--data-dir", str(data), "nope"))
        # NOMAD_ADDR names another agent: its data dir is not this one, nothing is recorded here.
        elsewhere = cli("unix:///nonexistent/agent.sock", "job", "stop", "web")
        assert "cannot reach" in _refused(elsewhere)
        done = _ok(cli(missing, "job", "stop", "--data-dir", str(data), "web"))
        assert done == 'the agent is not running: job "web" is stopped when it starts again\n'

        second.start()
        [ended] = second.wait_allocs("web", "complete", "failed")
        assert ended["ID"] == alloc["ID"] and ended["ClientStatus"] == "complete", ended
        assert _field(_ok(cli(second.address, "job", "status", "web")), "Status") == "dead"
        assert labelled_containers(engine, f"{LABEL_ALLOC_ID}={alloc['ID']}") == []
        assert second.wait_allocs("other", "running")  # the job not stopped is recovered, running
    finally:
        if second.proc is None and first.proc is not None and first.proc.poll() is not None:
            second.start()  # the tasks the stopped agent left are stopped by the next one
        second.close()
        first.close()
