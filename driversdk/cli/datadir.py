"""``driversdk status``, ``logs`` and ``system gc``: what a data dir records, read (and collected) directly."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from driversdk.cli.common import resolve_data_dir


def cmd_status(args: argparse.Namespace) -> int:
    """Tasks that `driversdk run` started on this client, newest last."""
    from driversdk.agent.state.runstate import RunState

    state = RunState(resolve_data_dir(args, existing=True))
    records = state.tasks()
    if args.json:
        rows = [
            {**{k: v for k, v in r.__dict__.items() if k != "handle"}, "events": state.task_events(r.alloc_id, r.task)}
            for r in records
        ]
        rows += [
            {"alloc_id": a.alloc_id, "job": a.job, "group": a.group, "task": None, "state": a.state}
            for a in state.allocs_without_tasks()
        ]
        print(json.dumps(rows, indent=2))
        return 0
    # An allocation that failed before any task started (its CSI volumes could not be claimed or
    # mounted, its network not set up) has no task record, but the operator must see it.
    taskless = state.allocs_without_tasks()
    if not records and not taskless:
        print("no tasks have been run with this data_dir")
    for r in records:
        result = "" if r.exit_code is None else f" exit={r.exit_code}" + (f" signal={r.signal}" if r.signal else "")
        oom = " oom-killed" if r.oom else ""
        restarted = f" restarts={r.restarts}" if r.restarts else ""
        said = _last_events(state.task_events(r.alloc_id, r.task), failed=r.state in ("failed", "lost"))
        print(f"{r.alloc_id[:8]}  {r.job}/{r.group}/{r.task}  {r.driver:<8} {r.state}{result}{oom}{restarted}{said}")
    for a in taskless:
        why = (
            "no task started: a prerun hook (CSI volumes, network) failed" if a.state == "failed" else "no task started"
        )
        print(f"{a.alloc_id[:8]}  {a.job}/{a.group}  {'-':<8} {a.state} ({why}; its run printed the reason)")
    return 0


# Events that say why a task failed, the most recent of them being the reason `status` gives.
_FAILING = ("Driver Failure", "Setup Failure", "Failed Restoring Task", "failed")


def _last_events(events: list[dict[str, Any]], *, failed: bool) -> str:
    """``  <type>: <message>`` of a task's last event (its end line aside, which only repeats
    the exit), and for a failed task the event that failed it when that is an earlier one."""

    def say(e: dict[str, Any]) -> str:
        return f"{e.get('type', '')}: {e.get('message', '')}"

    shown = [e for e in events if e.get("type") != "finished"]
    if not shown:
        return ""
    out = f"  {say(shown[-1])}"
    if failed:
        reasons = [
            e
            for e in shown
            if e.get("type") in _FAILING
            or (e.get("type") == "Terminated" and (e.get("exit_code") or e.get("signal") or e.get("details")))
        ]
        if reasons and reasons[-1] is not shown[-1]:
            out += f"; failed by {say(reasons[-1])}"
    return out


def cmd_system_gc(args: argparse.Namespace) -> int:
    """Collect every terminal allocation of the data dir now (Nomad's ``nomad system gc``): exit 0
    when all were collected, 1 when one had to be kept (each said in one line on stderr)."""
    from driversdk.agent.allocgc import GCPolicy, collect
    from driversdk.agent.state.runstate import RunState

    data_dir = resolve_data_dir(args, existing=True)
    state = RunState(data_dir)
    try:
        report = collect(data_dir, state, GCPolicy(), everything=True)
    finally:
        state.close()
    for alloc_id, job, _ in report.collected:
        print(f'garbage collected allocation {alloc_id[:8]} of job "{job}"')
    for _, why in report.kept:
        print(f"error: {why}", file=sys.stderr)
    print(f"{len(report.collected)} terminal allocation(s) garbage collected, {len(report.kept)} kept")
    return 1 if report.kept else 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Print a task's collected log files in order (or their last -n lines); -f keeps following
    while the task runs, woken by inotify when the files grow or rotate."""
    from driversdk import logtail
    from driversdk.agent.state.runstate import RunState, RunStateError

    data_dir = resolve_data_dir(args, existing=True)
    state = RunState(data_dir)
    records = [
        r for r in state.tasks() if r.task == args.task and (not args.alloc or r.alloc_id.startswith(args.alloc))
    ]
    if not records:
        raise RunStateError(f"task {args.task!r} has not been run with this data_dir; `driversdk status` lists tasks")
    record = records[-1]
    kind = "stderr" if args.stderr else "stdout"
    logs = logtail.LogDir.open(record.alloc_dir, record.task, kind)
    if logs is None or (not logs.indexes() and record.state != "running"):
        raise RunStateError(f"log entry for task {args.task!r} and log type {kind!r} not found (were logs disabled?)")
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()  # a follower's reader sees each chunk as it arrives

    def running() -> bool:
        now = [r for r in state.tasks(record.alloc_id) if r.task == record.task]
        return bool(now) and now[0].state == "running"

    def collector_alive() -> bool:
        if not record.logmon_pid:
            return False
        try:
            os.kill(record.logmon_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    try:
        if args.tail is not None:
            text, follower = logtail.last_lines(logs, args.tail)
            write(text)
        else:
            follower = logtail.Follower(logs)
        try:
            if not args.follow:
                if args.tail is None:
                    follower.drain(write)
                return 0
            logtail.follow(follower, write, running, collector_alive=collector_alive)
        finally:
            follower.close()
    finally:
        logs.close()
        state.close()
    return 0
