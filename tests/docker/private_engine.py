"""A private Docker engine for tests that must stop and start dockerd.

The machine's shared dockerd serves every engineer's tests at once, so no test may stop it.
A test that needs an engine to go away starts its own here: a second dockerd with its own
socket, data root, exec root (and so its own managed containerd, which dockerd starts when
``--containerd`` is not given), no bridge and no iptables rules, so nothing it does touches
the shared engine's networks or containers.

Whatever happens in the test, ``private_engine()`` stops that dockerd, its containerd and any
container shim of theirs (by pid, found through their command lines naming our directory),
lazily unmounts whatever is left under the directory, and removes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import docker

from driversdk.mountinfo import read_mountinfo


class PrivateEngineError(RuntimeError):
    pass


def unavailable() -> str | None:
    """Why no private engine can run here (a reason to skip), or None."""
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    for tool in ("dockerd", "containerd", "docker"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    return not _pid_alive(pid)


class PrivateEngine:
    """One private dockerd under ``root`` (a short path: unix socket paths are limited to 108 bytes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "d.sock"
        self.endpoint = f"unix://{self.socket}"
        self.data_root = root / "data"
        self.exec_root = root / "exec"
        self.pidfile = root / "docker.pid"
        self.log_path = root / "dockerd.log"
        self.config_file = root / "daemon.json"
        self._proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        # Its own network namespace: a dockerd started with --bridge none deletes the host's
        # docker0 at start-up, which breaks the shared engine's containers (seen: "could not
        # find bridge docker0"). The unix socket is a file, so it is reachable from outside.
        return [
            "unshare",
            "--net",
            "--",
            "dockerd",
            "--host",
            self.endpoint,
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.exec_root),
            "--pidfile",
            str(self.pidfile),
            # Our own (empty) config file, so a daemon.json written for the shared engine
            # (hosts, data-root, ...) can never be read by this one and clash with it.
            "--config-file",
            str(self.config_file),
            "--bridge",
            "none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
        ]

    def start(self, timeout: float = 60.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            raise PrivateEngineError("the private dockerd is already running")
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text("{}\n")
        with open(self.log_path, "ab") as log:
            # Its own session: a Ctrl-C on the test run must not reach it before cleanup does.
            self._proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise PrivateEngineError(f"the private dockerd exited with {self._proc.returncode}: {self.log_tail()}")
            if self.answers():
                return
            time.sleep(0.2)
        raise PrivateEngineError(f"the private dockerd did not answer within {timeout:.0f}s: {self.log_tail()}")

    def answers(self) -> bool:
        try:
            api = docker.APIClient(base_url=self.endpoint, timeout=5)
            try:
                return bool(api.ping())
            finally:
                api.close()
        except Exception:
            return False

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM, as an operator's `systemctl stop docker` does; waits for dockerd to exit."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.endpoint, timeout=60)

    def load_images(self, images: Sequence[str]) -> None:
        """Copy images from the shared engine: `docker save | docker -H <ours> load`."""
        for image in images:
            save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert save.stdout is not None
            load = subprocess.run(
                ["docker", "-H", self.endpoint, "load", "-q"], stdin=save.stdout, capture_output=True, timeout=300
            )
            save.stdout.close()
            _, save_err = save.communicate(timeout=300)
            if save.returncode != 0 or load.returncode != 0:
                raise PrivateEngineError(
                    f"copying {image} into the private engine failed: {save_err.decode(errors='replace')}"
                    f"{load.stderr.decode(errors='replace')}"
                )

    def log_tail(self, lines: int = 20) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # --- cleanup -------------------------------------------------------------------------------

    def _our_pids(self) -> list[int]:
        """dockerd, its containerd and the shims: every process whose command line names our root."""
        marker = str(self.root).encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdline = fh.read()
            except OSError:
                continue
            if marker in cmdline:
                found.append(int(entry))
        return found

    def close(self) -> None:
        """Stop everything of ours and remove the directory; safe to call at any point."""
        with contextlib.suppress(Exception):
            self.stop(timeout=60)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        # A containerd or shim that outlived dockerd (dockerd was killed, or is stuck): TERM, then KILL.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self._our_pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            for pid in pids:
                _wait_gone(pid, 10)
        self.unmount_all()
        shutil.rmtree(self.root, ignore_errors=True)
        if self.root.exists():
            # Something is still mounted or busy: unmount once more and retry.
            self.unmount_all()
            shutil.rmtree(self.root, ignore_errors=True)

    def mounts(self) -> list[str]:
        prefix = str(self.root).rstrip("/") + "/"
        return [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(prefix)]

    def unmount_all(self) -> None:
        # Deepest first, lazily: an overlay or netns mount left by a killed engine must not
        # keep the directory (or the test run) alive.
        for point in sorted(set(self.mounts()), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)

    def left_behind(self) -> list[str]:
        """What close() should have removed: processes, mounts, the directory."""
        left = [f"process {pid}" for pid in self._our_pids()]
        left += [f"mount {m}" for m in self.mounts()]
        if self.root.exists():
            left.append(f"directory {self.root}")
        return left


@contextlib.contextmanager
def private_engine(images: Sequence[str] = ()) -> Iterator[PrivateEngine]:
    """A running private dockerd with ``images`` copied in; everything of it gone afterwards."""
    # Under /tmp and short: the socket path must fit in sun_path.
    root = Path(tempfile.mkdtemp(prefix="dkr-", dir="/tmp"))
    engine = PrivateEngine(root)
    try:
        engine.start()
        engine.load_images(images)
        yield engine
    finally:
        engine.close()


def checked_private_engine(images: Sequence[str] = ()) -> Iterator[PrivateEngine]:
    """The body of a pytest fixture: skip where no private engine can run, yield one with
    ``images``, and fail the test if anything of it is left afterwards."""
    import pytest

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with private_engine(images) as engine:
        yield engine
    assert not engine.left_behind(), f"the private engine left: {engine.left_behind()}"
