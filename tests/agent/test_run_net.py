"""`driversdk run` with runtime interpolation, constraints and group network ports, end to end
through the real CLI: the reference CSI plugin written as Nomad's docs write it, docker tasks
whose args use the task environment and node attributes, a docker task reachable on its
dynamic host port, an exec bridge group reachable on its static port through iptables
forwarding, and each refusal with its sentence and nothing left behind."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import docker
import pytest

from driversdk.agent import nodeattrs
from driversdk.agent.allocrunner import portalloc
from tests.agent.csienv import IMAGE, Env, demo, plugin_group, wait_for_line, write_job
from tests.agent.netjobs import no_forwarding_rules, stop, web_job
from tests.outside import outside_host

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runc, iptables and mounts: root only")


@pytest.fixture
def env(engine: docker.DockerClient, short_dir: Path) -> Env:
    work = short_dir
    (work / "backing" / "volumes").mkdir(parents=True)
    demo.client_config(
        work,
        docker_extra='infra_image = "driversdk-test/pause:local"',
        exec_extra=f'state_dir = "{work / "exec-state"}"\n{demo.ROOT_TASKS}',
    )
    return Env(work, engine)


def get(url: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return str(resp.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


# --- interpolation ------------------------------------------------------------------------------


def test_csi_plugin_job_as_nomads_docs_write_it_runs(env: Env) -> None:
    """`--endpoint=${CSI_ENDPOINT}` and `--node-id=${node.unique.name}` reach the plugin's args."""
    group = plugin_group().replace(
        'args    = ["-m", "driversdk.csi.hostpath"]',
        'args    = ["-m", "driversdk.csi.hostpath", "--endpoint=${CSI_ENDPOINT}", "--node-id=${node.unique.name}"]',
    )
    assert "${CSI_ENDPOINT}" in group
    # The plugin must not find its endpoint in the environment alone: the arg is what it uses.
    job = write_job(env, "csi", group)
    proc = env.start(job)
    try:
        wait_for_line(proc, "Plugin became healthy")
        args = [a for a in plugin_cmdlines() if "--endpoint=" in " ".join(a)]
        assert len(args) == 1, args
        assert "--endpoint=unix:///csi/csi.sock" in args[0]
        assert f"--node-id={socket.gethostname()}" in args[0]
    finally:
        out = stop(proc)
    assert "${" not in out, out
    env.assert_clean()


def plugin_cmdlines() -> list[list[str]]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        except OSError:
            continue
        if "driversdk.csi.hostpath" in args:
            out.append(args)
    return out


def test_docker_args_use_the_task_environment_and_node_attributes(env: Env) -> None:
    job = env.work / "interp.hcl"
    job.write_text(
        f"""job "interp" {{
  type = "batch"
  group "g" {{
    task "t" {{
      driver = "docker"
      config {{
        image   = "{IMAGE}"
        command = "/bin/echo"
        args    = ["alloc=${{NOMAD_ALLOC_ID}}", "dir=${{NOMAD_TASK_DIR}}", "kernel=${{attr.kernel.name}}",
                   "greeting=${{NOMAD_META_greeting}}"]
      }}
      meta {{
        greeting = "hi"
      }}
    }}
  }}
}}
"""
    )
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    logs = env.cli("logs", "t", "--client", str(env.client)).stdout.split()
    alloc = next(w.split("=", 1)[1] for w in logs if w.startswith("alloc="))
    assert len(alloc) == 36 and f"alloc {alloc[:8]}" in done.stdout
    assert "dir=/local" in logs and f"kernel={os.uname().sysname.lower()}" in logs and "greeting=hi" in logs
    env.assert_clean()


# --- constraints --------------------------------------------------------------------------------


def test_unmet_constraint_refuses_the_run_before_anything(env: Env) -> None:
    job = env.work / "cons.hcl"
    job.write_text(
        f"""job "cons" {{
  type = "batch"
  group "g" {{
    constraint {{
      attribute = "${{attr.kernel.name}}"
      value     = "windows"
    }}
    affinity {{
      attribute = "${{meta.rack}}"
      value     = "r1"
    }}
    task "t" {{
      driver = "docker"
      config {{
        image = "{IMAGE}"
      }}
    }}
  }}
}}
"""
    )
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        'constraint ${attr.kernel.name} = "windows" is not met on this node: attr.kernel.name is "linux"' in done.stdout
    )
    assert not (env.data / "allocs").exists()
    checked = env.cli("validate", str(job), "--client", str(env.client))
    assert checked.returncode == 1
    assert 'group "g"' in checked.stdout and "affinity ${meta.rack}" in checked.stdout
    env.assert_clean()


# --- ports --------------------------------------------------------------------------------------


DOCKER_HTTPD = f"""
    task "httpd" {{
      driver = "docker"
      kill_timeout = "1s"
      config {{
        image   = "{IMAGE}"
        command = "/bin/sh"
        args    = ["-c", join(" && ", ["mkdir -p /www",
                                  "echo port=$NOMAD_PORT_http host=$NOMAD_HOST_PORT_http > /www/index.html",
                                  "exec httpd -f -p 80 -h /www"])]
        ports   = ["http"]
      }}
    }}"""


def test_docker_task_is_reachable_on_its_dynamic_host_port(env: Env) -> None:
    job = web_job(env, "dyn", '      port "http" {\n        to = 80\n      }', DOCKER_HTTPD)
    proc = env.start(job)
    try:
        lines = wait_for_line(proc, '==> task "httpd" started')
        port = int(next(line for line in lines if "ports: http " in line).split("ports: http ")[1].split("->")[0])
        assert 20000 <= port <= 32000
        body = get(f"http://{nodeattrs.host_ip()}:{port}/")
        assert body.strip() == f"port=80 host={port}"
    finally:
        out = stop(proc)
    assert "stopping" in out
    env.assert_clean()
    no_forwarding_rules()


EXEC_HTTP = """
    task "server" {{
      driver = "exec"
      kill_timeout = "1s"
      config {{
        command = "{python}"
        args    = ["-m", "http.server", "${{NOMAD_PORT_http}}", "--bind", "0.0.0.0",
                   "--directory", "${{NOMAD_TASK_DIR}}"]
      }}
    }}"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def test_bridge_group_is_reachable_on_its_static_port_and_leaves_no_rules(env: Env) -> None:
    static = free_port()
    network = f'      mode = "bridge"\n      port "http" {{\n        static = {static}\n        to = 8080\n      }}'
    job = web_job(env, "bridge", network, EXEC_HTTP.format(python=os.path.realpath(sys.executable)))
    proc = env.start(job)
    try:
        before = "".join(wait_for_line(proc, '==> task "server" started'))
        assert "ports forwarded from the host to" in before
        (next((env.data / "allocs").iterdir()) / "server" / "local" / "index.html").write_text("from the bridge\n")
        assert get(f"http://{nodeattrs.host_ip()}:{static}/index.html") == "from the bridge\n"
        rules = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True).stdout
        assert f"--dport {static}" in rules and "driversdk alloc" in rules
    finally:
        stop(proc)
    env.assert_clean()
    no_forwarding_rules()


def test_static_port_already_taken_is_refused_with_a_sentence_and_nothing_left(env: Env) -> None:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    stop_accepting = threading.Event()
    try:
        network = f'      mode = "bridge"\n      port "http" {{\n        static = {taken}\n        to = 8080\n      }}'
        job = web_job(env, "taken", network, EXEC_HTTP.format(python=os.path.realpath(sys.executable)))
        done = env.cli("run", str(job), "--client", str(env.client))
    finally:
        stop_accepting.set()
        holder.close()
    assert done.returncode == 2, done.stdout + done.stderr  # the allocation's setup refused the job
    assert (
        f'job "taken" group "web": static port {taken} (port "http") is already in use on this host '
        "(a TCP socket on 0.0.0.0 holds it)" in done.stdout + done.stderr
    )
    assert '==> task "server" started' not in done.stdout
    env.assert_clean()
    no_forwarding_rules()
    assert not portalloc.rules_of("")


def test_killed_run_recovered_keeps_its_ports_and_forwarding_then_removes_them(env: Env) -> None:
    static = free_port()
    network = (
        f'      mode = "bridge"\n      port "http" {{\n        static = {static}\n        to = 8080\n      }}\n'
        '      port "extra" {}'
    )
    job = web_job(env, "again", network, EXEC_HTTP.format(python=os.path.realpath(sys.executable)))
    first = env.start(job)
    lines = "".join(wait_for_line(first, '==> task "server" started'))
    dynamic = lines.split("ports: ")[1].split("extra ")[1].split()[0].rstrip(",")
    alloc_dir = next((env.data / "allocs").iterdir())
    (alloc_dir / "server" / "local" / "index.html").write_text("still here\n")
    assert get(f"http://{nodeattrs.host_ip()}:{static}/index.html") == "still here\n"
    first.kill()  # SIGKILL: the task, its namespace and the forwarding rules stay
    first.communicate(timeout=30)
    assert portalloc.rules_of(alloc_dir.name)
    second = env.start(job)
    try:
        wait_for_line(second, '==> task "server" recovered')
        assert get(f"http://{nodeattrs.host_ip()}:{static}/index.html") == "still here\n"
        record = sqlite3.connect(env.db).execute("SELECT network FROM run_allocs").fetchone()[0]
        assert f'"value": {dynamic}' in record and f'"value": {static}' in record
    finally:
        stop(second)
    env.assert_clean()
    no_forwarding_rules()


def test_docker_bridge_group_is_reachable_on_its_static_port_and_leaves_nothing(env: Env) -> None:
    """docker's pause container has no network of its own: run gives it an address on its bridge
    (as Nomad's CNI bridge does) and forwards the static port there."""
    static = free_port()
    network = f'      mode = "bridge"\n      port "http" {{\n        static = {static}\n        to = 80\n      }}'
    job = web_job(env, "dockbridge", network, DOCKER_HTTPD)
    proc = env.start(job)
    try:
        before = "".join(wait_for_line(proc, '==> task "httpd" started'))
        assert "network namespace given 172.26.64." in before and "ports forwarded from the host to" in before
        assert get(f"http://{nodeattrs.host_ip()}:{static}/").strip() == f"port=80 host={static}"
    finally:
        stop(proc)
    assert [c.name for c in env.engine.containers.list(all=True) if c.name.startswith("nomad_init_")] == []
    env.assert_clean()
    no_forwarding_rules()
    assert subprocess.run(["ip", "link", "show", "dsdkbr0"], capture_output=True).returncode != 0
    assert (
        not os.path.exists("/run/driversdk/bridge")
        or [n for n in os.listdir("/run/driversdk/bridge") if n.endswith(".json")] == []
    )


@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_bridge_group_without_ports_reaches_beyond_the_host_masqueraded(env: Env, driver: str) -> None:
    """As Nomad's bridge (CNI ipMasq): a bridge-mode group has an address and a way out of the
    host whether or not it has ports. The outside host has no route back to the group's subnet,
    so only a masqueraded request is answered, and the answer names the host's address."""
    with outside_host() as outside:
        # The script as an HCL string: its backslashes and quotes escaped.
        script = outside.request_script().replace("\\", "\\\\").replace('"', '\\"')
        if driver == "docker":
            config = f'image = "{IMAGE}"\n        command = "/bin/sh"\n        args = ["-c", "{script}"]'
        else:
            config = f'command = "/bin/busybox"\n        args = ["sh", "-c", "{script}"]'
        job = env.work / f"egress-{driver}.hcl"
        job.write_text(
            f'job "egress-{driver}" {{\n  type = "batch"\n  group "out" {{\n    network {{\n      mode = "bridge"\n'
            f'    }}\n    task "ask" {{\n      driver = "{driver}"\n      config {{\n        {config}\n      }}\n'
            "    }\n  }\n}\n"
        )
        done = env.cli("run", str(job), "--client", str(env.client))
        assert done.returncode == 0, done.stdout + done.stderr
        [log] = list((env.data / "allocs").glob("*/alloc/logs/ask.stdout.0"))
        assert log.read_text().splitlines()[-1] == f"seen-from {outside.host_side}", log.read_text()
    env.assert_clean()
    no_forwarding_rules()
    assert subprocess.run(["ip", "link", "show", "dsdkbr0"], capture_output=True).returncode != 0


@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_bridge_group_hostname_is_interpolated_for_the_allocation(env: Env, driver: str) -> None:
    """network.hostname, as Nomad: interpolated with the allocation's environment, the name the
    group's tasks see."""
    if driver == "docker":
        config = f'image = "{IMAGE}"\n        command = "/bin/sh"\n        args = ["-c", "hostname"]'
    else:
        config = 'command = "/bin/busybox"\n        args = ["hostname"]'
    job = env.work / f"hn-{driver}.hcl"
    job.write_text(
        f'job "hn-{driver}" {{\n  type = "batch"\n  group "g" {{\n    network {{\n      mode = "bridge"\n'
        '      hostname = "${NOMAD_JOB_NAME}-${NOMAD_ALLOC_INDEX}"\n    }\n'
        f'    task "t" {{\n      driver = "{driver}"\n      config {{\n        {config}\n      }}\n    }}\n  }}\n}}\n'
    )
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    [log] = list((env.data / "allocs").glob("*/alloc/logs/t.stdout.0"))
    assert log.read_text().strip() == f"hn-{driver}-0"
    env.assert_clean()


def test_a_hostname_that_interpolates_to_no_dns_name_is_refused_and_leaves_nothing(env: Env) -> None:
    job = env.work / "badhn.hcl"
    job.write_text(
        'job "badhn" {\n  type = "batch"\n  meta {\n    site = "two words"\n  }\n  group "g" {\n    network {\n'
        '      mode = "bridge"\n      hostname = "web-${NOMAD_META_site}"\n    }\n    task "t" {\n'
        '      driver = "exec"\n      config {\n        command = "/bin/busybox"\n        args = ["true"]\n'
        "      }\n    }\n  }\n}\n"
    )
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode != 0
    assert (
        'group "g" network.hostname "web-${NOMAD_META_site}" came to "web-two words", which is not a valid DNS name'
        in done.stdout + done.stderr
    ), done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    env.assert_clean()
    no_forwarding_rules()


def test_raw_exec_gets_host_paths_in_its_environment_and_args(env: Env) -> None:
    """A driver without filesystem isolation gets the dirs as host paths, in env and in args."""
    with env.client.open("a") as fh:
        fh.write('plugin "raw_exec" {\n  config {\n    enabled = true\n  }\n}\n')
    job = env.work / "raw.hcl"
    job.write_text(
        """job "raw" {
  type = "batch"
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo arg=${NOMAD_TASK_DIR} env=$NOMAD_TASK_DIR alloc=$NOMAD_ALLOC_DIR"]
      }
    }
  }
}
"""
    )
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    alloc_dir = next((env.data / "allocs").iterdir())
    words = env.cli("logs", "t", "--client", str(env.client)).stdout.split()
    assert words == [f"arg={alloc_dir}/t/local", f"env={alloc_dir}/t/local", f"alloc={alloc_dir}/alloc"]
    env.assert_clean()
