"""Nomad job semantics real job files rely on, under the real CLI (`driversdk run` / `validate`
subprocesses), real driver plugins and a real engine: datacenters, periodic jobs, memory_max = -1,
the cgroup and storage node attributes, and a failed task or a dead leader stopping its siblings."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import docker

from tests.agent.grouprun import alloc_dir, run, task, write
from tests.agent.runs import ROOT, cli, leaks, start_run, wait_for

MIB = 1024 * 1024


def validate(job: Path, client: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli("validate", str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def log(data: Path, name: str) -> str:
    logs = alloc_dir(data) / "alloc" / "logs"
    return "".join(p.read_text() for p in sorted(logs.glob(f"{name}.stdout.*")))


# --- datacenters ---------------------------------------------------------------------------------


def with_job_line(job: Path, line: str) -> None:
    job.write_text(job.read_text().replace('  type = "batch"\n', f'  type = "batch"\n  {line}\n', 1))


def test_datacenters_the_node_is_not_in_refuse_the_run_and_start_nothing(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    job, client, data = write(tmp_path, task("t", "touch /alloc/data/ran"))
    with_job_line(job, 'datacenters = ["dc2", "eu-*"]')
    checked = validate(job, client)
    assert checked.returncode == 1, checked.stdout
    assert 'the job asks for datacenters "dc2", "eu-*" and this node is in datacenter "dc1"' in checked.stdout
    done = run(job, client)
    assert done.returncode == 2, done.stdout + done.stderr
    assert 'datacenters "dc2", "eu-*"' in done.stdout + done.stderr
    assert not (data / "allocs").exists() or not any((data / "allocs").iterdir())
    assert leaks(engine, tmp_path) == []


def test_datacenter_patterns_match_as_nomads_glob(engine: docker.DockerClient, tmp_path: Path) -> None:
    job, client, data = write(tmp_path, task("t", "touch /alloc/data/ran"))
    with_job_line(job, 'datacenters = ["eu-*", "d*1"]')  # "d*1" matches the node's "dc1"
    done = run(job, client)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (alloc_dir(data) / "alloc" / "data" / "ran").exists()
    client.write_text(client.read_text() + 'datacenter = "eu-west"\n')
    job.write_text(job.read_text().replace('["eu-*", "d*1"]', '["dc?"]'))  # no `?` in Nomad's glob: a literal
    checked = validate(job, client)
    assert checked.returncode == 1 and 'this node is in datacenter "eu-west"' in checked.stdout, checked.stdout


# --- periodic ------------------------------------------------------------------------------------


def test_a_periodic_job_is_refused_by_run_with_what_to_do(engine: docker.DockerClient, tmp_path: Path) -> None:
    job, client, data = write(tmp_path, task("t", "touch /alloc/data/ran"))
    with_job_line(job, 'periodic {\n    crons = ["*/5 * * * *"]\n  }')
    checked = validate(job, client)
    assert checked.returncode == 1
    assert "driversdk run does not run periodic jobs" in checked.stdout
    assert '"*/5 * * * *"' in checked.stdout and "remove the periodic block" in checked.stdout
    assert "periodic: not acted on" not in checked.stdout  # refused, not a note
    done = run(job, client)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "driversdk run does not run periodic jobs" in done.stdout + done.stderr
    assert not (data / "allocs").exists() or not any((data / "allocs").iterdir())
    assert leaks(engine, tmp_path) == []


# --- memory_max = -1 -----------------------------------------------------------------------------

# What a task's memory cgroup says about its limits (v1 inside the task's own cgroup namespace or
# mount; v2 memory.max / memory.low).
CGROUP_MEMORY = (
    "for f in /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory/memory.soft_limit_in_bytes "
    "/sys/fs/cgroup/memory.max /sys/fs/cgroup/memory.low; do [ -f $f ] && echo $f=$(cat $f); done; true"
)
UNLIMITED_V1 = 9223372036854771712  # memory.limit_in_bytes with no limit (page-rounded LONG_MAX)


def limits(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def exec_limits(data: Path) -> dict[str, str] | None:
    """The memory limits of the cgroup the running exec task is in (its runc child inherits the
    task cgroup's limits: the parent's are read)."""
    try:
        text = log(data, "e")
    except (FileNotFoundError, ValueError):
        return None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        parent = os.path.dirname(path)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / parent.lstrip("/")
            files = ("memory.limit_in_bytes", "memory.soft_limit_in_bytes")
        elif controllers == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            base = Path("/sys/fs/cgroup") / parent.lstrip("/")
            files = ("memory.max", "memory.low")
        else:
            continue
        try:
            return {"hard": (base / files[0]).read_text().strip(), "soft": (base / files[1]).read_text().strip()}
        except OSError:
            return None
    return None


def test_memory_max_minus_one_is_no_hard_limit_under_docker_and_exec(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    res = "resources {\n        memory     = 64\n        memory_max = -1\n      }"
    # The exec task cannot see its cgroup files: it says where it is and the host reads them.
    body = task("d", CGROUP_MEMORY, res) + task("e", "cat /proc/self/cgroup; sleep 5", res, driver="exec")
    job, client, data = write(tmp_path, body)
    assert validate(job, client).returncode == 0
    proc = start_run(job, client)
    seen_exec = wait_for("the exec task's cgroup limits", lambda: exec_limits(data), timeout=60)
    assert proc.wait(timeout=120) == 0
    assert seen_exec["hard"] in ("max", str(UNLIMITED_V1)), seen_exec
    assert seen_exec["soft"] == str(64 * MIB), seen_exec
    for name in ("d",):
        seen = limits(log(data, name))
        assert seen, (name, log(data, name))
        hard = seen.get("/sys/fs/cgroup/memory/memory.limit_in_bytes") or seen.get("/sys/fs/cgroup/memory.max")
        assert hard in ("max", str(UNLIMITED_V1)), (name, seen)
        soft = seen.get("/sys/fs/cgroup/memory/memory.soft_limit_in_bytes") or seen.get("/sys/fs/cgroup/memory.low")
        assert soft == str(64 * MIB), (name, seen)
    assert leaks(engine, tmp_path) == []


def test_memory_max_below_memory_is_refused_in_nomads_words(tmp_path: Path) -> None:
    job, client, _ = write(tmp_path, task("t", "true", "resources {\n        memory_max = -5\n      }"))
    checked = validate(job, client)
    assert checked.returncode == 1
    assert "MemoryMaxMB value (-5) should be larger than MemoryMB value (300)" in checked.stdout


# --- node attributes -----------------------------------------------------------------------------


def test_cgroup_and_storage_attributes_reach_constraints_and_interpolation(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    version = "2" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "1"
    other = "1" if version == "2" else "2"
    env = (
        'env {\n        CG = "${attr.os.cgroups.version}"\n        VOL = "${attr.unique.storage.volume}"\n'
        '        TOTAL = "${attr.unique.storage.bytestotal}"\n'
        '        FREE = "${attr.unique.storage.bytesfree}"\n      }'
    )
    constraint = (
        f'constraint {{\n      attribute = "${{attr.os.cgroups.version}}"\n      value = "{version}"\n    }}\n'
        '    constraint {\n      attribute = "${attr.unique.storage.bytesfree}"\n      operator = ">"\n'
        '      value = "0"\n    }\n'
    )
    job, client, data = write(tmp_path, task("t", 'echo "$CG|$VOL|$TOTAL|$FREE"', env), group_extra=constraint)
    done = run(job, client)
    assert done.returncode == 0, done.stdout + done.stderr
    cg, vol, total, free = log(data, "t").strip().split("|")
    fs = os.statvfs(data)
    assert cg == version
    assert int(total) == fs.f_blocks * fs.f_frsize
    assert 0 < int(free) <= fs.f_blocks * fs.f_frsize
    df = subprocess.run(["df", "-k", str(data)], capture_output=True, text=True, check=True).stdout
    assert vol and df.splitlines()[1].split()[0] == vol
    job.write_text(job.read_text().replace(f'value = "{version}"', f'value = "{other}"'))
    checked = validate(job, client)
    assert checked.returncode == 1 and f'attr.os.cgroups.version is "{version}"' in checked.stdout, checked.stdout


# --- a failed task, a dead leader ----------------------------------------------------------------

NO_RESTARTS = 'restart {\n        attempts = 0\n        mode = "fail"\n      }'


def test_a_failed_task_stops_its_siblings_with_nomads_event(engine: docker.DockerClient, tmp_path: Path) -> None:
    body = task("bad", "sleep 1; exit 3", NO_RESTARTS) + task("long", "sleep 300", NO_RESTARTS)
    job, client, _ = write(tmp_path, body)
    began = time.monotonic()
    done = run(job, client)
    took = time.monotonic() - began
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "long" in line]
    assert any('Sibling Task Failed: Task\'s sibling "bad" failed' in line for line in lines), done.stdout
    assert took < 120  # not the 300 s the sibling would have slept
    assert leaks(engine, tmp_path) == []


def test_a_dead_leader_stops_the_others_and_the_run_succeeds(engine: docker.DockerClient, tmp_path: Path) -> None:
    body = task("main", "sleep 1; touch /alloc/data/led", "leader = true\n" + NO_RESTARTS)
    body += task("helper", "sleep 300", NO_RESTARTS)
    job, client, data = write(tmp_path, body)
    done = run(job, client)
    assert done.returncode == 0, done.stdout + done.stderr
    helper = [line for line in done.stdout.splitlines() if "helper" in line]
    assert any("Leader Task Dead: Leader Task in Group dead" in line for line in helper), done.stdout
    assert (alloc_dir(data) / "alloc" / "data" / "led").exists()
    assert leaks(engine, tmp_path) == []


def test_two_leaders_are_refused_in_nomads_words(tmp_path: Path) -> None:
    body = task("a", "true", "leader = true") + task("b", "true", "leader = true")
    job, client, _ = write(tmp_path, body)
    checked = validate(job, client)
    assert checked.returncode == 1 and "Only one task may be marked as leader" in checked.stdout, checked.stdout
