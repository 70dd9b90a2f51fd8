"""A conformance kit: check that what a driver advertises in Capabilities is true.

A driver author supplies one function that turns a shell command into that driver's task
config (``{"image": ..., "command": "/bin/sh", "args": [...]}`` for docker, say); the kit then
runs small tasks through the real plugin and checks each advertised capability against what
really happens. Each check returns a :class:`CheckResult`; :func:`run_conformance` runs all of
them and never stops at the first failure, so a report lists every untrue claim at once.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driversdk.errors import PluginCallError
from driversdk.model import Capabilities, FSIsolation, MountConfigSupport
from driversdk.mounts import Mount
from driversdk.testing import AllocDir, DriverHarness

TaskFactory = Callable[[Sequence[str]], Mapping[str, Any]]
"""Turns an argv (``["/bin/sh", "-c", "..."]``) into the driver's task ``config {}`` value."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str

    def __str__(self) -> str:
        return f"{'ok  ' if self.passed else 'FAIL'} {self.name}: {self.detail}"


class _Kit:
    def __init__(self, harness: DriverHarness, factory: TaskFactory, workdir: str, timeout: float) -> None:
        self.harness = harness
        self.factory = factory
        self.workdir = workdir
        self.timeout = timeout
        self.caps: Capabilities = harness.client.capabilities()

    def _run(self, script: str, mounts: Sequence[Mount] = ()) -> tuple[int, bytes, AllocDir]:
        alloc = AllocDir.create(self.workdir, tasks=["conf"])
        task = alloc.task_config("conf", driver_config=self.factory(["/bin/sh", "-c", script]), mounts=mounts)
        self.harness.start(task)
        try:
            result = self.harness.client.wait_task(task.id, timeout=self.timeout)
        finally:
            try:
                self.harness.client.destroy_task(task.id, force=True)
            finally:
                self.harness.forget(task.id)
        # Give the log pipeline a moment to drain what the task wrote before it exited.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not alloc.stdout("conf"):
            time.sleep(0.05)
        return result.exit_code, alloc.stdout("conf"), alloc

    def check_exit_code(self) -> CheckResult:
        code, _, alloc = self._run("exit 7")
        alloc.remove()
        return CheckResult("wait returns the exit code", code == 7, f"exit 7 came back as {code}")

    def check_logs(self) -> CheckResult:
        _, out, alloc = self._run("echo conformance-out")
        alloc.remove()
        if self.caps.disable_log_collection:
            return CheckResult(
                "log collection disabled",
                out == b"",
                "nothing written to the fifo" if out == b"" else f"wrote {out!r}",
            )
        ok = b"conformance-out" in out
        return CheckResult("stdout reaches the log fifo", ok, "seen" if ok else f"fifo held {out!r}")

    def check_task_dirs(self) -> CheckResult:
        if self.caps.fs_isolation not in (FSIsolation.IMAGE, FSIsolation.CHROOT):
            return CheckResult("task dirs", True, "fs_isolation is not image/chroot: nothing to check")
        code, out, alloc = self._run("test -d /alloc && test -d /local && test -d /secrets && echo dirs-ok")
        alloc.remove()
        ok = code == 0 and (b"dirs-ok" in out or self.caps.disable_log_collection)
        return CheckResult("/alloc, /local and /secrets exist in the task", ok, f"exit {code}, output {out!r}")

    def check_mounts(self) -> CheckResult:
        src = tempfile.mkdtemp(prefix="conformance-mount-", dir=self.workdir)
        with open(os.path.join(src, "probe"), "w") as fh:
            fh.write("mounted")
        mount = Mount(task_path="/conformance", host_path=src, readonly=True, request_name="probe")
        if self.caps.mount_configs is MountConfigSupport.NONE:
            return CheckResult("mounts", True, "driver advertises no mount support: nothing to check")
        code, out, alloc = self._run("cat /conformance/probe", mounts=[mount])
        alloc.remove()
        ok = code == 0 and (b"mounted" in out or self.caps.disable_log_collection)
        return CheckResult("a TaskConfig mount is visible in the task", ok, f"exit {code}, output {out!r}")

    def _with_running(self, fn: Callable[[str], CheckResult]) -> CheckResult:
        alloc = AllocDir.create(self.workdir, tasks=["conf"])
        task = alloc.task_config(
            "conf",
            driver_config=self.factory(["/bin/sh", "-c", "trap 'echo got-usr1' USR1; while :; do sleep 0.1; done"]),
        )
        self.harness.start(task)
        try:
            time.sleep(0.5)
            return fn(task.id)
        finally:
            try:
                self.harness.client.destroy_task(task.id, force=True)
            finally:
                self.harness.forget(task.id)
                alloc.remove()

    def check_signals(self) -> CheckResult:
        def probe(task_id: str) -> CheckResult:
            try:
                self.harness.client.signal_task(task_id, "SIGUSR1")
            except PluginCallError as err:
                ok = not self.caps.send_signals and err.code == "UNIMPLEMENTED"
                return CheckResult("send_signals", ok, f"SignalTask answered {err.code}: {err}")
            return CheckResult("send_signals", self.caps.send_signals, "SignalTask succeeded")

        return self._with_running(probe)

    def check_exec(self) -> CheckResult:
        def probe(task_id: str) -> CheckResult:
            try:
                res = self.harness.client.exec_task(task_id, ["/bin/sh", "-c", "echo exec-ok"], timeout=self.timeout)
            except PluginCallError as err:
                ok = not self.caps.exec and err.code == "UNIMPLEMENTED"
                return CheckResult("exec", ok, f"ExecTask answered {err.code}: {err}")
            ok = self.caps.exec and b"exec-ok" in res.stdout and res.result.exit_code == 0
            return CheckResult("exec", ok, f"ExecTask gave exit {res.result.exit_code}, stdout {res.stdout!r}")

        return self._with_running(probe)


def run_conformance(
    harness: DriverHarness, factory: TaskFactory, workdir: str, *, timeout: float = 60.0
) -> list[CheckResult]:
    """Run every check against the driver behind ``harness``; returns all results."""
    kit = _Kit(harness, factory, workdir, timeout)
    checks = [
        kit.check_exit_code,
        kit.check_logs,
        kit.check_task_dirs,
        kit.check_mounts,
        kit.check_signals,
        kit.check_exec,
    ]
    results: list[CheckResult] = []
    for check in checks:
        try:
            results.append(check())
        except Exception as err:  # a crash in one check must not hide the others
            results.append(CheckResult(check.__name__.removeprefix("check_"), False, f"raised {err!r}"))
    return results
