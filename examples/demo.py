#!/usr/bin/env python3
"""The README demo: the reference CSI plugin runs as an exec task (``csi_plugin``), a registered
volume is claimed, staged and published through it, and a docker task mounts it with
host-to-task propagation, all through ``driversdk validate`` / ``volume register`` / ``run``.

Run it with hack/demo.sh (which installs what is needed); it cleans up after itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "jobs" / "csi-demo.hcl"
VOLUME = ROOT / "examples" / "volumes" / "demo-volume.hcl"
EXEC_CAPS = ["audit_write", "chown", "dac_override", "fowner", "fsetid", "kill", "mknod", "net_bind_service",
             "setfcap", "setgid", "setpcap", "setuid", "sys_chroot", "sys_admin"]  # fmt: skip
CHROOT = ["/bin", "/etc", "/lib", "/lib32", "/lib64", "/sbin", "/usr"]
# The CSI plugin task mounts, so it runs as root, which the exec plugin refuses unless told.
ROOT_TASKS = 'denied_host_uids = ""\n    denied_host_gids = ""'


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def driversdk(*args: str, check: bool = True) -> int:
    print("$ driversdk " + " ".join(args), flush=True)
    code = subprocess.run([sys.executable, "-m", "driversdk.cli", *args], cwd=ROOT).returncode
    if check and code != 0:
        raise SystemExit(f"driversdk {args[0]} failed with exit code {code}")
    return code


def hcl_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def client_config(work: Path, *, docker_extra: str = "", exec_extra: str = "", extra: str = "") -> Path:
    """A client with a host volume for the plugin's backing store, and an exec plugin that may
    give the plugin task sys_admin (it mounts) with this Python installation in its chroot.
    The tests add their own settings through the ``*_extra`` strings."""
    python_dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, str(ROOT))}
    chroot = CHROOT + sorted(d for d in python_dirs if not any(d.startswith(c + "/") for c in CHROOT))
    path = work / "client.hcl"
    path.write_text(
        f"""data_dir = "{work / "data"}"

client {{
  host_volume "csi-backing" {{
    path = "{work / "backing"}"
  }}
}}

plugin "docker" {{
  config {{
    {docker_extra}
    gc {{
      image = false
    }}
  }}
}}

plugin "exec" {{
  config {{
    allow_caps = {hcl_list(EXEC_CAPS)}
    chroot_env = {hcl_list(chroot)}
    {exec_extra}
  }}
}}
{extra}
"""
    )
    return path


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="driversdk-demo-", dir="/tmp"))  # short: socket paths
    try:
        # The volume already exists in the plugin's backing store; we register it, as one
        # registers an existing disk with `nomad volume register`.
        (work / "backing" / "volumes" / "demo-volume").mkdir(parents=True)
        client = str(client_config(work, exec_extra=ROOT_TASKS))
        job = work / "csi-demo.hcl"
        job.write_text(JOB.read_text().replace('"/usr/bin/python3"', f'"{os.path.realpath(sys.executable)}"'))

        step("validate before anything starts: the CSI volume is not registered yet")
        driversdk("validate", str(job), "--client", client, check=False)

        step("register the volume, then validate again")
        driversdk("volume", "register", str(VOLUME), "--client", client)
        driversdk("validate", str(job), "--client", client)

        step("run the job: plugin task -> healthy -> registered; volume claimed, staged, published, mounted")
        driversdk("run", str(job), "--client", client)

        step("what the task wrote landed in the plugin's backing store on the host")
        print((work / "backing" / "volumes" / "demo-volume" / "written-by-app").read_text().strip())

        step("the task's view of /data (master:N = host-to-task, rslave) and the run's record")
        driversdk("logs", "app", "--client", client)
        driversdk("status", "--client", client)
        driversdk("volume", "status", "demo-volume", "--client", client)

        left = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(work) in line]
        step(f"left behind: {len(left)} mount(s), claims released, plugin deregistered")
        driversdk("plugin", "status", "--client", client)
        return 0 if not left else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
