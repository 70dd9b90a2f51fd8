"""The hostpath reference CSI plugin as a real process on a unix socket."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from driversdk.mountinfo import read_mountinfo

NODE_ID = "csi-node-1"


@dataclass
class HostPathPlugin:
    socket: str
    root: str
    process: subprocess.Popen[bytes]
    faults: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def start_plugin(
    socket: str, root: str, faults: str = "", peers: tuple[str, ...] = (), options: tuple[str, ...] = ()
) -> HostPathPlugin:
    """The plugin as a process; ``options`` are further flags (``--alpha``, ``--without X``)."""
    env = dict(os.environ)
    env["CSI_HOSTPATH_FAULTS"] = faults
    env["CSI_HOSTPATH_PEER_NODES"] = ",".join(peers)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "driversdk.csi.hostpath",
            "--endpoint",
            f"unix://{socket}",
            "--root",
            root,
            "--node-id",
            NODE_ID,
            *options,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not os.path.exists(socket):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"hostpath plugin did not start: {proc.stderr.read() if proc.stderr else b''!r}")
        time.sleep(0.05)
    return HostPathPlugin(socket, root, proc, faults)


@pytest.fixture
def plugin_factory(tmp_path: Path) -> Iterator[Callable[..., HostPathPlugin]]:
    started: list[HostPathPlugin] = []

    def make(faults: str = "", options: tuple[str, ...] = ()) -> HostPathPlugin:
        p = start_plugin(str(tmp_path / "plugin" / "csi.sock"), str(tmp_path / "plugin-root"), faults, options=options)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()
    for entry in sorted(read_mountinfo(), key=lambda e: -len(e.mount_point)):
        if entry.mount_point.startswith(str(tmp_path)):
            subprocess.run(["umount", "-l", entry.mount_point], capture_output=True)


@pytest.fixture
def plugin(plugin_factory: Callable[..., HostPathPlugin]) -> HostPathPlugin:
    return plugin_factory()


def mounts_under(path: Path | str) -> list[str]:
    return [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(str(path))]
