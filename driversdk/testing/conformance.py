"""A conformance kit: check that what a driver advertises, and what every driver must do, is true.

A driver author supplies one function that turns a shell command into that driver's task
config (``{"image": ..., "command": "/bin/sh", "args": [...]}`` for docker, say); the kit then
runs small tasks through the real plugin and checks each claim against what the tasks
themselves show: a signal sent is trapped by the task, a stop honours its timeout, a destroyed
task's processes are gone, a recovered task is found by a fresh plugin process. Each check
returns a :class:`CheckResult`; :func:`run_conformance` runs all of them and never stops at the
first failure, so a report lists every untrue claim at once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driversdk.errors import PluginCallError
from driversdk.model import Capabilities, ExitResult, FSIsolation, MountConfigSupport, TaskConfig, TaskState
from driversdk.mounts import Mount
from driversdk.testing import AllocDir, DriverHarness

TaskFactory = Callable[[Sequence[str]], Mapping[str, Any]]
"""Turns an argv (``["/bin/sh", "-c", "..."]``) into the driver's task ``config {}`` value."""

# Long enough for any driver's slowest step (an image already pulled, a container start).
STOP_TIMEOUT = 2.0


@dataclass(frozen=True)
class CheckResult:
    """One check: ``detail`` is what was seen; a failure also says what was advertised and what
    to change, so its text is a block an author can act on without reading the kit."""

    name: str
    passed: bool
    detail: str
    advertised: str = ""
    fix: str = ""

    def __str__(self) -> str:
        if self.passed:
            return f"ok   {self.name}: {self.detail}"
        lines = [f"FAIL {self.name}: {self.detail}"]
        if self.advertised:
            lines.append(f"     advertised: {self.advertised}")
        if self.fix:
            lines.append(f"     change:     {self.fix}")
        return "\n".join(lines)


def _ok(name: str, detail: str) -> CheckResult:
    return CheckResult(name, True, detail)


def _fail(name: str, seen: str, advertised: str, fix: str) -> CheckResult:
    return CheckResult(name, False, seen, advertised, fix)


class _Kit:
    def __init__(self, harness: DriverHarness, factory: TaskFactory, workdir: str, timeout: float) -> None:
        self.harness = harness
        self.factory = factory
        self.workdir = workdir
        self.timeout = timeout
        self.caps: Capabilities = harness.client.capabilities()

    # --- running tasks ----------------------------------------------------------------------

    def _task(self, script: str, mounts: Sequence[Mount] = ()) -> tuple[TaskConfig, AllocDir]:
        alloc = AllocDir.create(self.workdir, tasks=["conf"])
        config = self.factory(["/bin/sh", "-c", script])
        return alloc.task_config("conf", driver_config=config, mounts=mounts), alloc

    @contextlib.contextmanager
    def _started(self, script: str, mounts: Sequence[Mount] = ()) -> Iterator[tuple[TaskConfig, AllocDir, str]]:
        """A started task whose shell carries a fresh token in its command line, so the kit can
        see its processes on the host; destroyed after, and anything still carrying the token
        killed, so a driver that lies about destroy leaves nothing behind."""
        token = f"conf-{secrets.token_hex(6)}"
        task, alloc = self._task(f": {token}; {script}", mounts)
        self.harness.start(task)
        try:
            yield task, alloc, token
        finally:
            try:
                with contextlib.suppress(PluginCallError):
                    self.harness.client.destroy_task(task.id, force=True)
            finally:
                self.harness.forget(task.id)
                _kill_carrying(token)
                alloc.remove()

    def _run(self, script: str, mounts: Sequence[Mount] = ()) -> tuple[ExitResult, bytes]:
        with self._started(script, mounts) as (task, alloc, _):
            result = self.harness.client.wait_task(task.id, timeout=self.timeout)
            # Give the log pipeline a moment to drain what the task wrote before it exited.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not alloc.stdout("conf") and not self.caps.disable_log_collection:
                time.sleep(0.05)
            return result, alloc.stdout("conf")

    def _running(self, token: str) -> bool:
        """Whether any process on this host still carries ``token`` in its command line."""
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if token.encode() in fh.read():
                        with open(f"/proc/{name}/stat") as st:
                            if st.read().rsplit(") ", 1)[1][:1] not in ("Z", "X"):
                                return True
            except (OSError, IndexError):
                continue
        return False

    def _wait_started(self, task: TaskConfig, token: str) -> None:
        """Until the task's shell runs (a signal sent before its trap is set would kill it)."""
        deadline = time.monotonic() + min(self.timeout, 10.0)
        while time.monotonic() < deadline and not self._running(token):
            time.sleep(0.05)
        time.sleep(0.3)  # the shell has parsed its script and set its traps

    def _wait_exit(self, task_id: str, timeout: float) -> ExitResult | None:
        try:
            return self.harness.client.wait_task(task_id, timeout=timeout)
        except PluginCallError as err:
            if err.code == "DEADLINE_EXCEEDED":
                return None
            raise

    # --- checks -----------------------------------------------------------------------------

    def check_exit_code(self) -> CheckResult:
        name = "wait returns the exit code"
        result, _ = self._run("exit 7")
        if result.exit_code == 7 and result.signal == 0:
            return _ok(name, "exit 7 came back as 7")
        return _fail(
            name,
            f"a task that ran `exit 7` ended with exit code {result.exit_code}, signal {result.signal}",
            "WaitTask reports how the task ended (every driver)",
            "return ExitResult(exit_code=<the process's exit status>) from wait_task",
        )

    def check_logs(self) -> CheckResult:
        result, out = self._run("echo conformance-out")
        if self.caps.disable_log_collection:
            if out == b"":
                return _ok("log collection disabled", "nothing written to the fifo")
            return _fail(
                "log collection disabled",
                f"the task's stdout reached the fifo: {out[-200:]!r}",
                "disable_log_collection=True",
                "advertise disable_log_collection=False, or stop writing to task.stdout_path",
            )
        if b"conformance-out" in out:
            return _ok("stdout reaches the log fifo", "seen")
        return _fail(
            "stdout reaches the log fifo",
            f"`echo conformance-out` left {out[-200:]!r} in the stdout fifo (exit {result.exit_code})",
            "disable_log_collection=False (the host reads task.stdout_path and task.stderr_path)",
            "write the task's stdout to the fifo at task.stdout_path (open it write-only; the host created it), "
            "or advertise disable_log_collection=True",
        )

    def check_fs_isolation(self) -> CheckResult:
        name = "fs_isolation"
        probe = tempfile.mkdtemp(prefix="conformance-fs-", dir=self.workdir)
        marker = os.path.join(probe, "host-only")
        with open(marker, "w") as fh:
            fh.write("host")
        isolated = self.caps.fs_isolation in (FSIsolation.IMAGE, FSIsolation.CHROOT)
        result, _ = self._run(f"test -e {marker} && exit 10 || exit 11")
        sees_host = result.exit_code == 10
        advertised = f"fs_isolation={self.caps.fs_isolation.name}"
        if result.exit_code not in (10, 11):
            return _fail(
                name, f"the probe task ended with exit {result.exit_code}", advertised, "see the exit code check"
            )
        if isolated and sees_host:
            return _fail(
                name,
                f"the task sees the host file {marker}",
                advertised,
                "advertise FSIsolation.NONE, or give the task a root filesystem of its own",
            )
        if not isolated and not sees_host:
            return _fail(
                name,
                f"the task cannot see the host file {marker}",
                advertised,
                "advertise FSIsolation.CHROOT or IMAGE (the task has a filesystem of its own)",
            )
        return _ok(name, f"{advertised}: the task {'does not see' if isolated else 'sees'} the host's files")

    def check_task_dirs(self) -> CheckResult:
        name = "/alloc, /local and /secrets exist in the task"
        if self.caps.fs_isolation not in (FSIsolation.IMAGE, FSIsolation.CHROOT):
            return _ok("task dirs", "fs_isolation is not image/chroot: nothing to check")
        result, _ = self._run("test -d /alloc && test -d /local && test -d /secrets && exit 0; exit 12")
        if result.exit_code == 0:
            return _ok(name, "seen")
        return _fail(
            name,
            f"the probe task ended with exit {result.exit_code}",
            f"fs_isolation={self.caps.fs_isolation.name}",
            "mount the alloc dir at /alloc, the task's local/ at /local and secrets/ at /secrets",
        )

    def check_mounts(self) -> CheckResult:
        name = "a TaskConfig mount is visible in the task"
        if self.caps.mount_configs is MountConfigSupport.NONE:
            return _ok("mounts", "driver advertises no mount support (mount_configs NONE): nothing to check")
        src = tempfile.mkdtemp(prefix="conformance-mount-", dir=self.workdir)
        os.chmod(src, 0o755)  # mkdtemp's 0700 would hide it from a task that runs as another user (exec's nobody)
        with open(os.path.join(src, "probe"), "w") as fh:
            fh.write("mounted")
        mount = Mount(task_path="/conformance", host_path=src, readonly=True, request_name="probe")
        result, _ = self._run("grep -q mounted /conformance/probe && exit 0; exit 13", mounts=[mount])
        if result.exit_code == 0:
            return _ok(name, "seen")
        return _fail(
            name,
            f"a task with a mount of {src} at /conformance could not read /conformance/probe (exit {result.exit_code})",
            f"mount_configs={self.caps.mount_configs.name}",
            "bind-mount each of task.mounts (host_path at task_path), or advertise "
            "mount_configs=MountConfigSupport.NONE",
        )

    def check_signals(self) -> CheckResult:
        name = "send_signals"
        script = "trap 'exit 42' USR1; while :; do sleep 0.1; done"
        with self._started(script) as (task, _, token):
            self._wait_started(task, token)
            try:
                self.harness.client.signal_task(task.id, "SIGUSR1")
            except PluginCallError as err:
                if not self.caps.send_signals and err.code == "UNIMPLEMENTED":
                    return _ok(name, f"not advertised, and SignalTask answers UNIMPLEMENTED: {err}")
                return _fail(
                    name,
                    f"SignalTask answered {err.code}: {err}",
                    f"send_signals={self.caps.send_signals}",
                    "implement signal_task" if self.caps.send_signals else "raise NotSupportedError in signal_task",
                )
            result = self._wait_exit(task.id, 10)
            if result is not None and result.exit_code == 42:
                if self.caps.send_signals:
                    return _ok(name, "SIGUSR1 reached the task's trap")
                return _fail(
                    name,
                    "SIGUSR1 reached the task although signals are not advertised",
                    "send_signals=False",
                    "advertise send_signals=True",
                )
            seen = "the task kept running" if result is None else f"the task ended with {_text(result)}"
            return _fail(
                name,
                f"SignalTask(SIGUSR1) succeeded but the task's trap never ran: {seen}",
                f"send_signals={self.caps.send_signals}",
                "deliver the signal to the task's process in signal_task, or advertise send_signals=False "
                "and raise NotSupportedError",
            )

    def check_stop_honours_signal(self) -> CheckResult:
        name = "StopTask sends the signal first"
        with self._started("trap 'exit 0' TERM; while :; do sleep 0.1; done") as (task, _, token):
            self._wait_started(task, token)
            self.harness.client.stop_task(task.id, timeout=self.timeout, signal="SIGTERM")
            result = self._wait_exit(task.id, 10)
            if result is not None and result.successful:
                return _ok(name, "a task trapping SIGTERM exited 0 on StopTask")
            seen = "still running after StopTask returned" if result is None else f"ended with {_text(result)}"
            return _fail(
                name,
                f"a task that exits 0 on SIGTERM was {seen}",
                "StopTask(timeout, signal): send the signal, wait up to timeout, then kill (every driver)",
                "send the signal (SIGTERM when empty) to the task first and kill only after the timeout",
            )

    def check_stop_kills_after_timeout(self) -> CheckResult:
        name = "StopTask kills after its timeout"
        with self._started("trap '' TERM; while :; do sleep 0.1; done") as (task, _, token):
            self._wait_started(task, token)
            try:
                self.harness.client.stop_task(task.id, timeout=STOP_TIMEOUT, signal="SIGTERM")
            except PluginCallError as err:
                return _fail(
                    name,
                    f"StopTask answered {err.code}: {err}",
                    "StopTask kills a task that outlives its timeout (every driver)",
                    "after the timeout, kill the task (SIGKILL) and return once it is dead",
                )
            result = self._wait_exit(task.id, 10)
            if result is not None:
                return _ok(name, f"a task ignoring SIGTERM ended ({_text(result)})")
            return _fail(
                name,
                f"a task ignoring SIGTERM still ran after StopTask(timeout={STOP_TIMEOUT}s) returned",
                "StopTask kills a task that outlives its timeout (every driver)",
                "after the timeout, kill the task (SIGKILL) and return once it is dead",
            )

    def check_destroy(self) -> CheckResult:
        name = "DestroyTask(force) removes a running task"
        with self._started("while :; do sleep 0.1; done") as (task, _, token):
            self._wait_started(task, token)
            if not self._running(token):
                return _ok(name, "the task's processes are not visible on this host: nothing to check")
            self.harness.client.destroy_task(task.id, force=True)
            deadline = time.monotonic() + 5
            while self._running(token) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._running(token):
                with contextlib.suppress(PluginCallError):
                    self.harness.client.destroy_task(task.id, force=True)
                return _fail(
                    name,
                    "the task's process still runs 5 s after DestroyTask(force=True) returned",
                    "DestroyTask(force) kills a running task and frees everything (every driver)",
                    "in destroy_task, kill the task when force is set and wait for it to die",
                )
            try:
                self.harness.client.inspect_task(task.id)
            except PluginCallError as err:
                if err.code == "NOT_FOUND":
                    return _ok(name, "its processes are gone and InspectTask answers NOT_FOUND")
                raise
            return _fail(
                name,
                "the task is gone, but InspectTask still describes it",
                "DestroyTask forgets the task (every driver)",
                "forget the task in destroy_task (raise TaskNotFoundError for it afterwards)",
            )

    def check_inspect(self) -> CheckResult:
        name = "InspectTask reports the real state"
        with self._started("trap 'exit 3' TERM; while :; do sleep 0.1; done") as (task, _, token):
            self._wait_started(task, token)
            running = self.harness.client.inspect_task(task.id)
            self.harness.client.stop_task(task.id, timeout=self.timeout, signal="SIGTERM")
            self._wait_exit(task.id, 10)
            exited = self.harness.client.inspect_task(task.id)
        seen = f"running task: {running.state.name}; after it exited 3: {exited.state.name}"
        code = exited.result.exit_code if exited.result is not None else None
        if running.state is TaskState.RUNNING and exited.state is TaskState.EXITED and code == 3:
            return _ok(name, seen + ", exit code 3")
        return _fail(
            name,
            f"{seen}, exit code {code}",
            "InspectTask: RUNNING while the task runs, EXITED with its exit result after (every driver)",
            "return TaskStatus(state=RUNNING/EXITED, result=<the exit>) from inspect_task from the task's real state",
        )

    def check_recover(self) -> CheckResult:
        name = "RecoverTask after a plugin restart"
        fix = "keep what recovery needs in TaskHandle.driver_state and reattach to the task in recover_task"
        advertised = "RecoverTask finds tasks an earlier plugin process started (every driver; Nomad has no opt-out)"
        with (
            self._started("trap 'exit 5' TERM; while :; do sleep 0.1; done") as (running, _, token),
            self._started("exit 6") as (done, _, _),
        ):
            self._wait_started(running, token)
            self.harness.client.wait_task(done.id, timeout=self.timeout)
            handles = {running.id: self._handle(running.id), done.id: self._handle(done.id)}
            client = self.harness.restart_plugin()
            for handle in handles.values():
                try:
                    client.recover_task(handle)
                except PluginCallError as err:
                    return _fail(name, f"RecoverTask answered {err.code}: {err}", advertised, fix)
            status = client.inspect_task(running.id)
            if status.state is not TaskState.RUNNING:
                return _fail(name, f"the recovered running task is {status.state.name}", advertised, fix)
            finished = self._wait_exit(done.id, 10)
            if finished is None or finished.exit_code != 6:
                seen = "never" if finished is None else _text(finished)
                return _fail(
                    name, f"a task that ran `exit 6` before the restart reported {seen} after", advertised, fix
                )
            client.stop_task(running.id, timeout=self.timeout, signal="SIGTERM")
            stopped = self._wait_exit(running.id, 10)
            if stopped is None or stopped.exit_code != 5:
                seen = "still running" if stopped is None else _text(stopped)
                return _fail(name, f"the recovered task, stopped (it exits 5 on SIGTERM), is {seen}", advertised, fix)
        return _ok(name, "a fresh plugin found a running task (stopped, exit 5) and an exited one (exit 6)")

    def _handle(self, task_id: str) -> Any:
        handle = self.harness.handles.get(task_id)
        if handle is None:
            raise RuntimeError(f"the harness kept no handle for task {task_id}")
        return handle

    def check_stats(self) -> CheckResult:
        name = "TaskStats streams real numbers"
        with self._started("while :; do :; done") as (task, _, token):
            self._wait_started(task, token)
            stream = self.harness.client.task_stats(task.id, interval=0.5)
            samples: list[Any] = []
            error: list[PluginCallError] = []

            def read() -> None:
                try:
                    for sample in stream:
                        samples.append(sample)
                        if len(samples) >= 4 or (len(samples) >= 2 and (sample.usage.memory.rss > 0 or _cpu(sample))):
                            break
                except PluginCallError as err:
                    error.append(err)
                finally:
                    stream.close()  # type: ignore[attr-defined]  # a generator: closing cancels the call

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(15)
        if error:
            err = error[0]
            if err.code == "UNIMPLEMENTED":
                return _ok("stats", f"the driver does not stream stats: {err}")
            return _fail(
                name, f"TaskStats answered {err.code}: {err}", "TaskStats", "raise NotSupportedError or sample the task"
            )
        if not samples:
            return _fail(
                name,
                "TaskStats sent no sample in 15 s for a running task",
                "TaskStats (it did not answer UNIMPLEMENTED)",
                "return a TaskStats from task_stats for a running task, or raise NotSupportedError",
            )
        rss = max(s.usage.memory.rss for s in samples)
        cpu = max(_cpu(s) for s in samples)
        if rss > 0 or cpu > 0:
            return _ok(name, f"a busy task: rss {rss} bytes, cpu {cpu:.2f}")
        return _fail(
            name,
            f"{len(samples)} samples of a task spinning the CPU all read 0 (rss and cpu)",
            "TaskStats (it did not answer UNIMPLEMENTED)",
            "measure the task's processes (e.g. /proc/<pid>/stat or its cgroup), or raise NotSupportedError",
        )

    def check_exec(self) -> CheckResult:
        with self._started("while :; do sleep 0.1; done") as (task, _, token):
            self._wait_started(task, token)
            plain = self._exec_once(task.id)
            streamed = self._exec_streaming(task.id)
        results = {"ExecTask": plain, "ExecTaskStreaming": streamed}
        advertised = f"exec={self.caps.exec}"
        if self.caps.exec:
            broken = {call: seen for call, seen in results.items() if seen != "ok"}
            if not broken:
                return _ok("exec", "ExecTask and ExecTaskStreaming ran `echo exec-ok` in the task")
            return _fail(
                "exec",
                "; ".join(f"{call}: {seen}" for call, seen in broken.items()),
                advertised + " (Nomad uses ExecTask for script checks and ExecTaskStreaming for `alloc exec`)",
                "implement exec_task and exec_task_streaming, or advertise exec=False",
            )
        answered = {call: seen for call, seen in results.items() if seen != "UNIMPLEMENTED"}
        if not answered:
            return _ok("exec", "not advertised, and both exec calls answer UNIMPLEMENTED")
        return _fail(
            "exec",
            "; ".join(f"{call}: {seen}" for call, seen in answered.items()),
            advertised,
            "advertise exec=True if exec works, else raise NotSupportedError from the exec calls",
        )

    def _exec_once(self, task_id: str) -> str:
        try:
            res = self.harness.client.exec_task(task_id, ["/bin/sh", "-c", "echo exec-ok"], timeout=self.timeout)
        except PluginCallError as err:
            return "UNIMPLEMENTED" if err.code == "UNIMPLEMENTED" else f"answered {err.code}: {err}"
        if b"exec-ok" in res.stdout and res.result.exit_code == 0:
            return "ok"
        return f"gave exit {res.result.exit_code}, stdout {res.stdout[-200:]!r}"

    def _exec_streaming(self, task_id: str) -> str:
        try:
            out, _, result = self.harness.client.exec_task_streaming(
                task_id, ["/bin/sh", "-c", "echo exec-ok"]
            ).collect()
        except PluginCallError as err:
            return "UNIMPLEMENTED" if err.code == "UNIMPLEMENTED" else f"answered {err.code}: {err}"
        if b"exec-ok" in out and result.exit_code == 0:
            return "ok"
        return f"gave exit {result.exit_code}, stdout {out[-200:]!r}"


def _kill_carrying(token: str) -> None:
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{name}/cmdline", "rb") as fh:
                if token.encode() in fh.read():
                    os.kill(int(name), 9)


def _cpu(sample: Any) -> float:
    cpu = sample.usage.cpu
    return float(cpu.user_mode + cpu.system_mode + cpu.total_ticks + cpu.percent)


def _text(result: ExitResult) -> str:
    return f"exit code {result.exit_code}" + (f", signal {result.signal}" if result.signal else "")


CHECKS = (
    "exit_code",
    "logs",
    "fs_isolation",
    "task_dirs",
    "mounts",
    "signals",
    "stop_honours_signal",
    "stop_kills_after_timeout",
    "destroy",
    "inspect",
    "stats",
    "exec",
    "recover",
)


def run_conformance(
    harness: DriverHarness,
    factory: TaskFactory,
    workdir: str,
    *,
    timeout: float = 60.0,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run every check against the driver behind ``harness``; returns all results (and hands
    each to ``on_result`` as soon as it is known)."""
    kit = _Kit(harness, factory, workdir, timeout)
    results: list[CheckResult] = []
    for check in CHECKS:
        try:
            result = getattr(kit, f"check_{check}")()
        except Exception as err:  # a crash in one check must not hide the others
            result = CheckResult(
                check,
                False,
                f"the check could not finish: {err}",
                fix="make the driver answer this call (see the sentence above)",
            )
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
