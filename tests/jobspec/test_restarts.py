"""The restart tracker (driversdk.jobspec.restarts): Nomad's restart rules on a fake clock."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from driversdk.errors import ConfigError
from driversdk.jobspec import restarts
from driversdk.jobspec.job import parse_job
from driversdk.jobspec.restarts import (
    NOT_RESTARTING,
    RESTARTING,
    TERMINATED,
    RestartPolicy,
    RestartTracker,
    event_message,
    go_duration,
    policy_for,
    policy_problems,
)
from driversdk.model import ExitResult

FAILED = ExitResult(exit_code=1)
OK = ExitResult(exit_code=0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tracker(policy: RestartPolicy, job_type: str = "batch", hook: str = "", sidecar: bool = False) -> RestartTracker:
    return RestartTracker(policy, job_type, hook, sidecar, clock=Clock(), rand=random.Random(7))


def test_restarts_defaults_follow_the_job_type() -> None:
    assert policy_for("service", None, None) == RestartPolicy(2, 1800.0, 15.0, "fail")
    assert policy_for("system", None, None) == restarts.SERVICE_DEFAULT
    assert policy_for("batch", None, None) == RestartPolicy(3, 86400.0, 15.0, "fail")
    assert policy_for("sysbatch", None, None) == restarts.BATCH_DEFAULT


def test_restarts_task_fields_override_group_fields_over_the_defaults() -> None:
    policy = policy_for("batch", {"attempts": 5, "delay": "2s"}, {"delay": "1s", "mode": "delay"})
    assert policy == RestartPolicy(attempts=5, interval=86400.0, delay=1.0, mode="delay")
    with pytest.raises(ConfigError, match=r"restart\.delay"):
        policy_for("batch", {"delay": "soon"}, None)


def test_restarts_policy_problems_in_nomads_words() -> None:
    assert policy_problems(RestartPolicy(2, 60.0, 15.0, "sometimes")) == [
        'restart: Unsupported restart mode: "sometimes"; use "fail" or "delay"'
    ]
    assert policy_problems(RestartPolicy(5, 60.0, 15.0)) == [
        "restart: Nomad can't restart the TaskGroup 5 times in an interval of 1m0s with a delay of 15s"
    ]
    assert policy_problems(RestartPolicy(1, 1.0, 0.0)) == ["restart: Interval can not be less than 5s (got 1s)"]
    assert policy_problems(RestartPolicy(0, 60.0, 1.0, "delay"))[0].startswith('restart: Restart policy "delay"')


def test_restarts_within_attempts_then_not_restarting_in_mode_fail() -> None:
    t = tracker(RestartPolicy(attempts=2, interval=1800.0, delay=15.0, mode="fail"), "service")
    for _ in range(2):
        kind, delay = t.exited(FAILED).state()
        assert kind == RESTARTING
        assert 15.0 <= delay <= 15.0 * 1.25  # Nomad's jitter: up to a quarter more
        assert t.reason == restarts.REASON_WITHIN_POLICY
    assert t.exited(FAILED).state() == (NOT_RESTARTING, 0.0)
    assert t.reason == 'Exceeded allowed attempts 2 in interval 30m0s and mode is "fail"'
    assert t.restarts == 2


def test_restarts_mode_delay_waits_out_the_interval() -> None:
    t = tracker(RestartPolicy(attempts=1, interval=60.0, delay=1.0, mode="delay"))
    assert t.exited(FAILED).state()[0] == RESTARTING
    assert isinstance(t.clock, Clock)
    t.clock.now += 10
    kind, delay = t.exited(FAILED).state()
    assert (kind, delay, t.reason) == (RESTARTING, 50.0, restarts.REASON_DELAY)
    t.clock.now += 51  # a new interval: the count starts again
    assert t.exited(FAILED).state()[0] == RESTARTING
    assert t.reason == restarts.REASON_WITHIN_POLICY


def test_restarts_success_ends_batch_and_non_sidecar_hooks_but_restarts_service() -> None:
    policy = RestartPolicy(attempts=2, interval=60.0, delay=1.0)
    assert tracker(policy, "batch").exited(OK).state() == (TERMINATED, 0.0)
    assert tracker(policy, "service").exited(OK).state()[0] == RESTARTING
    assert tracker(policy, "service", "prestart").exited(OK).state() == (TERMINATED, 0.0)
    assert tracker(policy, "service", "prestart", sidecar=True).exited(OK).state()[0] == RESTARTING
    assert tracker(policy, "service", "poststart", sidecar=True).exited(OK).state()[0] == RESTARTING
    assert tracker(policy, "service", "poststop").exited(OK).state() == (TERMINATED, 0.0)


def test_restarts_zero_attempts_and_unrecoverable_start_errors_never_restart() -> None:
    t = tracker(RestartPolicy(attempts=0, interval=60.0, delay=1.0))
    assert t.exited(FAILED).state() == (NOT_RESTARTING, 0.0)
    assert t.reason == restarts.REASON_NO_RESTARTS
    assert t.exited(OK).state() == (TERMINATED, 0.0)
    t = tracker(RestartPolicy(attempts=3, interval=60.0, delay=1.0))
    assert t.start_failed(recoverable=False).state() == (NOT_RESTARTING, 0.0)
    assert t.reason == restarts.REASON_UNRECOVERABLE
    assert t.start_failed(recoverable=True).state()[0] == RESTARTING
    assert t.killed().state() == (restarts.KILLED, 0.0)


def test_restarts_event_messages_are_nomads() -> None:
    assert event_message(RESTARTING, reason=restarts.REASON_WITHIN_POLICY, delay=15.0) == "Task restarting in 15s"
    assert (
        event_message(RESTARTING, reason=restarts.REASON_DELAY, delay=90.5)
        == "Exceeded allowed attempts, applying a delay - Task restarting in 1m30.5s"
    )
    assert event_message(NOT_RESTARTING, reason="x") == "x"
    assert event_message(TERMINATED, result=ExitResult(exit_code=2, signal=9)) == "Exit Code: 2, Signal: 9"
    assert event_message(restarts.SIBLING_FAILED, sibling="init") == 'Task\'s sibling "init" failed'


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (15, "15s"),
        (17.843021571, "17.843021571s"),
        (1800, "30m0s"),
        (86400, "24h0m0s"),
        (90.5, "1m30.5s"),
        (0.0015, "1.5ms"),
        (2e-6, "2µs"),
        (3661, "1h1m1s"),
    ],
)
def test_restarts_go_duration_prints_as_go(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_restarts_job_file_problems_name_the_block(tmp_path: Path) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(
        'job "j" {\n  group "g" {\n    restart {\n      mode = "sometimes"\n    }\n'
        '    task "t" {\n      driver = "docker"\n      lifecycle {\n        hook = "later"\n      }\n'
        '      restart {\n        attempts = 9\n        interval = "1m"\n      }\n    }\n  }\n}\n'
    )
    parsed, problems = parse_job(job)
    said = [(p.task, p.field, p.message) for p in problems]
    assert ("", "restart", 'restart: Unsupported restart mode: "sometimes"; use "fail" or "delay"') in said
    assert (
        "t",
        "restart",
        "restart: Nomad can't restart the TaskGroup 9 times in an interval of 1m0s with a delay of 15s",
    ) in said
    assert ("t", "lifecycle.hook", 'lifecycle: invalid hook: later; use "prestart", "poststart" or "poststop"') in said
    assert not any("restart" in note or "lifecycle" in note for note in parsed.notes)
