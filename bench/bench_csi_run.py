#!/usr/bin/env python3
"""A claiming docker job run, end to end, beside its floor: the same CSI RPCs made raw over gRPC
plus `docker run --rm` of the same container, measured in the same run and interleaved.

The reference CSI plugin runs as an exec task with ``csi_plugin`` in a `driversdk run` of its own
(started once, kept running, as a plugin job is on a Nomad client). Each round then times:

* ours: `driversdk run app.hcl` of a one-task docker job that claims a registered CSI volume:
  load the job, claim, controller-publish, stage, publish, start the container with the volume
  mounted, wait, then unpublish, unstage, controller-unpublish and release the claim.
* the floor: Probe, ControllerPublishVolume, NodeStageVolume, NodePublishVolume on the plugin's
  socket (a fresh connection), `docker run --rm -v <published path>:/data` of the same container,
  then NodeUnpublishVolume, NodeUnstageVolume, ControllerUnpublishVolume.

A further line times a job that carries its plugin task too (`driversdk run` of plugin + app):
the plugin's start, its first health probe and registration are then on the run's path.

``--via`` chooses how ours runs (default ``both``, the bare block then the agent's):

* ``bare``: as above, `driversdk run app.hcl --client …` with no agent, everything in its own
  process (the plugin in a `driversdk run` of its own).
* ``agent``: as an operator runs it on a Nomad client: one `driversdk agent -config <client>
  -data-dir <dir>` kept running, the plugin job left with it (`driversdk run -detach`, then waited
  for until GET /v1/plugin/csi/hostpath says healthy), the volume registered through it
  (`driversdk volume register`, NOMAD_ADDR set), and each round times `driversdk run app.hcl`
  submitted to it (followed until its allocation is over) beside the same floor. How long after
  that command's exit the agent still held the volume's claim is printed too; each round waits
  (untimed) for the claim to be gone. The jobs are stopped and purged and the agent stopped
  (SIGTERM) whatever happens.

The goal (issue 29 deliverable 3): ours at most GOAL_RATIO times the floor, printed beside it.
Nothing may be left behind: a process, container or mount of the bench's directory after the end
is reported (exit 1), and the directory is then kept rather than removed through a mount.

Run as root (needs hack/docker-up.sh and hack/build-test-images.sh):
    python3 bench/bench_csi_run.py [--runs N] [--via bare|agent|both]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.agent.csi.registry import PluginRegistry  # noqa: E402
from driversdk.agent.csi.state import StateStore  # noqa: E402
from driversdk.cli.apiclient import AgentClient, APIRequestError  # noqa: E402
from driversdk.csi.client import CSIClient  # noqa: E402
from driversdk.csi.model import AccessMode, AttachmentMode, VolumeCapability  # noqa: E402
from driversdk.pb import csi_pb2  # noqa: E402

IMAGE = "driversdk-test/busybox:local"
SCRIPT = "echo hello > /data/greeting"
GOAL_RATIO = 1.5
# As bench_run.py: bytecode written by the warm-up round, parser caches filled by it. NOMAD_* of the
# caller's shell would send our commands to another agent: each mode sets its own.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("NOMAD_")} | {
    "PYTHONPATH": str(ROOT)
}
CLI = [sys.executable, "-m", "driversdk.cli"]
CACHE_ENV = "DRIVERSDK_CACHE_DIR"
CALL_LOG = "calls.log"  # the plugin's timed call log, in its backing dir (<work>/backing)
# Paths as the plugin task sees them (its stage_publish_base_dir is /local/csi).
TASK_BASE = "/local/csi"
PLUGIN_JOB = "plugin"


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("driversdk_demo", ROOT / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plugin_group(call_log: str = "") -> str:
    timed_log = (
        f'CSI_HOSTPATH_CALL_LOG = "/srv/csi/{call_log}"\n        CSI_HOSTPATH_CALL_TIMES = "1"' if call_log else ""
    )
    return f"""
  group "storage" {{
    volume "backing" {{
      type   = "host"
      source = "csi-backing"
    }}
    task "plugin" {{
      driver = "exec"
      user   = "root"
      kill_timeout = "2s"
      config {{
        command = "{os.path.realpath(sys.executable)}"
        args    = ["-m", "driversdk.csi.hostpath"]
        cap_add = ["sys_admin"]
      }}
      env {{
        CSI_HOSTPATH_ROOT = "/srv/csi"
        PYTHONPATH = "{ROOT}"
        {timed_log}
      }}
      volume_mount {{
        volume      = "backing"
        destination = "/srv/csi"
      }}
      csi_plugin {{
        id   = "hostpath"
        type = "monolith"
      }}
    }}
  }}"""


def app_group(volume: bool = True) -> str:
    mount = (
        '\n      volume_mount {\n        volume      = "data"\n        destination = "/data"\n      }' if volume else ""
    )
    request = (
        '\n    volume "data" {\n      type            = "csi"\n      source          = "vol"\n'
        '      access_mode     = "single-node-writer"\n      attachment_mode = "file-system"\n    }'
        if volume
        else ""
    )
    script = SCRIPT if volume else SCRIPT.replace("/data/", "/tmp/")
    return f"""
  group "app" {{{request}
    task "app" {{
      driver = "docker"
      config {{
        image   = "{IMAGE}"
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}{mount}
    }}
  }}"""


def write_job(work: Path, name: str, job_type: str, *groups: str) -> Path:
    path = work / f"{name}.hcl"
    path.write_text(f'job "{name}" {{\n  type = "{job_type}"\n' + "".join(groups) + "\n}\n")
    return path


def timed(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stdout}{done.stderr}")
    return elapsed


def wait_registered(db: str, timeout: float = 60) -> tuple[str, str]:
    """The plugin's socket path and its host mount root, once its run registered it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(db):
            store = StateStore(db)
            try:
                reg = PluginRegistry(store).current("csi-node", "hostpath")
            finally:
                store.close()
            if reg is not None:
                return reg.socket_path, reg.options["MountPoint"]
        time.sleep(0.1)
    raise SystemExit("the plugin job never registered its plugin")


def listening_to_probe(log: Path) -> float:
    """From the plugin's timed call log of one run: how long after its socket began to accept the
    first Probe came; the log is emptied for the next run."""
    lines = [line.split("\t") for line in log.read_text().splitlines()]
    log.unlink()
    listening = next(float(t) for name, t in lines if name == "listening")
    probe = next(float(t) for name, t in lines if name == "Probe")
    return probe - listening


def floor_round(socket_path: str, host_root: str, node_id: str) -> float:
    """The raw RPCs of a claim and its release, around `docker run --rm` of the same container."""
    cap = VolumeCapability(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.FILE_SYSTEM).to_proto()
    stage, target = f"{TASK_BASE}/raw/staging", f"{TASK_BASE}/raw/target"
    start = time.perf_counter()
    os.makedirs(f"{host_root}/raw/staging", exist_ok=True)  # the CO makes the staging path, as ours does
    client = CSIClient(socket_path)
    try:
        client.identity.Probe(csi_pb2.ProbeRequest())
        published = client.controller.ControllerPublishVolume(
            csi_pb2.ControllerPublishVolumeRequest(volume_id="vol", node_id=node_id, volume_capability=cap)
        )
        context = dict(published.publish_context)
        client.node.NodeStageVolume(
            csi_pb2.NodeStageVolumeRequest(
                volume_id="vol", staging_target_path=stage, volume_capability=cap, publish_context=context
            )
        )
        client.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id="vol", staging_target_path=stage, target_path=target, volume_capability=cap,
                publish_context=context,
            )
        )  # fmt: skip
        docker = ["docker", "run", "--rm", "-v", f"{host_root}/raw/target:/data", IMAGE, "/bin/sh", "-c", SCRIPT]
        done = subprocess.run(docker, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"docker run failed: {done.stderr}")
        client.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol", target_path=target))
        client.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(volume_id="vol", staging_target_path=stage))
        client.controller.ControllerUnpublishVolume(
            csi_pb2.ControllerUnpublishVolumeRequest(volume_id="vol", node_id=node_id)
        )
    finally:
        client.close()
    return time.perf_counter() - start


@dataclass
class Setup:
    """What both modes share: the bench's directory, client config, volume file and job files."""

    work: Path
    client: str
    volume: Path
    app: Path
    plain: Path
    both: Path
    plugin: Path

    @property
    def greeting(self) -> Path:
        return self.work / "backing" / "volumes" / "vol" / "greeting"


def ran_through_volume(setup: Setup, run: Callable[[], float]) -> float:
    """One timed run of the app job, checked to have written through the volume (the floor writes
    the same file, so it is removed first, untimed)."""
    setup.greeting.unlink(missing_ok=True)
    elapsed = run()
    if not setup.greeting.exists() or setup.greeting.read_text() != "hello\n":
        raise SystemExit("the app did not write through the volume: the run did not really happen")
    return elapsed


def node_id_of(socket_path: str) -> str:
    probe = CSIClient(socket_path)
    try:
        return probe.node_info().node_id
    finally:
        probe.close()


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.0f} ms"


def ratio_lines(ours: list[float], floor: list[float], label: str) -> float:
    ratio = statistics.median(ours) / statistics.median(floor)
    print(f"  floor: raw RPCs + docker run --rm   {median_ms(floor)}")
    print(f"  {label:<35}{median_ms(ours)}")
    print(f"  ratio ours / floor                  {ratio:8.2f}     goal <= {GOAL_RATIO:.2f}  {verdict(ratio)}")
    print("  per-round ratios                    " + " ".join(f"{o / f:.2f}" for o, f in zip(ours, floor, strict=True)))
    return ratio


# --- bare: no agent, each command runs everything in its own process ------------------------------


def bench_bare(setup: Setup, runs: int) -> float:
    cli = [*CLI, "run"]
    client = ["--client", setup.client]
    work = setup.work
    # Its own TMPDIR: a dev agent elsewhere on the machine (found by its socket under the temp dir)
    # would otherwise be given the job.
    env = ENV | {"TMPDIR": str(work / "tmp")}
    (work / "tmp").mkdir(exist_ok=True)
    timed([*CLI, "volume", "register", str(setup.volume), *client], env)
    ours_cmd = [*cli, str(setup.app), *client]
    plain_cmd = [*cli, str(setup.plain), *client]
    both_cmd = [*cli, str(setup.both), *client]
    plugin_run: subprocess.Popen[str] | None = None
    try:
        # The plugin and the app in one job: the plugin stops at the end of the run.
        timed(both_cmd, env)  # warm-up
        plugin_run = subprocess.Popen(
            [*cli, str(setup.plugin), *client], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, text=True
        )
        socket_path, host_root = wait_registered(str(work / "data" / "state.db"))
        node_id = node_id_of(socket_path)
        timed(ours_cmd, env)  # warm-up
        timed(plain_cmd, env)
        floor_round(socket_path, host_root, node_id)
        ours, floor, plain_runs = [], [], []
        for _ in range(runs):
            floor.append(floor_round(socket_path, host_root, node_id))
            ours.append(ran_through_volume(setup, lambda: timed(ours_cmd, env)))
            plain_runs.append(timed(plain_cmd, env))
        plugin_run.send_signal(signal.SIGINT)
        plugin_run.wait(60)
        plugin_run = None
        both_runs, first_probe = [], []
        for _ in range(max(1, runs // 2)):
            both_runs.append(timed(both_cmd, env))
            first_probe.append(listening_to_probe(work / "backing" / CALL_LOG))
    finally:
        if plugin_run is not None:
            plugin_run.send_signal(signal.SIGINT)
            plugin_run.wait(60)
    median = statistics.median
    print(f"bare: a docker job claiming a CSI volume, {runs} interleaved rounds (median)")
    ratio = ratio_lines(ours, floor, "driversdk run app.hcl (no agent)")
    print("  (the plugin running in another `driversdk run`)")
    print(
        f"  driversdk run plain.hcl             {median_ms(plain_runs)}  (the same docker job without "
        f"the volume: the CSI part of ours is {(median(ours) - median(plain_runs)) * 1000:.0f} ms)"
    )
    print(
        f"  driversdk run plugin+app            {median_ms(both_runs)}  "
        f"(median of {len(both_runs)}, after the rounds: the plugin task started, probed and registered in the run)"
    )
    print(
        f"  plugin socket listening -> 1st Probe {median(first_probe) * 1000:8.0f} ms  (as the plugin recorded them; "
        "each: " + " ".join(f"{t * 1000:.0f}" for t in first_probe) + " ms)"
    )
    return ratio


# --- agent: one `driversdk agent` kept running, the commands submit to it --------------------------


class Agent:
    """``driversdk agent -config <client> -data-dir <dir>``, as an operator keeps one running. Not
    -dev: its SIGTERM leaves tasks running by design, so :meth:`stop` purges every job first."""

    def __init__(self, setup: Setup) -> None:
        self.data = setup.work / "agent"
        self.config = setup.client
        self.log = setup.work / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"unix://{self.data / 'agent.sock'}"

    def client(self) -> AgentClient:
        return AgentClient(self.address, timeout=120)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def start(self) -> None:
        self.data.mkdir(mode=0o700)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*CLI, "agent", "-config", self.config, "-data-dir", str(self.data)],
                cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the agent exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                self.client().get("/v1/agent/self")
                return
            except Exception:
                time.sleep(0.05)
        raise SystemExit(f"the agent did not answer within 60 s:\n{self.tail()}")

    def wait_plugin_healthy(self, plugin_id: str, timeout: float = 60) -> None:
        """GET /v1/plugin/csi/:id until its controller and node instances are there and healthy."""
        client = self.client()
        deadline = time.monotonic() + timeout
        seen: Any = None
        while time.monotonic() < deadline:
            try:
                seen = client.get(f"/v1/plugin/csi/{plugin_id}")
            except APIRequestError as err:
                if err.status != 404:
                    raise
            else:
                instances = [*(seen.get("Controllers") or {}).values(), *(seen.get("Nodes") or {}).values()]
                if len(instances) == 2 and all(i.get("Healthy") for i in instances):
                    return
            time.sleep(0.05)
        raise SystemExit(f"plugin {plugin_id} was not healthy within {timeout:.0f} s: {seen}\n{self.tail()}")

    def claims(self, volume_id: str) -> int:
        volume = self.client().get(f"/v1/volume/csi/{volume_id}")
        return len(volume.get("ReadAllocs") or {}) + len(volume.get("WriteAllocs") or {})

    def wait_released(self, volume_id: str, timeout: float = 60) -> float:
        """Seconds until the volume has no claim (0 when it had none already)."""
        start = time.perf_counter()
        deadline = time.monotonic() + timeout
        while self.claims(volume_id):
            if time.monotonic() > deadline:
                raise SystemExit(f"the agent still holds a claim on {volume_id} after {timeout:.0f} s\n{self.tail()}")
            time.sleep(0.01)
        return time.perf_counter() - start

    def purge(self, client: AgentClient, jobs: list[str], timeout: float = 120) -> None:
        for job in jobs:
            client.request("DELETE", f"/v1/job/{job}", {"purge": "true"})
        deadline = time.monotonic() + timeout
        while left := [j["ID"] for j in client.get("/v1/jobs") or [] if j["ID"] in jobs]:
            if time.monotonic() > deadline:
                raise SystemExit(f"the agent still lists {left} {timeout:.0f} s after their purge:\n{self.tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Every job stopped and purged, the plugin's last (a claim is released through it), each
        waited for until the agent lists it no more; then SIGTERM."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            client = self.client()
            jobs = [str(j["ID"]) for j in client.get("/v1/jobs") or []]
            self.purge(client, [j for j in jobs if j != PLUGIN_JOB])
            self.purge(client, [j for j in jobs if j == PLUGIN_JOB])
        except (Exception, SystemExit) as err:
            print(f"stopping the agent's jobs through its API failed: {err}\n{self.tail()}", file=sys.stderr)
        finally:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def bench_agent(setup: Setup, runs: int) -> float:
    agent = Agent(setup)
    env = ENV | {"NOMAD_ADDR": agent.address}
    try:
        agent.start()
        begin = time.perf_counter()
        timed([*CLI, "run", "-detach", str(setup.plugin)], env)
        agent.wait_plugin_healthy("hostpath")
        to_healthy = time.perf_counter() - begin
        timed([*CLI, "volume", "register", str(setup.volume)], env)
        socket_path, host_root = wait_registered(str(agent.data / "state.db"))
        node_id = node_id_of(socket_path)
        ours_cmd = [*CLI, "run", str(setup.app)]
        plain_cmd = [*CLI, "run", str(setup.plain)]
        timed(ours_cmd, env)  # warm-up: the agent's docker plugin has served a task, bytecode is written
        agent.wait_released("vol")
        timed(plain_cmd, env)
        floor_round(socket_path, host_root, node_id)
        ours, floor, plain_runs, held = [], [], [], []
        for _ in range(runs):
            floor.append(floor_round(socket_path, host_root, node_id))
            ours.append(ran_through_volume(setup, lambda: timed(ours_cmd, env)))
            held.append(agent.wait_released("vol"))
            plain_runs.append(timed(plain_cmd, env))
        jobs = {j["ID"]: j["Status"] for j in agent.client().get("/v1/jobs") or []}
        if jobs.get(PLUGIN_JOB) != "running" or jobs.get("app") != "dead":
            raise SystemExit(f"the agent's jobs are not as the rounds left them: {jobs}")
    finally:
        agent.stop()
    median = statistics.median
    print(f"via agent: the same, {runs} interleaved rounds (median), submitted to a running `driversdk agent`")
    ratio = ratio_lines(ours, floor, "driversdk run app.hcl (NOMAD_ADDR)")
    print("  (the plugin job left with the agent; the command parses nothing, the agent runs the job)")
    print(
        f"  driversdk run plain.hcl             {median_ms(plain_runs)}  (the same docker job without "
        f"the volume: the CSI part of ours is {(median(ours) - median(plain_runs)) * 1000:.0f} ms)"
    )
    print(
        f"  claim still held after run's exit   {median_ms(held)}  (max {max(held) * 1000:.0f} ms; waited for, "
        "untimed, before the next round)"
    )
    released = median([o + h for o, h in zip(ours, held, strict=True)]) / median(floor)
    print(f"  ratio with the claim's release      {released:8.2f}     (run + claim held, per round, over the floor)")
    print(f"  run -detach plugin.hcl -> healthy   {to_healthy * 1000:8.0f} ms  (once, GET /v1/plugin/csi/hostpath)")
    return ratio


# --- what the bench leaves behind ------------------------------------------------------------------


def _unescape(field: str) -> str:
    """A mountinfo path field: spaces and the like are written as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def leftovers(work: Path) -> list[str]:
    """Mounts under the bench's directory, processes rooted, working or named in it, and docker
    containers mounting from it."""
    prefix = str(work) + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if (point + "/").startswith(prefix):
            found.append(f"mount {point}")
    for name in filter(str.isdigit, os.listdir("/proc")):
        if int(name) == os.getpid():
            continue
        try:
            places = [os.readlink(f"/proc/{name}/root"), os.readlink(f"/proc/{name}/cwd")]
            command = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone, or a kernel thread
        if any((p + "/").startswith(prefix) for p in places) or str(work) in command:
            found.append(f"process {name} ({command.strip()[:120]})")
    ids = subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True).stdout.split()
    if ids:
        listing = subprocess.run(
            ["docker", "inspect", "--format", "{{.Name}} {{range .Mounts}}{{.Source}} {{end}}", *ids],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        for line in listing.splitlines():
            name, *sources = line.split()
            if any((s + "/").startswith(prefix) for s in sources):
                found.append(f"container {name}")
    return found


def settled_leftovers(work: Path, timeout: float = 10) -> list[str]:
    """Leftovers that are still there after a short grace (a stopped task's process may take a moment)."""
    deadline = time.monotonic() + timeout
    while (found := leftovers(work)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


# --- main --------------------------------------------------------------------------------------------


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the plugin mounts and the exec driver runs runc")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--via", choices=("bare", "agent", "both"), default="both", help="how ours runs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dsx-csirun-", dir="/tmp"))  # short: socket paths
    ENV[CACHE_ENV] = str(work / "cache")
    ratios: dict[str, float] = {}
    try:
        demo = load_demo()
        (work / "backing" / "volumes" / "vol").mkdir(parents=True)
        spec = work / "vol.hcl"
        spec.write_text(
            'id = "vol"\nplugin_id = "hostpath"\nexternal_id = "vol"\n'
            'capability {\n  access_mode = "single-node-writer"\n  attachment_mode = "file-system"\n}\n'
        )
        setup = Setup(
            work=work,
            client=str(demo.client_config(work, exec_extra=demo.ROOT_TASKS)),
            volume=spec,
            app=write_job(work, "app", "batch", app_group()),
            plain=write_job(work, "plain", "batch", app_group(volume=False)),
            both=write_job(work, "both", "batch", plugin_group(CALL_LOG), app_group()),
            plugin=write_job(work, PLUGIN_JOB, "service", plugin_group()),
        )
        if args.via in ("bare", "both"):
            ratios["bare"] = bench_bare(setup, args.runs)
        if args.via in ("agent", "both"):
            ratios["via agent"] = bench_agent(setup, args.runs)
    finally:
        left = settled_leftovers(work)
        if left:
            print(f"left behind (the directory {work} is kept):\n  " + "\n  ".join(left), file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if len(ratios) > 1:
        print("  ".join(f"{name} {r:.2f}x ({verdict(r)})" for name, r in ratios.items()) + f"  goal <= {GOAL_RATIO}")
    if left:
        raise SystemExit(1)


def verdict(ratio: float) -> str:
    return "met" if ratio <= GOAL_RATIO else "NOT met"


if __name__ == "__main__":
    main()
