"""`driversdk run JOB` with an agent running: the job goes to the agent (parsed there, with -var,
-var-file and NOMAD_VAR_* as on `validate`), its task events come back as today's lines, the exit
code says how the batch ended, -detach and Ctrl-C leave the job running in the agent, a refused
job registers nothing, and the CLI process loads no HCL evaluator, grpc or plugin client."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.agent.agentproc import ROOT, AgentProcess

BUSYBOX = "driversdk-test/busybox:local"
WHERE = r' \[job "{job}", alloc ([0-9a-f]{{8}})\]'
# What a run against an agent must never load in its own process.
HEAVY = ("grpc", "lark", "hcl2", "hcl", "docker", "driversdk.jobspec.hcl", "driversdk.client", "driversdk.plugin",
         "driversdk.jobspec.job", "driversdk.agent.run")  # fmt: skip


def _env(agent: AgentProcess | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    if agent is not None:
        env["NOMAD_ADDR"] = agent.address
    return {**env, **extra}


def run(agent: AgentProcess | None, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "driversdk.cli", "run", *args], cwd=ROOT, env=_env(agent, **env),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def job_file(path: Path, name: str, script: str, *, job_type: str = "batch", head: str = "") -> Path:
    path.write_text(
        f"""{head}
job "{name}" {{
  type = "{job_type}"
  group "g" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    task "t" {{
      driver = "docker"
      config {{
        image   = "{BUSYBOX}"
        command = "sh"
        args    = ["-c", {json.dumps(script)}]
      }}
    }}
  }}
}}
"""
    )
    return path


def stdout_of(agent: AgentProcess, alloc_id: str) -> bytes:
    return b"".join(agent.client().stream(f"/v1/client/fs/logs/{alloc_id}", task="t", type="stdout", plain="true"))


def jobs(agent: AgentProcess) -> list[str]:
    return [j["ID"] for j in agent.client().get("/v1/jobs") or []]


def test_a_batch_job_runs_in_the_agent_with_todays_lines(agent: AgentProcess, tmp_path: Path) -> None:
    path = job_file(tmp_path / "hello.hcl", "hello", "echo hello from the agent")
    done = run(agent, str(path))
    assert done.returncode == 0, done.stderr
    where = WHERE.format(job="hello")
    started = re.search(r'^==> task "t" started \(docker\)' + where + "$", done.stdout, re.M)
    assert started, done.stdout
    assert re.search(r'^==> task "t" finished with exit code 0' + where + "$", done.stdout, re.M), done.stdout
    # It ran in the agent: the agent has the job and the allocation the lines name.
    [alloc] = agent.client().get("/v1/job/hello/allocations")
    assert alloc["ID"].startswith(started.group(1)) and alloc["ClientStatus"] == "complete"
    assert stdout_of(agent, alloc["ID"]) == b"hello from the agent\n"
    assert done.stdout.index("started (docker)") < done.stdout.index("finished with exit code 0")


def test_run_json_prints_todays_event_objects(agent: AgentProcess, tmp_path: Path) -> None:
    path = job_file(tmp_path / "j.hcl", "jsonrun", "echo hi")
    done = run(agent, "--json", str(path))
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    [alloc] = agent.client().get("/v1/job/jsonrun/allocations")
    tasks = [e for e in events if e["kind"] == "task"]
    started = next(e for e in tasks if e["type"] == "Started")
    assert started["details"] == {"driver": "docker"} and started["alloc"] == alloc["ID"]
    assert started["job"] == "jsonrun" and started["group"] == "g" and started["task"] == "t"
    assert started["exit_code"] is None and started["signal"] is None
    finished = next(e for e in tasks if e["type"] == "finished")
    assert finished["exit_code"] == 0 and finished["signal"] == 0 and "details" not in finished
    assert [e["time"] for e in tasks] == sorted(e["time"] for e in tasks)


def test_a_failing_batch_exits_1_with_the_reason(agent: AgentProcess, tmp_path: Path) -> None:
    path = job_file(tmp_path / "f.hcl", "fails", "echo bad >&2; exit 3")
    done = run(agent, str(path))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert re.search(r'^==> task "t" finished with exit code 3' + WHERE.format(job="fails"), done.stdout, re.M)
    assert re.search(r'^error: finished with exit code 3 \[job "fails", alloc [0-9a-f]{8}, task "t"\]$', done.stderr,
                     re.M), done.stderr  # fmt: skip
    assert "Traceback" not in done.stderr


def test_a_task_the_driver_cannot_start_exits_1_with_the_drivers_sentence(agent: AgentProcess, tmp_path: Path) -> None:
    path = job_file(tmp_path / "m.hcl", "noimage", "true")
    path.write_text(path.read_text().replace(BUSYBOX, "driversdk-test/not-there:local"))
    done = run(agent, str(path))
    assert done.returncode == 1, (done.stdout, done.stderr)
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error: ")]
    assert "driversdk-test/not-there:local" in line and line.endswith('task "t"]'), line
    assert "Driver Failure: " in done.stdout
    [alloc] = agent.client().get("/v1/job/noimage/allocations")  # the agent ran it
    assert alloc["ClientStatus"] == "failed"


def test_an_invalid_job_exits_2_and_registers_nothing(agent: AgentProcess, tmp_path: Path) -> None:
    bad = job_file(tmp_path / "bad.hcl", "bad", "true")
    bad.write_text(bad.read_text().replace('mode     = "fail"', 'mode     = "sometimes"'))
    done = run(agent, str(bad))
    assert done.returncode == 2, (done.stdout, done.stderr)
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: {bad}:") and "sometimes" in line, line
    # The agent refuses it at registration (a driver no plugin serves): also refused, also nothing.
    nope = job_file(tmp_path / "nope.hcl", "nope", "true")
    nope.write_text(nope.read_text().replace('driver = "docker"', 'driver = "nope"'))
    done = run(agent, str(nope))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: ") and 'driver "nope"' in done.stderr and done.stdout == ""
    assert jobs(agent) == [] and agent.client().get("/v1/allocations") == []


def test_a_second_job_refused_leaves_the_first_unregistered(agent: AgentProcess, tmp_path: Path) -> None:
    good = job_file(tmp_path / "good.hcl", "good", "true")
    nope = job_file(tmp_path / "nope.hcl", "nope", "true")
    nope.write_text(nope.read_text().replace('driver = "docker"', 'driver = "nope"'))
    done = run(agent, str(good), str(nope))
    assert done.returncode == 2 and 'driver "nope"' in done.stderr, (done.stdout, done.stderr)
    assert jobs(agent) == []


def test_var_var_file_and_nomad_var_change_the_job_as_on_validate(agent: AgentProcess, tmp_path: Path) -> None:
    head = """
variable "greeting" { type = string }
variable "who" {
  type    = string
  default = "nobody"
}
variable "punct" {
  type    = string
  default = "."
}
variable "times" {
  type    = number
  default = 1
}
"""
    path = job_file(
        tmp_path / "v.hcl", "vars", 'echo "${var.greeting} ${var.who}${var.punct} x${var.times}"', head=head
    )
    (tmp_path / "a.hcl").write_text('who = "from-file"\npunct = "?"\n')
    (tmp_path / "b.json").write_text('{"times": 4}')
    # env < var files (in order) < -var, as validate takes them.
    args = ["-var-file", str(tmp_path / "a.hcl"), "-var-file", str(tmp_path / "b.json"), "-var", "punct=!"]
    env = {"NOMAD_VAR_greeting": "hi", "NOMAD_VAR_who": "from-env"}
    checked = subprocess.run([sys.executable, "-m", "driversdk.cli", "validate", *args, str(path)], cwd=ROOT,
                             env=_env(None, **env), capture_output=True, text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout
    done = run(agent, *args, str(path), **env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    [alloc] = agent.client().get("/v1/job/vars/allocations")
    assert stdout_of(agent, alloc["ID"]) == b"hi from-file! x4\n"
    # A value of the wrong type is the same refusal as on validate, and nothing is registered.
    again = job_file(tmp_path / "w.hcl", "wrong", "echo ${var.times}", head='variable "times" { type = number }')
    done = run(agent, "-var", "times=many", str(again))
    assert done.returncode == 2 and "times" in done.stderr and "-var" in done.stderr, done.stderr
    assert "wrong" not in jobs(agent)
    # A var file the CLI cannot read is refused here, before the agent hears of it.
    done = run(agent, "-var-file", str(tmp_path / "missing.hcl"), str(again))
    assert done.returncode == 2 and "missing.hcl" in done.stderr and "No such file" in done.stderr, done.stderr


def test_file_functions_through_the_agent_say_how_to_run_it(agent: AgentProcess, tmp_path: Path) -> None:
    (tmp_path / "motd.txt").write_text("hello\n")
    path = job_file(tmp_path / "f.hcl", "files", 'echo ${file("motd.txt")}')
    done = run(agent, str(path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "put the content in the job file itself" in done.stderr
    assert "`driversdk run` while no agent is running" in done.stderr
    assert jobs(agent) == []


def test_a_json_job_goes_straight_to_the_agent(agent: AgentProcess, tmp_path: Path) -> None:
    job: dict[str, Any] = {
        "Job": {
            "ID": "fromjson",
            "Name": "fromjson",
            "Type": "batch",
            "TaskGroups": [
                {
                    "Name": "g",
                    "Count": 1,
                    "Tasks": [
                        {
                            "Name": "t",
                            "Driver": "docker",
                            "Config": {"image": BUSYBOX, "command": "echo", "args": ["json"]},
                        }
                    ],
                }
            ],
        }
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    done = run(agent, str(path))
    assert done.returncode == 0, (done.stdout, done.stderr)
    [alloc] = agent.client().get("/v1/job/fromjson/allocations")
    assert stdout_of(agent, alloc["ID"]) == b"json\n"


def test_detach_returns_with_the_ids_and_the_job_runs_on(agent: AgentProcess, tmp_path: Path) -> None:
    path = job_file(tmp_path / "d.hcl", "detached", "echo up; exec sleep 300", job_type="service")
    done = run(agent, "-detach", str(path))
    assert done.returncode == 0, (done.stdout, done.stderr)
    [alloc] = agent.wait_allocs("detached", "running")
    assert alloc["ID"] in done.stdout and '"detached"' in done.stdout
    assert "driversdk job stop detached" in done.stdout
    assert "started (docker)" not in done.stdout  # it did not follow the job


def test_ctrl_c_on_a_followed_run_detaches_and_says_how_to_stop(agent: AgentProcess, tmp_path: Path) -> None:
    path = job_file(tmp_path / "s.hcl", "svc", "echo up; exec sleep 300", job_type="service")
    proc = _follow(agent, path)
    seen = _read_until(proc, "started (docker)")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    rest = out.decode()
    assert proc.returncode == 0, (seen, rest, err)
    assert "detached" in rest and "`driversdk job stop svc`" in rest, rest
    # Still running in the agent, never stopped.
    [alloc] = agent.wait_allocs("svc", "running")
    events = alloc["TaskStates"]["t"]["Events"]
    assert not [e for e in events if e["Type"] in ("Killing", "Killed")], events


def _follow(agent: AgentProcess, path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "driversdk.cli", "run", str(path)], cwd=ROOT, env=_env(agent),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _read_until(proc: subprocess.Popen[bytes], text: str, timeout: float = 90) -> str:
    """The run's output up to a line holding ``text`` (a bound so that a run that never prints it
    fails instead of hanging the suite)."""
    assert proc.stdout is not None
    fd, data, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout
    while text.encode() not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            proc.kill()
            raise AssertionError(f"the run never printed {text!r}: {data!r}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"the run ended before printing {text!r}: {data!r}")
        data += chunk
    return data.decode()


def _imported(stderr: str) -> set[str]:
    """Module names from -X importtime's lines ("import time: self | cumulative | name")."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def _heavy(names: set[str]) -> set[str]:
    return {n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY)}


def test_a_run_through_the_agent_loads_no_hcl_grpc_or_plugin_client(agent: AgentProcess, tmp_path: Path) -> None:
    path = job_file(tmp_path / "i.hcl", "imports", "echo ok")
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "driversdk.cli", "run", str(path)], cwd=ROOT,
                          env=_env(agent), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    names = _imported(done.stderr)
    assert {"driversdk.cli.runagent", "driversdk.cli.apiclient"} <= names  # it did go through the agent
    assert _heavy(names) == set()


def test_the_import_check_sees_what_a_bare_run_loads(tmp_path: Path) -> None:
    """The same check on a run with no agent (in this process, as today) finds them: it can fail."""
    data = tmp_path / "data"
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{data}"\n')
    path = job_file(tmp_path / "i.hcl", "bare", "echo ok")
    env = _env(None, TMPDIR=str(tmp_path))  # no dev agent's socket under this TMPDIR either
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "driversdk.cli", "run", "--client", str(client),
                           str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'task "t" finished with exit code 0' in done.stdout
    heavy = _heavy(_imported(done.stderr))
    assert {"grpc", "driversdk.client", "driversdk.jobspec.hcl"} <= heavy


def test_detach_without_an_agent_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{data}"\n')
    path = job_file(tmp_path / "x.hcl", "nodetach", "echo ok")
    done = run(None, "-detach", "--client", str(client), str(path), TMPDIR=str(tmp_path))
    assert done.returncode == 2 and "-detach needs a running agent" in done.stderr, done.stderr
    assert not (data / "state.db").exists()


def _allocs_named(stdout: str) -> set[str]:
    return set(re.findall(r"alloc ([0-9a-f]{8})\]$", stdout, re.M))


def test_a_rerun_follows_only_its_own_allocations(agent: AgentProcess, tmp_path: Path) -> None:
    path = job_file(tmp_path / "r.hcl", "again", "echo once more")
    first = run(agent, str(path))
    assert first.returncode == 0, first.stderr
    [one] = _allocs_named(first.stdout)
    second = run(agent, str(path))  # registered again: the first run's allocation is not this run's
    assert second.returncode == 0, second.stderr
    [two] = _allocs_named(second.stdout)
    agent.client().request("DELETE", "/v1/job/again", {"purge": "true"})
    third = run(agent, str(path))  # purged, then a new job of the same id
    assert third.returncode == 0, third.stderr
    [three] = _allocs_named(third.stdout)
    assert len({one, two, three}) == 3


def test_running_an_unchanged_running_job_follows_its_allocation(agent: AgentProcess, tmp_path: Path) -> None:
    """The agent keeps a running job that is registered again unchanged: the run follows the
    allocation it has (as `nomad job run` of an unchanged job shows it), not one that never comes."""
    path = job_file(tmp_path / "u.hcl", "same", "echo up; exec sleep 300", job_type="service")
    assert run(agent, "-detach", str(path)).returncode == 0
    [alloc] = agent.wait_allocs("same", "running")
    proc = _follow(agent, path)
    seen = _read_until(proc, "started (docker)")
    [line] = [x for x in seen.splitlines() if "started (docker)" in x]
    assert line.endswith(f"alloc {alloc['ID'][:8]}]"), line
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "driversdk job stop same" in out.decode(), (out, err)
    assert [a["ID"] for a in agent.wait_allocs("same", "running")] == [alloc["ID"]]


def test_a_periodic_job_is_registered_and_not_followed(agent: AgentProcess, tmp_path: Path) -> None:
    path = job_file(tmp_path / "p.hcl", "nightly", "echo tick")
    path.write_text(path.read_text().replace('  type = "batch"\n', '  type = "batch"\n  periodic {\n'
                                             '    crons = ["0 3 * * *"]\n  }\n'))  # fmt: skip
    done = run(agent, str(path))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert 'job "nightly" is periodic' in done.stdout and "driversdk job stop nightly" in done.stdout
    assert "nightly" in jobs(agent)
