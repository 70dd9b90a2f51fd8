#!/usr/bin/env python3
"""The README demo: a driver plugin launched as Nomad would, mounts validated before a start,
and host-to-task propagation seen from inside a real container.

Run it with hack/demo.sh (which installs what is needed); it cleans up after itself.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from driversdk.errors import ConfigError
from driversdk.mounts import MountRequest, check_mounts
from driversdk.testing import AllocDir, DriverHarness

IMAGE = "driversdk-test/busybox:local"


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="driversdk-demo-"))
    shared, private = work / "shared", work / "private"
    mounted: list[Path] = []
    try:
        for path, mode in ((shared, "rshared"), (private, "rprivate")):
            path.mkdir()
            sh("mount", "--bind", str(path), str(path))
            mounted.append(path)
            sh("mount", f"--make-{mode}", str(path))

        step("launch the docker driver plugin through the go-plugin handshake, as a Nomad client does")
        with DriverHarness([sys.executable, "-m", "drivers.docker"], plugin_config={"gc": {"image": False}}) as h:
            info = h.client.plugin_info()
            caps = h.client.capabilities()
            print(f"{info.name} {info.plugin_version}: mount_configs={caps.mount_configs.name}")

            step("validate the task's mounts before anything starts")
            requests = [
                MountRequest("scratch", "/scratch", str(private), propagation="host-to-task"),
                MountRequest("data", "/data", str(shared), propagation="bidirectional", read_only=True),
            ]
            try:
                check_mounts(requests, task="web", driver="docker", mount_configs=int(caps.mount_configs))
            except ConfigError as err:
                for problem in getattr(err, "problems", []):
                    print(f"refused: {problem}")
            good = check_mounts(
                [MountRequest("data", "/data", str(shared), propagation="host-to-task", read_only=True)],
                task="web",
                driver="docker",
                mount_configs=int(caps.mount_configs),
            )
            print(f"accepted: {good[0].task_path} <- {good[0].host_path} ({good[0].propagation.linux})")

            step("start a container with the host-to-task mount, then mount something on the host")
            alloc = AllocDir.create(work, tasks=["web"])
            script = "until [ -f /data/late/hello ]; do sleep 0.1; done; echo task sees: $(cat /data/late/hello)"
            task = alloc.task_config(
                "web", driver_config={"image": IMAGE, "command": "/bin/sh", "args": ["-c", script]}, mounts=good
            )
            h.start(task)
            late = shared / "late"
            late.mkdir()
            sh("mount", "-t", "tmpfs", "tmpfs", str(late))
            mounted.append(late)
            (late / "hello").write_text("mounted on the host after the task started")
            result = h.client.wait_task(task.id, timeout=60)
            time.sleep(0.3)
            print(alloc.stdout("web").decode().strip())
            print(f"exit code {result.exit_code}")
            alloc.close()
        return 0
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        subprocess.run(["rm", "-rf", str(work)], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
