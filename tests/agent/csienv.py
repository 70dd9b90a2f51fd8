"""The environment of a CSI run test: a short work dir with the demo's client config (examples/demo.py),
the reference hostpath plugin as an exec task with csi_plugin, an app group mounting a CSI volume,
the CLI run against them, and what is left afterwards (mounts, containers, claims, registrations,
processes)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import docker

from drivers.docker.container import LABEL_TASK_ID
from driversdk.agent.csi.registry import PluginRegistration, PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.agent.csi.volumes import VolumeStore
from driversdk.mountinfo import read_mountinfo
from tests.agent.agentproc import AgentProcess
from tests.agent.runs import IMAGE, ROOT
from tests.hostcheck import labelled_containers, processes

HELLO = ROOT / "examples" / "hello_driver.py"


def _load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("driversdk_demo", ROOT / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _load_demo()


@dataclass
class Env:
    work: Path
    engine: docker.DockerClient

    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def client(self) -> Path:
        return self.work / "client.hcl"

    @property
    def db(self) -> str:
        return str(self.data / "state.db")

    def cli(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "driversdk.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
        )

    def start(self, job: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(self.client)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    def register(self, volume: str = "vol", access: str = "single-node-writer") -> None:
        (self.work / "backing" / "volumes" / volume).mkdir(parents=True, exist_ok=True)
        spec = self.work / f"{volume}.hcl"
        spec.write_text(
            f'id = "{volume}"\nplugin_id = "hostpath"\nexternal_id = "{volume}"\n'
            f'capability {{\n  access_mode = "{access}"\n  attachment_mode = "file-system"\n}}\n'
        )
        done = self.cli("volume", "register", str(spec), "--client", str(self.client))
        assert done.returncode == 0, done.stderr

    def claims(self, volume: str = "vol") -> list[str]:
        store = VolumeStore(self.db)
        try:
            return [c.alloc_id for c in store.claims(volume)]
        finally:
            store.close()

    def registrations(self) -> list[PluginRegistration]:
        store = StateStore(self.db)
        try:
            registry = PluginRegistry(store)
            return [r for kind in ("csi-node", "csi-controller") for r in registry.plugins(kind).values()]
        finally:
            store.close()

    def containers(self) -> list[str]:
        return [
            str(c["Name"]).lstrip("/")
            for c in labelled_containers(self.engine, LABEL_TASK_ID)
            if any(str(self.work) in b for b in c["HostConfig"].get("Binds") or [])
        ]

    def assert_clean(self) -> None:
        assert [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(self.work))] == []
        assert self.containers() == []
        assert self.registrations() == []
        exec_tasks = self.work / "exec-state" / "tasks"
        assert not exec_tasks.exists() or list(exec_tasks.iterdir()) == []
        assert processes(str(self.work)) == [], "log monitors or plugin tasks left running"


def make_env(engine: docker.DockerClient, work: Path) -> Env:
    (work / "backing" / "volumes").mkdir(parents=True)
    # The demo's own client config (examples/demo.py), plus what the tests need on top.
    demo.client_config(
        work,
        docker_extra='infra_image = "driversdk-test/pause:local"',
        exec_extra=f'state_dir = "{work / "exec-state"}"\n{demo.ROOT_TASKS}',
        extra=f'plugin "hello" {{\n  command = ["{sys.executable}", "{HELLO}"]\n}}',
    )
    return Env(work, engine)


def plugin_group(env: str = "", health_timeout: str = "30s", command: str = "", restart: str = "") -> str:
    args = '["-m", "driversdk.csi.hostpath"]' if not command else f'["-c", "{command}"]'
    binary = os.path.realpath(sys.executable) if not command else "/bin/sh"
    return f"""
  group "storage" {{
    {restart}
    volume "backing" {{
      type   = "host"
      source = "csi-backing"
    }}
    task "plugin" {{
      driver = "exec"
      user   = "root"
      kill_timeout = "2s"
      config {{
        command = "{binary}"
        args    = {args}
        cap_add = ["sys_admin"]
      }}
      env {{
        CSI_HOSTPATH_ROOT = "/srv/csi"
        # The plugin imports this tree (the installed one may be another checkout, outside the chroot).
        PYTHONPATH = "{ROOT}"
        {env}
      }}
      volume_mount {{
        volume      = "backing"
        destination = "/srv/csi"
      }}
      csi_plugin {{
        id             = "hostpath"
        type           = "monolith"
        health_timeout = "{health_timeout}"
      }}
    }}
  }}"""


def app_group(script: str, *, driver: str = "docker", propagation: str = "host-to-task", extra: str = "") -> str:
    config = (
        f'image = "{IMAGE}"\n        command = "/bin/sh"\n        args = ["-c", "{script}"]'
        if driver == "docker"
        else 'greeting = "hi"'
    )
    return f"""
  group "app" {{
    volume "data" {{
      type            = "csi"
      source          = "vol"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      {extra}
    }}
    task "app" {{
      driver = "{driver}"
      kill_timeout = "1s"
      config {{
        {config}
      }}
      volume_mount {{
        volume           = "data"
        destination      = "/data"
        propagation_mode = "{propagation}"
      }}
    }}
  }}"""


def write_job(env: Env, name: str, *groups: str) -> Path:
    path = env.work / f"{name}.hcl"
    path.write_text(f'job "{name}" {{\n  type = "batch"\n' + "".join(groups) + "\n}\n")
    return path


def wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float = 120) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"{needle!r} never printed; got:\n{''.join(lines)}")


def mounts(env: Env, part: str = "") -> list[str]:
    return [
        e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(env.work)) and part in e.mount_point
    ]


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    return out


def status(env: Env, volume: str) -> dict[str, object]:
    done = env.cli("volume", "status", volume, "--client", str(env.client))
    assert done.returncode == 0, done.stderr
    view: dict[str, object] = json.loads(done.stdout)
    return view


def claims_of(view: dict[str, object]) -> list[dict[str, str]]:
    found = view["claims"]
    assert isinstance(found, list)
    return found


def volume_file(env: Env, name: str, body: str) -> Path:
    path = env.work / f"{name}.hcl"
    path.write_text(
        f'id = "{name}"\nname = "{name}"\ntype = "csi"\nplugin_id = "hostpath"\n'
        'capability {\n  access_mode = "single-node-writer"\n  attachment_mode = "file-system"\n}\n' + body
    )
    return path


def privileged_allowed(engine: docker.DockerClient) -> bool:
    """Whether this engine can start a privileged container at all (a sandbox whose own bounding
    set lacks a capability cannot: runc fails to apply the full set)."""
    # Created and started by hand: containers.run leaves the container behind when its start
    # fails, which is exactly the case this asks about.
    probe = engine.containers.create("driversdk-test/busybox:local", "true", privileged=True)
    try:
        probe.start()
        probe.wait(timeout=60)
    except docker.errors.APIError:
        return False
    finally:
        probe.remove(force=True)
    return True


def run_mounting_vol(env: Env, job: Path) -> None:
    """`driversdk run` of ``job``, its plugin group and an app group mounting CSI volume "vol"
    as "data": fails unless the run succeeds, the plugin becomes healthy, the volume is mounted, and it
    is unmounted and released before the plugin task stops."""
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert '==> task "plugin": Plugin became healthy: plugin: hostpath' in out
    assert '==> volume "data": CSI volume "vol" mounted at ' in out
    assert '==> volume "data": CSI volume "vol" unmounted and released' in out
    assert out.index("unmounted and released") < out.index('==> task "plugin" stopping'), "app first, plugin last"


def purge_job(process: AgentProcess, job: str) -> None:
    """``job`` purged through the agent's API (when it is there); fails unless it leaves the job list within 120 s."""
    client = process.client()
    if any(j["ID"] == job for j in client.get("/v1/jobs") or []):
        client.request("DELETE", f"/v1/job/{job}", {"purge": "true"})
    deadline = time.monotonic() + 120
    while any(j["ID"] == job for j in client.get("/v1/jobs") or []):
        assert time.monotonic() < deadline, process.log()
        time.sleep(0.1)


@contextmanager
def running_csi_agent(work: Path) -> Iterator[tuple[Env, AgentProcess]]:
    """An agent started on a CSI env made in ``work``; on the way out the "app" job is purged first
    (its volume is unpublished through the plugin before the plugin goes), the agent is closed, and
    nothing of the env may be left (``Env.assert_clean``)."""
    env = make_env(docker.from_env(timeout=30), work)
    process = AgentProcess(env.data, config=env.client).start()
    try:
        yield env, process
    finally:
        try:
            if process.proc is not None and process.proc.poll() is None:
                purge_job(process, "app")
        finally:
            process.close()
        env.assert_clean()
