"""Test support for driver authors: run any driver plugin over real gRPC, as a host would.

``DriverHarness`` launches the plugin as a subprocess through the go-plugin handshake and
sends SetConfig the way Nomad does; ``AllocDir`` lays out an allocation directory with the
log fifos a Nomad client's logmon would create, and reads them in the background.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from driversdk.errors import PluginCallError
from driversdk.model import AgentConfig, NetworkIsolationSpec, Resources, TaskConfig, TaskHandle
from driversdk.mounts import Mount

if TYPE_CHECKING:
    from driversdk.client import DriverClient

__all__ = ["AllocDir", "DriverHarness", "FifoReader"]

# What a Nomad client sends in SetConfig by default (client_min_port / client_max_port).
NOMAD_DEFAULT_AGENT = AgentConfig(client_min_port=14000, client_max_port=14512)


class FifoReader:
    """Reads one log fifo into memory for as long as it lives, across writer re-opens.

    The fifo is opened read-write so the reader never sees end-of-file when a writer goes away
    (e.g. a plugin restart re-opening it), just as a long-lived log collector must not.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._data = bytearray()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"fifo-{os.path.basename(path)}")
        self._thread.start()

    def _run(self) -> None:
        # poll, not select: a test driving hundreds of tasks holds fds past select's 1024 limit.
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            if chunk:
                with self._cond:
                    self._data.extend(chunk)
                    self._cond.notify_all()

    def data(self) -> bytes:
        with self._cond:
            return bytes(self._data)

    def wait_for(self, needle: bytes, timeout: float) -> bytes:
        """Block until ``needle`` was read; returns everything read. Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while needle not in self._data:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{needle!r} did not appear in {self.path}; got {bytes(self._data)[-500:]!r}")
                self._cond.wait(remaining)
            return bytes(self._data)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        os.close(self._fd)


@dataclass
class AllocDir:
    """An allocation directory laid out as a Nomad client does (driver-protocol §4.8)."""

    path: Path
    alloc_id: str
    readers: dict[str, tuple[FifoReader, FifoReader]] = field(default_factory=dict)

    @classmethod
    def create(cls, base: str | os.PathLike[str], tasks: Sequence[str] = ("task",)) -> AllocDir:
        alloc_id = str(uuid.uuid4())
        root = Path(base) / alloc_id
        for sub in ("alloc/logs", "alloc/tmp", "alloc/data"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        alloc = cls(path=root, alloc_id=alloc_id)
        for task in tasks:
            alloc.add_task(task)
        return alloc

    def add_task(self, task: str, *, log_collection: bool = True) -> None:
        for sub in ("local", "secrets", "private", "tmp"):
            (self.path / task / sub).mkdir(parents=True, exist_ok=True)
        if log_collection:
            out, err = self._fifo_paths(task)
            for fifo in (out, err):
                if not os.path.exists(fifo):
                    os.mkfifo(fifo, 0o600)
            self.readers[task] = (FifoReader(out), FifoReader(err))

    def _fifo_paths(self, task: str) -> tuple[str, str]:
        logs = self.path / "alloc" / "logs"
        return str(logs / f".{task}.stdout.fifo"), str(logs / f".{task}.stderr.fifo")

    def task_config(
        self,
        task: str,
        *,
        driver_config: Mapping[str, Any] | None = None,
        mounts: Sequence[Mount] = (),
        resources: Resources | None = None,
        env: Mapping[str, str] | None = None,
        user: str = "",
        network: NetworkIsolationSpec | None = None,
        job: str = "example",
        group: str = "group",
    ) -> TaskConfig:
        """A TaskConfig as a Nomad client builds it; a fresh id per call (one per start)."""
        if task not in self.readers and not (self.path / task).exists():
            self.add_task(task)
        out, err = self._fifo_paths(task)
        base_env = {
            "NOMAD_ALLOC_ID": self.alloc_id,
            "NOMAD_TASK_NAME": task,
            "NOMAD_GROUP_NAME": group,
            "NOMAD_JOB_NAME": job,
            "NOMAD_ALLOC_DIR": "/alloc",
            "NOMAD_TASK_DIR": "/local",
            "NOMAD_SECRETS_DIR": "/secrets",
        }
        base_env.update(env or {})
        return TaskConfig(
            id=f"{self.alloc_id}/{task}/{secrets.token_hex(4)}",
            name=task,
            alloc_id=self.alloc_id,
            job_name=job,
            job_id=job,
            task_group_name=group,
            env=base_env,
            resources=resources or Resources(cpu_shares=100, memory_mb=64),
            mounts=list(mounts),
            user=user,
            alloc_dir=str(self.path),
            stdout_path=out,
            stderr_path=err,
            network_isolation_spec=network,
            driver_config=dict(driver_config or {}),
        )

    def stdout(self, task: str) -> bytes:
        return self.readers[task][0].data()

    def stderr(self, task: str) -> bytes:
        return self.readers[task][1].data()

    def wait_for_output(self, task: str, needle: bytes, timeout: float = 30.0, *, stderr: bool = False) -> bytes:
        return self.readers[task][1 if stderr else 0].wait_for(needle, timeout)

    def close(self) -> None:
        for out, err in self.readers.values():
            out.close()
            err.close()
        self.readers.clear()

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


class DriverHarness:
    """Launch a driver plugin for a test and make sure every task it started is destroyed."""

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        plugin_config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        agent: AgentConfig | None = NOMAD_DEFAULT_AGENT,
        timeout: float = 60.0,
    ) -> None:
        self.cmd = list(cmd)
        self.plugin_config = dict(plugin_config or {})
        self.env = dict(env) if env is not None else None
        self.agent = agent
        self.timeout = timeout
        self._tasks: set[str] = set()
        self.handles: dict[str, TaskHandle] = {}
        """The handle StartTask returned for each task started through :meth:`start`."""
        self.client = self._launch()

    def _launch(self) -> DriverClient:
        # Imported here: the pytest plugin (driversdk.testing.pytest_plugin) imports this package
        # at every pytest start in an environment with driversdk installed; grpc and the protos
        # load only once a test launches a plugin.
        from driversdk.client import launch

        client = launch(self.cmd, env=self.env, timeout=self.timeout)
        try:
            client.set_config(self.plugin_config, self.agent)
            client.init()
        except BaseException:
            client.kill()
            raise
        return client

    def start(self, task: TaskConfig) -> TaskHandle:
        handle = self.client.start_task(task)
        self._tasks.add(task.id)
        self.handles[task.id] = handle
        return handle

    def forget(self, task_id: str) -> None:
        self._tasks.discard(task_id)
        self.handles.pop(task_id, None)

    def restart_plugin(self, *, kill_hard: bool = True) -> DriverClient:
        """Kill the plugin process (SIGKILL by default, like a crash) and launch a fresh one.

        Tasks keep running; recover them with ``client.recover_task(handle)``.
        """
        if kill_hard:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.client.process.pid, 9)
        self.client.process.kill()
        self.client = self._launch()
        return self.client

    def close(self) -> None:
        for task_id in sorted(self._tasks):
            with contextlib.suppress(PluginCallError):
                self.client.destroy_task(task_id, force=True)
        self._tasks.clear()
        self.client.kill()

    def __enter__(self) -> DriverHarness:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
