#!/usr/bin/env python3
"""A minimal third-party-style driver: runs a host command with no isolation.

It shows the smallest honest driver: a task config schema, capabilities (it cannot mount
volumes, so it says ``MountConfigSupport.NONE``), the lifecycle, and ``serve()``. Because it
has no intermediary process, it cannot recover tasks after a plugin restart and says so.

Install it into Nomad's plugin_dir as an executable named ``hello``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO

from driversdk import DriverPlugin, ExecSession, serve
from driversdk import hclspec as hs
from driversdk.errors import DriverError, TaskNotFoundError
from driversdk.model import (
    Capabilities,
    CpuField,
    CpuUsage,
    ExecResult,
    ExitResult,
    Fingerprint,
    HealthState,
    MemoryField,
    MemoryUsage,
    MountConfigSupport,
    ResourceUsage,
    TaskConfig,
    TaskEvent,
    TaskHandle,
    TaskState,
    TaskStats,
    TaskStatus,
)

log = logging.getLogger("hello")


@dataclass
class _Task:
    config: TaskConfig
    process: subprocess.Popen[bytes]
    started_at: datetime
    done: threading.Event = field(default_factory=threading.Event)
    result: ExitResult | None = None
    completed_at: datetime | None = None


class HelloDriver(DriverPlugin):
    name = "hello"
    version = "0.1.0"

    def __init__(self) -> None:
        super().__init__()
        self._tasks: dict[str, _Task] = {}
        self._lock = threading.Lock()
        self._greeting = "hello"

    def config_schema(self) -> hs.Spec:
        return hs.obj({"greeting": hs.default(hs.attr("string"), hs.literal('"hello"'))})

    def set_config(self, config: dict[str, object], agent: object) -> None:
        self._greeting = str(config.get("greeting") or "hello")

    def task_config_schema(self) -> hs.Spec:
        return hs.obj({"command": hs.attr("string", required=True), "args": hs.attr("list(string)")})

    def capabilities(self) -> Capabilities:
        return Capabilities(send_signals=True, exec=True, mount_configs=MountConfigSupport.NONE)

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(HealthState.HEALTHY, "Healthy", {"driver.hello.greeting": self._greeting})

    def _get(self, task_id: str) -> _Task:
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            raise TaskNotFoundError(task_id)
        return task

    def start_task(self, task: TaskConfig) -> TaskHandle:
        cfg = task.driver_config
        argv = [str(cfg["command"]), *[str(a) for a in cfg.get("args") or []]]
        # Open the fifos write-only without creating them; the host owns them.
        out = os.open(task.stdout_path, os.O_WRONLY)
        err = os.open(task.stderr_path, os.O_WRONLY)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=dict(task.env),
                cwd=task.task_dir,
                start_new_session=True,
                # Tasks must not inherit the plugin's SIGINT handler or mask.
                restore_signals=True,
            )
        except OSError as exc:
            raise DriverError(f"task {task.name!r}: cannot run {argv[0]!r}: {exc.strerror}") from None
        finally:
            os.close(out)
            os.close(err)
        record = _Task(task, proc, datetime.now(UTC))
        with self._lock:
            self._tasks[task.id] = record
        threading.Thread(target=self._reap, args=(record,), daemon=True).start()
        self.emit_event(
            TaskEvent(
                task.id,
                task.alloc_id,
                task.name,
                f"{self._greeting}: started pid {proc.pid}",
                datetime.now(UTC),
            )
        )
        return TaskHandle(config=task, driver_state=str(proc.pid).encode(), state=TaskState.RUNNING)

    def _reap(self, task: _Task) -> None:
        code = task.process.wait()
        task.result = ExitResult(exit_code=code, signal=0) if code >= 0 else ExitResult(exit_code=0, signal=-code)
        task.completed_at = datetime.now(UTC)
        task.done.set()

    def recover_task(self, handle: TaskHandle) -> None:
        with self._lock:
            if handle.config.id in self._tasks:
                return
        raise DriverError(
            f"task {handle.config.name!r} cannot be recovered: the hello driver keeps no intermediary process"
        )

    def wait_task(self, task_id: str) -> ExitResult:
        task = self._get(task_id)
        task.done.wait()
        assert task.result is not None
        return task.result

    def stop_task(self, task_id: str, timeout: float, signal_name: str) -> None:
        task = self._get(task_id)
        if task.done.is_set():
            return
        sig = signal.Signals[signal_name] if signal_name else signal.SIGTERM
        task.process.send_signal(sig)
        if not task.done.wait(timeout):
            task.process.kill()
            task.done.wait()

    def destroy_task(self, task_id: str, force: bool) -> None:
        task = self._get(task_id)
        if not task.done.is_set():
            if not force:
                raise DriverError(f"task {task.config.name!r} is still running; stop it first or destroy with force")
            task.process.kill()
            task.done.wait()
        with self._lock:
            self._tasks.pop(task_id, None)

    def inspect_task(self, task_id: str) -> TaskStatus:
        task = self._get(task_id)
        return TaskStatus(
            id=task_id,
            name=task.config.name,
            state=TaskState.EXITED if task.done.is_set() else TaskState.RUNNING,
            started_at=task.started_at,
            completed_at=task.completed_at,
            result=task.result,
            driver_attributes={"pid": str(task.process.pid)},
        )

    def signal_task(self, task_id: str, signal_name: str) -> None:
        task = self._get(task_id)
        try:
            task.process.send_signal(signal.Signals[signal_name])
        except KeyError:
            raise DriverError(f"unknown signal {signal_name!r}: use a name such as SIGHUP") from None

    def task_stats(self, task_id: str) -> TaskStats | None:
        task = self._get(task_id)
        if task.done.is_set():
            return None  # ends the stream
        try:
            with open(f"/proc/{task.process.pid}/stat") as fh:
                fields = fh.read().rsplit(") ", 1)[1].split()
        except OSError:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        user, system = int(fields[11]) / ticks, int(fields[12]) / ticks
        rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        return TaskStats(
            timestamp=datetime.now(UTC),
            usage=ResourceUsage(
                cpu=CpuUsage(
                    user_mode=user, system_mode=system, measured_fields=(CpuField.USER_MODE, CpuField.SYSTEM_MODE)
                ),
                memory=MemoryUsage(rss=rss, measured_fields=(MemoryField.RSS,)),
            ),
        )

    def exec_task_streaming(self, session: ExecSession) -> ExitResult:
        task = self._get(session.task_id)
        proc = subprocess.Popen(
            session.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=task.config.task_dir,
            env=dict(task.config.env),
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

        def feed() -> None:
            assert proc.stdin is not None
            while (chunk := session.read_stdin()) is not None:
                if chunk:
                    proc.stdin.write(chunk)
                    proc.stdin.flush()
            proc.stdin.close()

        def pump(stream: IO[bytes], send: Callable[[bytes], None]) -> None:
            for chunk in iter(lambda: stream.read1(65536), b""):
                send(chunk)

        threading.Thread(target=feed, daemon=True).start()
        err_pump = threading.Thread(target=pump, args=(proc.stderr, session.send_stderr), daemon=True)
        err_pump.start()
        pump(proc.stdout, session.send_stdout)
        err_pump.join()
        code = proc.wait()
        return ExitResult(exit_code=code) if code >= 0 else ExitResult(signal=-code)

    def exec_task(self, task_id: str, command: list[str], timeout: float | None) -> ExecResult:
        task = self._get(task_id)
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                timeout=timeout,
                cwd=task.config.task_dir,
                env=dict(task.config.env),
            )
        except subprocess.TimeoutExpired as exc:
            return ExecResult(exc.stdout or b"", exc.stderr or b"", ExitResult(exit_code=0, signal=9))
        return ExecResult(done.stdout, done.stderr, ExitResult(exit_code=done.returncode))


def main() -> None:
    serve(HelloDriver())


if __name__ == "__main__":
    main()
