#!/usr/bin/env python3
"""The README demo: the reference CSI plugin runs as an exec task (``csi_plugin``), a registered
volume is claimed, staged and published through it, and a docker task mounts it with
host-to-task propagation, all through ``driversdk validate`` / ``volume register`` / ``run``.

It runs the driversdk installed with the interpreter that runs this file (a venv's, or the
system's): ``/opt/venv/bin/python examples/demo.py``. Nothing is imported from the checkout, and
nothing is installed: it needs driversdk with its ``all`` extra, a Docker engine, runc and the
image driversdk-test/busybox:local (``hack/build-test-images.sh busybox``). Everything it makes
(client config, data dir, the plugin's backing store) is in one temp dir it removes at the end.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
JOB = EXAMPLES / "jobs" / "csi-demo.hcl"
VOLUME = EXAMPLES / "volumes" / "demo-volume.hcl"
EXEC_CAPS = ["audit_write", "chown", "dac_override", "fowner", "fsetid", "kill", "mknod", "net_bind_service",
             "setfcap", "setgid", "setpcap", "setuid", "sys_chroot", "sys_admin"]  # fmt: skip
CHROOT = ["/bin", "/etc", "/lib", "/lib32", "/lib64", "/sbin", "/usr"]
# The CSI plugin task mounts, so it runs as root, which the exec plugin refuses unless told.
ROOT_TASKS = 'denied_host_uids = ""\n    denied_host_gids = ""'


def installed(name: str) -> Path:
    """An executable the driversdk install beside this interpreter provides (its console scripts
    are in the interpreter's own bin dir; a venv's even when it is not activated)."""
    here = Path(sys.executable).parent / name
    found = str(here) if os.access(here, os.X_OK) else shutil.which(name)
    if found is None:
        raise SystemExit(
            f"{name} is not installed for {sys.executable}; install driversdk with its all extra "
            "(pip install '<checkout>[all]' or the built wheel) into this interpreter's environment"
        )
    return Path(found)


def python_dirs() -> list[str]:
    """What the plugin task must see to run: this installation (a venv's directory and the Python it
    was made from) and, for an editable install, the source tree driversdk is imported from."""
    spec = importlib.util.find_spec("driversdk")
    if spec is None or spec.origin is None:
        raise SystemExit(f"driversdk is not installed for {sys.executable}; install it with its all extra")
    source = Path(spec.origin).resolve().parents[1]
    found = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, str(source))}
    # Parents only: a dir below another one listed (or below CHROOT) comes with it.
    kept = [d for d in sorted(found) if not any(d.startswith(c + "/") for c in (*CHROOT, *found) if c != d)]
    return [d for d in kept if d not in CHROOT]


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def driversdk(*args: str, check: bool = True) -> int:
    print("$ driversdk " + " ".join(args), flush=True)
    # From / : nothing of the current directory (a checkout) can be imported by the CLI.
    code = subprocess.run([str(installed("driversdk")), *args], cwd="/").returncode
    if check and code != 0:
        raise SystemExit(f"driversdk {args[0]} failed with exit code {code}")
    return code


def hcl_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def client_config(work: Path, *, docker_extra: str = "", exec_extra: str = "", extra: str = "") -> Path:
    """A client with a host volume for the plugin's backing store, and an exec plugin that may
    give the plugin task sys_admin (it mounts) with this Python installation in its chroot.
    The tests add their own settings through the ``*_extra`` strings."""
    chroot = CHROOT + python_dirs()
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
        job = str(JOB)
        plugin = f"csi_plugin_command={installed('driversdk-csi-hostpath')}"

        step("validate before anything starts: the CSI volume is not registered yet")
        driversdk("validate", job, "--client", client, "-var", plugin, check=False)

        step("register the volume, then validate again")
        driversdk("volume", "register", str(VOLUME), "--client", client)
        driversdk("validate", job, "--client", client, "-var", plugin)

        step("run the job: plugin task -> healthy -> registered; volume claimed, staged, published, mounted")
        driversdk("run", job, "--client", client, "-var", plugin)

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
