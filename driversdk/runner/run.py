"""``driversdk run``: run a job's tasks on this machine through their driver plugins.

What it does today: validate the job (exactly as ``driversdk validate``), lay out the alloc
dir, collect logs into rotated files, turn host volumes into checked driver mounts, start
every task through its launched plugin, report progress, stop cleanly on Ctrl-C or SIGTERM,
and release everything on the way out. CSI volumes, group networks and restart recovery are
refused with a sentence rather than half done.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from driversdk import convert
from driversdk.client import DriverClient, launch
from driversdk.errors import ConfigError, DriverSDKError
from driversdk.model import AgentConfig, ExitResult, LinuxResources, Resources, TaskConfig
from driversdk.mounts import MountRequest, check_mounts
from driversdk.runner.clientconfig import ClientConfig
from driversdk.runner.jobspec import Group, Job, Task, parse_job
from driversdk.runner.logcollect import MIB, FifoCollector, RotatingFile
from driversdk.runner.runstate import RunState
from driversdk.runner.validate import validate_job

Say = Callable[[str], None]


class RunRefused(ConfigError):
    """The job asks for something ``driversdk run`` does not do."""


def log_files(alloc_dir: str, task: str, kind: str) -> list[str]:
    """A task's rotated log files of one kind, oldest first."""
    logs = os.path.join(alloc_dir, "alloc", "logs")
    prefix = f"{task}.{kind}."
    try:
        names = [n for n in os.listdir(logs) if n.startswith(prefix) and n[len(prefix) :].isdigit()]
    except FileNotFoundError:
        return []
    return [os.path.join(logs, n) for n in sorted(names, key=lambda n: int(n[len(prefix) :]))]


def _parse_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit):
            try:
                return float(text[: -len(unit)]) * units[unit]
            except ValueError:
                break
    raise ConfigError(f'kill_timeout {text!r} is not a duration such as "5s"')


@dataclass
class RunningTask:
    task: Task
    config: TaskConfig
    client: DriverClient
    collectors: list[FifoCollector] = field(default_factory=list)
    result: ExitResult | None = None
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class AllocRun:
    def __init__(self, job: Job, group: Group, client: ClientConfig, say: Say, state: RunState) -> None:
        self.state = state
        self.job = job
        self.group = group
        self.client = client
        self.say = say
        self.alloc_id = str(uuid.uuid4())
        self.alloc_dir = os.path.join(client.data_dir, "allocs", self.alloc_id)
        self.plugins: dict[str, DriverClient] = {}
        self.tasks: list[RunningTask] = []

    def _refuse_unsupported(self) -> None:
        csi = [r.name for r in self.group.volumes.values() if r.type == "csi"]
        if csi:
            raise RunRefused(
                f'group "{self.group.name}": driversdk run does not claim and mount CSI volumes ({", ".join(csi)}); '
                "use `driversdk validate` to check the job and run it under Nomad"
            )
        plugins = [t.name for t in self.group.tasks if t.csi_plugin is not None]
        if plugins:
            raise RunRefused(
                f'group "{self.group.name}": driversdk run does not supervise CSI plugin tasks ({", ".join(plugins)}); '
                "run the plugin under Nomad, or start it by hand (driversdk-csi-hostpath) for CSI tools"
            )
        if self.group.network_mode not in ("host", ""):
            raise RunRefused(
                f'group "{self.group.name}": network mode {self.group.network_mode!r} is not run by driversdk run; '
                'use mode = "host"'
            )

    def _plugin(self, driver: str) -> DriverClient:
        if driver not in self.plugins:
            command = self.client.driver_command(driver)
            if command is None:
                raise RunRefused(f'no plugin is configured for driver "{driver}"')
            plugin = launch(command, name=driver)
            try:
                plugin.set_config(self.client.plugin_config(driver), AgentConfig(14000, 14512))
                plugin.init()
            except BaseException:
                plugin.kill()
                raise
            self.plugins[driver] = plugin
        return self.plugins[driver]

    def _task_config(self, task: Task, plugin: DriverClient) -> tuple[TaskConfig, list[FifoCollector]]:
        caps = plugin.capabilities()
        task_dir = os.path.join(self.alloc_dir, task.name)
        for sub in ("local", "secrets", "private", "tmp"):
            os.makedirs(os.path.join(task_dir, sub), exist_ok=True)
        logs = os.path.join(self.alloc_dir, "alloc", "logs")
        stdout, stderr = (
            os.path.join(logs, f".{task.name}.stdout.fifo"),
            os.path.join(logs, f".{task.name}.stderr.fifo"),
        )
        collectors: list[FifoCollector] = []
        if task.logs_disabled:
            stdout = stderr = os.devnull
        elif not caps.disable_log_collection:
            for fifo, kind in ((stdout, "stdout"), (stderr, "stderr")):
                sink = RotatingFile(logs, f"{task.name}.{kind}", task.logs_max_files, task.logs_max_file_size * MIB)
                collectors.append(FifoCollector(fifo, sink))
        requests = []
        for mount in task.volume_mounts:
            req = self.group.volumes[mount.volume]
            volume = self.client.host_volumes[req.source]
            requests.append(
                MountRequest(
                    volume=req.name,
                    destination=mount.destination,
                    host_path=volume.path,
                    propagation=mount.propagation_mode,
                    read_only=volume.read_only or req.read_only or mount.read_only,
                    selinux_label=mount.selinux_label,
                )
            )
        mounts = check_mounts(requests, task=task.name, driver=task.driver, mount_configs=int(caps.mount_configs))
        env = {
            "NOMAD_ALLOC_ID": self.alloc_id,
            "NOMAD_JOB_NAME": self.job.name,
            "NOMAD_GROUP_NAME": self.group.name,
            "NOMAD_TASK_NAME": task.name,
            "NOMAD_ALLOC_DIR": "/alloc",
            "NOMAD_TASK_DIR": "/local",
            "NOMAD_SECRETS_DIR": "/secrets",
            **task.env,
        }
        config = TaskConfig(
            id=f"{self.alloc_id}/{task.name}/{secrets.token_hex(4)}",
            name=task.name,
            alloc_id=self.alloc_id,
            job_name=self.job.name,
            job_id=self.job.name,
            task_group_name=self.group.name,
            namespace=self.job.namespace,
            env=env,
            resources=Resources(
                cpu_shares=task.cpu,
                memory_mb=task.memory,
                memory_max_mb=task.memory_max,
                linux=LinuxResources(cpu_shares=task.cpu, memory_limit_bytes=max(task.memory, task.memory_max) * MIB),
            ),
            mounts=mounts,
            user=task.user,
            alloc_dir=self.alloc_dir,
            stdout_path=stdout,
            stderr_path=stderr,
            driver_config=dict(task.config),
        )
        return config, collectors

    def start(self) -> None:
        self._refuse_unsupported()
        for sub in ("alloc/logs", "alloc/tmp", "alloc/data"):
            os.makedirs(os.path.join(self.alloc_dir, sub), exist_ok=True)
        for task in self.group.tasks:
            plugin = self._plugin(task.driver)
            config, collectors = self._task_config(task, plugin)
            running = RunningTask(task, config, plugin, collectors)
            self.tasks.append(running)
            handle = plugin.start_task(config)
            running.started = True
            self.state.started(
                self.alloc_id,
                self.job.name,
                self.group.name,
                task.name,
                task.driver,
                config.id,
                convert.task_handle_to_proto(handle).SerializeToString(),
                self.alloc_dir,
            )
            self.say(f'==> task "{task.name}" started ({task.driver}, alloc {self.alloc_id[:8]})')
            threading.Thread(target=self._wait, args=(running,), daemon=True).start()

    def _wait(self, running: RunningTask) -> None:
        try:
            running.result = running.client.wait_task(running.config.id)
        except DriverSDKError as err:
            self.say(f'==> task "{running.task.name}": wait failed: {err}')
            running.result = ExitResult(exit_code=1)
        finally:
            running.done.set()
        r = running.result
        self.state.finished(self.alloc_id, running.task.name, r.exit_code, r.signal, r.oom_killed)
        how = f"signal {r.signal}" if r.signal else f"exit code {r.exit_code}"
        oom = " (killed: out of memory)" if r.oom_killed else ""
        self.say(f'==> task "{running.task.name}" finished with {how}{oom}')

    def stop(self) -> None:
        for running in self.tasks:
            if running.started and not running.done.is_set():
                self.say(f'==> stopping task "{running.task.name}"')
                try:
                    running.client.stop_task(
                        running.config.id, _parse_seconds(running.task.kill_timeout), running.task.kill_signal
                    )
                except DriverSDKError as err:
                    self.say(f'==> task "{running.task.name}": stop failed: {err}')

    def close(self) -> None:
        """Release everything this run created: tasks, log fifos, plugin processes."""
        for running in self.tasks:
            if running.started:
                self.state.stopped(self.alloc_id, running.task.name)
                try:
                    running.client.destroy_task(running.config.id, force=True)
                except DriverSDKError as err:
                    self.say(f'==> task "{running.task.name}": destroy failed: {err}')
            for collector in running.collectors:
                collector.close()
        for plugin in self.plugins.values():
            plugin.kill()


def run_job(path: str, client: ClientConfig, say: Say = print, stop: threading.Event | None = None) -> int:
    report = validate_job(path, client)
    if not report.valid:
        for problem in report.problems:
            say(f"error {problem}")
        return 1
    job, _ = parse_job(path)
    stop = stop or threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    allocs: list[AllocRun] = []
    state = RunState(client.data_dir)
    try:
        for group in job.groups:
            for _ in range(group.count):
                alloc = AllocRun(job, group, client, say, state)
                allocs.append(alloc)
                alloc.start()
        tasks = [t for a in allocs for t in a.tasks]
        while not stop.is_set() and not all(t.done.is_set() for t in tasks):
            stop.wait(0.2)
        if stop.is_set():
            say("==> interrupted: stopping tasks")
            for alloc in allocs:
                alloc.stop()
            for t in tasks:
                t.done.wait(60)
        results = [t.result for t in tasks]
        ok = all(r is not None and r.successful for r in results)
        return 0 if ok and not stop.is_set() else 1
    finally:
        for alloc in allocs:
            alloc.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        state.close()
