"""The restart policy of a task and the tracker that applies it, as Nomad's client does.

Pure: no I/O, the clock and the random source are parameters. :func:`policy_for` merges the
group's and the task's ``restart`` blocks over Nomad's defaults for the job type (task fields
override group fields, which override the defaults); :class:`RestartTracker` answers, after
each exit or failed start, whether to restart and after how long — Nomad's
``client/allocrunner/taskrunner/restarts`` rules:

- a successful exit of a ``batch``/``sysbatch`` task, of a non-sidecar prestart or poststart
  task, or of any poststop task ends it (``Terminated``); any other exit is a failure, also a
  successful exit of a ``service``/``system`` task, which is meant to run forever;
- ``attempts`` failures within ``interval`` (the count starts again when an interval has
  passed) are restarted after ``delay`` plus up to 25% jitter (``Restarting``);
- past them, mode ``fail`` ends the task (``Not Restarting``, ``Exceeded allowed attempts 2 in
  interval 30m0s and mode is "fail"``) and mode ``delay`` waits until the interval is over and
  restarts (``Restarting``, ``Exceeded allowed attempts, applying a delay``);
- ``attempts = 0`` never restarts; a start error the driver calls unrecoverable is not retried.

:func:`event_message` gives each task event the sentence Nomad's ``alloc status`` shows.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from driversdk.durations import parse_duration
from driversdk.model import ExitResult

# Nomad's task event types (nomad/structs: TaskRestarting, TaskNotRestarting, …).
RESTARTING = "Restarting"
NOT_RESTARTING = "Not Restarting"
TERMINATED = "Terminated"
KILLED = "Killed"
SIBLING_FAILED = "Sibling Task Failed"
MAIN_DEAD = "Main Tasks Dead"
LEADER_DEAD = "Leader Task Dead"
DRIVER_FAILURE = "Driver Failure"
SETUP_FAILURE = "Setup Failure"

JITTER = 0.25  # the share of the delay added at random
REASON_NO_RESTARTS = "Policy allows no restarts"
REASON_UNRECOVERABLE = "Error was unrecoverable"
REASON_WITHIN_POLICY = "Restart within policy"
REASON_DELAY = "Exceeded allowed attempts, applying a delay"
REASON_SUCCESS = "Restart unnecessary as task terminated successfully"

MODES = ("fail", "delay")


@dataclass(frozen=True)
class RestartPolicy:
    attempts: int
    interval: float  # seconds
    delay: float  # seconds
    mode: str = "fail"
    render_templates: bool = False


# Nomad's DefaultServiceJobRestartPolicy and DefaultBatchJobRestartPolicy (system jobs take the
# service one, sysbatch the batch one).
SERVICE_DEFAULT = RestartPolicy(attempts=2, interval=30 * 60.0, delay=15.0, mode="fail")
BATCH_DEFAULT = RestartPolicy(attempts=3, interval=24 * 3600.0, delay=15.0, mode="fail")


def default_policy(job_type: str) -> RestartPolicy:
    return BATCH_DEFAULT if job_type in ("batch", "sysbatch") else SERVICE_DEFAULT


def policy_for(job_type: str, group: Mapping[str, Any] | None, task: Mapping[str, Any] | None) -> RestartPolicy:
    """The task's policy: its ``restart`` fields over the group's over the job type's defaults.
    Values are as the job schema left them (durations as strings); bad ones raise ConfigError
    naming the field."""
    base = default_policy(job_type)
    fields: dict[str, Any] = {}
    for block in (group or {}, task or {}):
        fields.update({k: v for k, v in block.items() if v is not None})
    return RestartPolicy(
        attempts=int(fields.get("attempts", base.attempts)),
        interval=_seconds(fields, "interval", base.interval),
        delay=_seconds(fields, "delay", base.delay),
        mode=str(fields.get("mode", base.mode)),
        render_templates=bool(fields.get("render_templates", base.render_templates)),
    )


def _seconds(fields: Mapping[str, Any], key: str, default: float) -> float:
    value = fields.get(key)
    if value is None:
        return default
    return parse_duration(str(value), f"restart.{key}")


MIN_INTERVAL = 5.0  # Nomad's RestartPolicyMinInterval


def policy_problems(policy: RestartPolicy) -> list[str]:
    """What Nomad's RestartPolicy.Validate refuses, in its words."""
    out = []
    if policy.mode not in MODES:
        out.append(f'restart: Unsupported restart mode: "{policy.mode}"; use "fail" or "delay"')
    if policy.attempts < 0:
        out.append(f"restart: attempts must be zero or more, got {policy.attempts}")
    if policy.attempts == 0 and policy.mode != "fail":
        out.append(f'restart: Restart policy "{policy.mode}" with 0 attempts is ambiguous; use mode "fail"')
    if policy.interval < MIN_INTERVAL:
        out.append(
            f"restart: Interval can not be less than {go_duration(MIN_INTERVAL)} (got {go_duration(policy.interval)})"
        )
    if policy.attempts * policy.delay > policy.interval:
        out.append(
            f"restart: Nomad can't restart the TaskGroup {policy.attempts} times in an interval of "
            f"{go_duration(policy.interval)} with a delay of {go_duration(policy.delay)}"
        )
    return out


def restarts_on_success(job_type: str, lifecycle_hook: str = "", sidecar: bool = False) -> bool:
    """Whether a successful exit counts as a failure to restart (Nomad's NewRestartTracker)."""
    on_success = job_type not in ("batch", "sysbatch")
    if lifecycle_hook in ("prestart", "poststart"):
        on_success = sidecar
    if lifecycle_hook == "poststop":
        on_success = False
    return on_success


class RestartTracker:
    """One task's restarts. Report the outcome of a run with :meth:`exited` or
    :meth:`start_failed` (or :meth:`killed`), then ask :meth:`state`."""

    def __init__(
        self,
        policy: RestartPolicy,
        job_type: str,
        lifecycle_hook: str = "",
        sidecar: bool = False,
        *,
        clock: Callable[[], float] = time.monotonic,
        rand: random.Random | None = None,
        count: int = 0,
    ) -> None:
        self.policy = policy
        self.on_success = restarts_on_success(job_type, lifecycle_hook, sidecar)
        self.clock = clock
        self.rand = rand or random.Random()
        self.start_time = clock()
        self.count = count  # failures in the current interval, as Nomad counts them
        self.restarts = 0  # restarts done in all, for status
        self.reason = ""
        self._exit: ExitResult | None = None
        self._start_error: bool | None = None  # recoverable?
        self._failure = False
        self._killed = False

    def exited(self, result: ExitResult) -> RestartTracker:
        self._exit, self._failure = result, True
        return self

    def start_failed(self, recoverable: bool) -> RestartTracker:
        self._start_error, self._failure = recoverable, True
        return self

    def killed(self) -> RestartTracker:
        self._killed = True
        return self

    def state(self) -> tuple[str, float]:
        """(event type, delay in seconds): RESTARTING after the delay, NOT_RESTARTING (the task
        failed), TERMINATED (it is done), KILLED, or "" when nothing was reported."""
        try:
            return self._state()
        finally:
            self._exit, self._start_error, self._failure, self._killed = None, None, False, False

    def _state(self) -> tuple[str, float]:
        if self._killed:
            self.reason = ""
            return KILLED, 0.0
        if self.policy.attempts == 0:
            self.reason = REASON_NO_RESTARTS
            if not self.on_success and self._exit is not None and self._exit.successful:
                return TERMINATED, 0.0
            return NOT_RESTARTING, 0.0
        now = self.clock()
        if now > self.start_time + self.policy.interval:
            self.count, self.start_time = 0, now
        self.count += 1
        if not self._failure:
            return "", 0.0
        if self._start_error is not None:
            if not self._start_error:
                self.reason = REASON_UNRECOVERABLE
                return NOT_RESTARTING, 0.0
        elif self._exit is not None and self._exit.successful and not self.on_success:
            self.reason = REASON_SUCCESS
            return TERMINATED, 0.0
        if self.count > self.policy.attempts:
            if self.policy.mode == "fail":
                self.reason = (
                    f"Exceeded allowed attempts {self.policy.attempts} in interval "
                    f'{go_duration(self.policy.interval)} and mode is "fail"'
                )
                return NOT_RESTARTING, 0.0
            self.reason = REASON_DELAY
            self.restarts += 1
            return RESTARTING, max(0.0, self.start_time + self.policy.interval - now)
        self.reason = REASON_WITHIN_POLICY
        self.restarts += 1
        return RESTARTING, self._jitter()

    def _jitter(self) -> float:
        """The delay plus a random share of up to JITTER of it, in whole nanoseconds as Nomad's."""
        ns = round(self.policy.delay * 1e9) or 1
        return (ns + int(self.rand.randrange(ns) * JITTER)) / 1e9


def event_message(kind: str, *, reason: str = "", delay: float = 0.0, result: ExitResult | None = None,
                  sibling: str = "") -> str:  # fmt: skip
    """The sentence Nomad shows for a task event of this type."""
    if kind == RESTARTING:
        within = f"Task restarting in {go_duration(delay)}"
        return f"{reason} - {within}" if reason and reason != REASON_WITHIN_POLICY else within
    if kind == NOT_RESTARTING:
        return reason or "Task exceeded restart policy"
    if kind == TERMINATED:
        assert result is not None
        parts = [f"Exit Code: {result.exit_code}"]
        if result.signal:
            parts.append(f"Signal: {result.signal}")
        if result.oom_killed:
            parts.append("OOM Killed: true")
        return ", ".join(parts)
    if kind == SIBLING_FAILED:
        return f'Task\'s sibling "{sibling}" failed'
    if kind == MAIN_DEAD:
        return "Main tasks in the group died"
    if kind == LEADER_DEAD:
        return "Leader Task in Group dead"
    if kind == KILLED:
        return "Task successfully killed"
    return reason


def go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration prints it: 15s, 17.843021571s, 30m0s, 24h0m0s, 1.5ms."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _fraction(ns, size) + unit
    hours, rest = divmod(ns, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    secs = _fraction(rest, 10**9) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}"
    if minutes:
        return f"{sign}{minutes}m{secs}"
    return sign + secs


def _fraction(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}." + f"{frac:0{digits}d}".rstrip("0")
