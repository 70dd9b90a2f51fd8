"""`driversdk alloc status` and `driversdk alloc logs`: an allocation as Nomad's CLI shows it
(its tasks, every event with its time, ports and volumes) and a task's logs, through the agent's
HTTP API (``GET /v1/allocation/:id``, ``GET /v1/client/fs/logs/:alloc``)."""

from __future__ import annotations

import argparse
import json
import sys

from driversdk.cli.apiclient import AgentClient, APIRequestError
from driversdk.cli.apiverbs import (
    VerbError,
    age,
    api_flags,
    client_of,
    fields,
    print_json,
    say,
    short,
    table,
    timestamp,
)
from driversdk.cli.parsing import line_count

# Not typing.TYPE_CHECKING: importing typing costs a verb ~2 ms (type checkers know this spelling).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any


def add_parsers(sub: Any, where: argparse.ArgumentParser) -> None:
    flags = api_flags()
    alloc = sub.add_parser("alloc", help="the agent's allocations: status, logs")
    alloc_sub = alloc.add_subparsers(dest="alloc_cmd", required=True)
    status = alloc_sub.add_parser(
        "status", parents=[flags, where], help="an allocation: its tasks, every event, ports and volumes"
    )
    status.add_argument("alloc", metavar="ALLOC", help="allocation id (a unique prefix is enough)")
    status.add_argument("-verbose", "--verbose", action="store_true", help="full ids")
    status.set_defaults(func=cmd_alloc_status)
    logs = alloc_sub.add_parser("logs", parents=[flags, where], help="a task's stdout (or -stderr)")
    logs.add_argument("alloc", metavar="ALLOC", help="allocation id (a unique prefix is enough)")
    logs.add_argument("task", metavar="TASK", nargs="?", help="the task (needed when the group has several)")
    logs.add_argument("-stderr", "--stderr", action="store_true", help="the task's stderr instead of its stdout")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the task ends")
    logs.add_argument("-n", "--tail", type=line_count, metavar="N", help="only the last N lines")
    logs.set_defaults(func=cmd_alloc_logs, logs_parser=logs)


def _allocation(client: AgentClient, wanted: str) -> dict[str, Any]:
    try:
        alloc: dict[str, Any] = client.get(f"/v1/allocation/{wanted}")
    except APIRequestError as err:
        if err.status == 404:
            raise VerbError(
                f'allocation "{wanted}" not found on the agent; `driversdk job status JOB` lists a job\'s allocations'
            ) from None
        raise
    return alloc


def _group(alloc: dict[str, Any]) -> dict[str, Any]:
    job = alloc.get("Job") or {}
    for group in job.get("TaskGroups") or []:
        if isinstance(group, dict) and group.get("Name") == alloc.get("TaskGroup"):
            return group
    return {}


# --- status -------------------------------------------------------------------------------------


def cmd_alloc_status(args: argparse.Namespace) -> int:
    alloc = _allocation(client_of(args), args.alloc)
    if args.json:
        print_json(alloc)
        return 0
    verbose = args.verbose
    say(
        fields(
            [
                ("ID", short(alloc["ID"], verbose)),
                ("Eval ID", short(alloc.get("EvalID") or "", verbose)),
                ("Name", alloc.get("Name")),
                ("Node ID", short(alloc.get("NodeID") or "", verbose)),
                ("Node Name", alloc.get("NodeName")),
                ("Job ID", alloc.get("JobID")),
                ("Job Version", alloc.get("JobVersion")),
                ("Client Status", alloc.get("ClientStatus")),
                ("Client Description", alloc.get("ClientDescription")),
                ("Desired Status", alloc.get("DesiredStatus")),
                ("Desired Description", alloc.get("DesiredDescription")),
                ("Created", age(alloc.get("CreateTime"))),
                ("Modified", age(alloc.get("ModifyTime"))),
            ]
        )
    )
    group = _group(alloc)
    ports = ((alloc.get("AllocatedResources") or {}).get("Shared") or {}).get("Ports") or []
    if ports:
        say("\nAllocation Addresses:")
        say(table(("Label", "Dynamic", "Address"), [_port_row(p, group) for p in ports]))
    states = alloc.get("TaskStates") or {}
    tasks = [t for t in group.get("Tasks") or [] if isinstance(t, dict)]
    names = [str(t.get("Name")) for t in tasks] + [n for n in states if n not in {t.get("Name") for t in tasks}]
    for name in names:
        task = next((t for t in tasks if t.get("Name") == name), {})
        _task(name, task, states.get(name), group)
    return 0


def _port_row(port: dict[str, Any], group: dict[str, Any]) -> tuple[str, str, str]:
    reserved = {
        p.get("Label")
        for network in group.get("Networks") or []
        if isinstance(network, dict)
        for p in network.get("ReservedPorts") or []
        if isinstance(p, dict)
    }
    address = f"{port.get('HostIP') or '127.0.0.1'}:{port.get('Value')}"
    if port.get("To"):
        address += f" -> {port['To']}"
    return "*" + str(port.get("Label")), "no" if port.get("Label") in reserved else "yes", address


def _task(name: str, spec: dict[str, Any], state: dict[str, Any] | None, group: dict[str, Any]) -> None:
    state = state or {"State": "pending", "Events": []}
    say(f'\nTask "{name}" is "{state.get("State")}"' + (" (failed)" if state.get("Failed") else ""))
    say(
        fields(
            [
                ("Driver", spec.get("Driver")),
                ("Restarts", state.get("Restarts", 0)),
                ("Last Restart", state.get("LastRestart") or "N/A"),
                ("Started At", state.get("StartedAt") or "N/A"),
                ("Finished At", state.get("FinishedAt") or "N/A"),
            ]
        )
    )
    mounts = _mounts(spec, group)
    if mounts:
        say("\nVolumes:")
        say(table(("Volume", "Type", "Source", "Destination", "Read Only"), mounts))
    say("\nEvents:")
    events = sorted(state.get("Events") or [], key=lambda e: e.get("Time") or 0)  # newest last
    if not events:
        say("No events")
        return
    say(
        table(
            ("Time", "Type", "Description"), [(timestamp(e.get("Time")), e.get("Type"), _describe(e)) for e in events]
        )
    )


def _mounts(spec: dict[str, Any], group: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The task's volume mounts, each with the group volume it mounts (host or CSI)."""
    volumes = group.get("Volumes") or {}
    rows = []
    for mount in spec.get("VolumeMounts") or []:
        if not isinstance(mount, dict):
            continue
        volume = volumes.get(mount.get("Volume")) if isinstance(volumes, dict) else None
        volume = volume if isinstance(volume, dict) else {}
        read_only = bool(mount.get("ReadOnly")) or bool(volume.get("ReadOnly"))
        rows.append((str(mount.get("Volume")), str(volume.get("Type") or "host"), str(volume.get("Source") or ""),
                     str(mount.get("Destination") or ""), str(read_only).lower()))  # fmt: skip
    return rows


def _describe(event: dict[str, Any]) -> str:
    """The event's message, with its exit code or signal when the message does not say it."""
    text = str(event.get("DisplayMessage") or event.get("Message") or "")
    extra = []
    if event.get("Type") == "Terminated" and "xit" not in text:
        extra.append(f"Exit Code: {event.get('ExitCode', 0)}")
        if event.get("Signal"):
            extra.append(f"Signal: {event['Signal']}")
    return ", ".join([p for p in (text, *extra) if p])


# --- logs ---------------------------------------------------------------------------------------


def cmd_alloc_logs(args: argparse.Namespace) -> int:
    if args.json and args.tail is not None:
        args.logs_parser.error("-n cuts lines of the text; it does not apply with --json (the agent's frames)")
    client = client_of(args)
    alloc = _allocation(client, args.alloc)
    task = _task_name(alloc, args.task)
    path = f"/v1/client/fs/logs/{alloc['ID']}"
    query: dict[str, Any] = {"task": task, "type": "stderr" if args.stderr else "stdout"}
    out = sys.stdout.buffer
    if args.json:
        for frame in _frames(client.stream(path, **query, follow="true" if args.follow else None)):
            print(json.dumps(frame), flush=True)
        return 0
    query["plain"] = "true"
    skip = 0
    if args.tail is not None:
        # Followed: the whole log once, its length then skipped in the followed stream.
        data = b"".join(client.stream(path, **query)) if args.follow else _tail(client, path, query, args.tail)
        skip = len(data)
        out.write(b"".join(data.splitlines(keepends=True)[-args.tail :]) if args.tail else b"")
        out.flush()
        if not args.follow:
            return 0
    stream = client.stream(path, **query, follow="true" if args.follow else None)
    for chunk in stream:
        if skip:  # already shown by -n: the log read once before following it
            cut = min(skip, len(chunk))
            chunk, skip = chunk[cut:], skip - cut
        if chunk:
            out.write(chunk)
            out.flush()
    return 0


def _task_name(alloc: dict[str, Any], wanted: str | None) -> str:
    tasks = [str(t.get("Name")) for t in _group(alloc).get("Tasks") or [] if isinstance(t, dict)]
    tasks = tasks or sorted(alloc.get("TaskStates") or {})
    if wanted is None:
        if len(tasks) == 1:
            return tasks[0]
        raise VerbError(
            f"allocation {alloc['ID'][:8]} has {len(tasks)} tasks ({', '.join(tasks)}); name the one whose logs to show"
        )
    if wanted not in tasks:
        raise VerbError(f'task "{wanted}" is not in allocation {alloc["ID"][:8]}; its tasks: {", ".join(tasks)}')
    return wanted


def _tail(client: AgentClient, path: str, query: dict[str, Any], lines: int) -> bytes:
    """The log's end holding at least ``lines`` whole lines: read from the end (origin=end) with a
    larger offset until enough lines came back or the whole log did."""
    offset = max(4096, lines * 256)
    while True:
        data = b"".join(client.stream(path, **query, origin="end", offset=offset))
        if len(data) < offset or data.count(b"\n") > lines:
            return data
        offset *= 4


def _frames(stream: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """The agent's StreamFrames (JSON objects one after another) as they arrive."""
    decoder = json.JSONDecoder()
    buffer = ""
    for chunk in stream:
        buffer += chunk.decode("utf-8", "replace")
        while buffer.strip():
            try:
                frame, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                break
            buffer = buffer.lstrip()[end:]
            yield frame
