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

The goal (issue 29 deliverable 3): ours at most GOAL_RATIO times the floor, printed beside it.

Run as root (needs hack/docker-up.sh and hack/build-test-images.sh): python3 bench/bench_csi_run.py [--runs N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.csi.client import CSIClient  # noqa: E402
from driversdk.csi.model import AccessMode, AttachmentMode, VolumeCapability  # noqa: E402
from driversdk.csi.registry import PluginRegistry  # noqa: E402
from driversdk.csi.state import StateStore  # noqa: E402
from driversdk.pb import csi_pb2  # noqa: E402

IMAGE = "driversdk-test/busybox:local"
SCRIPT = "echo hello > /data/greeting"
GOAL_RATIO = 1.5
# As bench_run.py: bytecode written by the warm-up round, parser caches filled by it.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(ROOT)}
CACHE_ENV = "DRIVERSDK_CACHE_DIR"
CALL_LOG = "calls.log"  # the plugin's timed call log, in its backing dir (<work>/backing)
# Paths as the plugin task sees them (its stage_publish_base_dir is /local/csi).
TASK_BASE = "/local/csi"


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


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=ENV)
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


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the plugin mounts and the exec driver runs runc")
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "driversdk.cli"]
    work = Path(tempfile.mkdtemp(prefix="dsx-csirun-", dir="/tmp"))  # short: socket paths
    ENV[CACHE_ENV] = str(work / "cache")
    plugin_run: subprocess.Popen[str] | None = None
    try:
        demo = load_demo()
        client = str(demo.client_config(work, exec_extra=demo.ROOT_TASKS))
        (work / "backing" / "volumes" / "vol").mkdir(parents=True)
        spec = work / "vol.hcl"
        spec.write_text(
            'id = "vol"\nplugin_id = "hostpath"\nexternal_id = "vol"\n'
            'capability {\n  access_mode = "single-node-writer"\n  attachment_mode = "file-system"\n}\n'
        )
        timed([*cli, "volume", "register", str(spec), "--client", client])
        app = write_job(work, "app", "batch", app_group())
        plain = write_job(work, "plain", "batch", app_group(volume=False))
        both = write_job(work, "both", "batch", plugin_group(CALL_LOG), app_group())
        plugin_job = write_job(work, "plugin", "service", plugin_group())
        ours_cmd = [*cli, "run", str(app), "--client", client]
        plain_cmd = [*cli, "run", str(plain), "--client", client]
        both_cmd = [*cli, "run", str(both), "--client", client]

        # The plugin and the app in one job: the plugin stops at the end of the run.
        timed(both_cmd)  # warm-up
        plugin_run = subprocess.Popen(
            [*cli, "run", str(plugin_job), "--client", client],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, text=True,
        )  # fmt: skip
        socket_path, host_root = wait_registered(str(work / "data" / "state.db"))
        probe = CSIClient(socket_path)
        try:
            node_id = probe.node_info().node_id
        finally:
            probe.close()
        timed(ours_cmd)  # warm-up
        timed(plain_cmd)
        floor_round(socket_path, host_root, node_id)
        ours, floor, plain_runs = [], [], []
        for _ in range(args.runs):
            floor.append(floor_round(socket_path, host_root, node_id))
            ours.append(timed(ours_cmd))
            plain_runs.append(timed(plain_cmd))
        if (work / "backing" / "volumes" / "vol" / "greeting").read_text() != "hello\n":
            raise SystemExit("the app did not write through the volume: the runs did not really happen")
        plugin_run.send_signal(signal.SIGINT)
        plugin_run.wait(60)
        plugin_run = None
        both_runs, first_probe = [], []
        for _ in range(max(1, args.runs // 2)):
            both_runs.append(timed(both_cmd))
            first_probe.append(listening_to_probe(work / "backing" / CALL_LOG))
    finally:
        if plugin_run is not None:
            plugin_run.send_signal(signal.SIGINT)
            plugin_run.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    median = statistics.median
    ratio = median(ours) / median(floor)
    print(f"a docker job claiming a CSI volume, {args.runs} interleaved rounds (median)")
    print(f"  floor: raw RPCs + docker run --rm   {median(floor) * 1000:8.0f} ms")
    print(f"  driversdk run app.hcl               {median(ours) * 1000:8.0f} ms  (plugin running in another run)")
    print(f"  ratio ours / floor                  {ratio:8.2f}     goal <= {GOAL_RATIO:.2f}  {verdict(ratio)}")
    print("  per-round ratios                    " + " ".join(f"{o / f:.2f}" for o, f in zip(ours, floor, strict=True)))
    print(
        f"  driversdk run plain.hcl             {median(plain_runs) * 1000:8.0f} ms  (the same docker job without "
        f"the volume: the CSI part of ours is {(median(ours) - median(plain_runs)) * 1000:.0f} ms)"
    )
    print(
        f"  driversdk run plugin+app            {median(both_runs) * 1000:8.0f} ms  "
        f"(median of {len(both_runs)}, after the rounds: the plugin task started, probed and registered in the run)"
    )
    print(
        f"  plugin socket listening -> 1st Probe {median(first_probe) * 1000:8.0f} ms  (as the plugin recorded them; "
        "each: " + " ".join(f"{t * 1000:.0f}" for t in first_probe) + " ms)"
    )


def verdict(ratio: float) -> str:
    return "met" if ratio <= GOAL_RATIO else "NOT met"


if __name__ == "__main__":
    main()
