"""`driversdk job status` and `driversdk job stop`: Nomad's job verbs, through the agent's HTTP API.

A stop given while no agent runs is not lost: the job is marked stopped in the data dir's
``state.db`` (under the data dir's lock, so no agent starts meanwhile) and the agent, when it
starts again, recovers the job only to stop it.
"""

from __future__ import annotations

import argparse
import os
import time

from driversdk.cli.apiclient import DEFAULT_DATA_DIR, AgentClient, AgentUnreachable, APIRequestError, job_path
from driversdk.cli.apiverbs import (
    TERMINAL,
    VerbError,
    age,
    api_flags,
    client_of,
    data_dir_of,
    fields,
    print_json,
    say,
    short,
    table,
    warn,
)

# Not typing.TYPE_CHECKING: importing typing costs a verb ~2 ms (type checkers know this spelling).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def add_parsers(sub: Any, where: argparse.ArgumentParser) -> None:
    flags = api_flags()
    job = sub.add_parser("job", help="the agent's jobs: status, stop")
    job_sub = job.add_subparsers(dest="job_cmd", required=True)
    status = job_sub.add_parser(
        "status", parents=[flags, where], help="list the agent's jobs, or show one with its allocations"
    )
    status.add_argument("job", nargs="?", metavar="JOB", help="a job id (or a unique prefix of one)")
    status.add_argument("-verbose", "--verbose", action="store_true", help="full ids")
    status.set_defaults(func=cmd_job_status)
    stop = job_sub.add_parser(
        "stop",
        parents=[flags, where],
        help="stop a job and wait until its allocations are over (recorded for the agent if it is not running)",
    )
    stop.add_argument("job", metavar="JOB")
    stop.add_argument("-purge", "--purge", action="store_true", help="forget the job once it is stopped")
    stop.add_argument("-detach", "--detach", action="store_true", help="return at once, without waiting")
    stop.set_defaults(func=cmd_job_stop)


# --- status -------------------------------------------------------------------------------------


def cmd_job_status(args: argparse.Namespace) -> int:
    client = client_of(args)
    if not args.job:
        jobs = client.get("/v1/jobs") or []
        if args.json:
            print_json(jobs)
        elif not jobs:
            say("No running jobs")
        else:
            rows = [(j["ID"], j["Type"], j["Priority"], j["Status"], _date(j.get("SubmitTime"))) for j in jobs]
            say(table(("ID", "Type", "Priority", "Status", "Submit Date"), rows))
        return 0
    job = _find_job(client, args.job)
    path = job_path(job["ID"])
    allocs = client.get(path + "/allocations") or []
    summary = client.get(path + "/summary")
    if args.json:
        # As `nomad job status -json JOB`: one object per job, its summary and allocations beside it.
        print_json([{"Job": job, "Summary": summary, "Allocations": allocs, "LatestDeployment": None,
                     "Evaluations": []}])  # fmt: skip
        return 0
    say(
        fields(
            [
                ("ID", job["ID"]),
                ("Name", job.get("Name") or job["ID"]),
                ("Submit Date", _date(job.get("SubmitTime"))),
                ("Type", job.get("Type")),
                ("Priority", job.get("Priority")),
                ("Datacenters", ",".join(job.get("Datacenters") or ["*"])),
                ("Namespace", job.get("Namespace")),
                ("Status", job.get("Status")),
                ("Periodic", str(bool(job.get("Periodic"))).lower()),
                ("Parameterized", str(bool(job.get("ParameterizedJob"))).lower()),
            ]
        )
    )
    groups = (summary or {}).get("Summary") or {}
    if groups:
        keys = ("Queued", "Starting", "Running", "Failed", "Complete", "Lost", "Unknown")
        say("\nSummary")
        say(
            table(("Task Group", *keys), [(name, *(counts.get(k, 0) for k in keys)) for name, counts in groups.items()])
        )
    say("\nAllocations")
    if not allocs:
        say("No allocations placed")
        return 0
    allocation_rows = [
        (
            short(a["ID"], args.verbose),
            short(a.get("NodeID") or "", args.verbose),
            a["TaskGroup"],
            a.get("JobVersion", 0),
            a["DesiredStatus"],
            a["ClientStatus"],
            age(a.get("CreateTime")),
            age(a.get("ModifyTime")),
        )
        for a in sorted(allocs, key=lambda a: a.get("CreateTime") or 0, reverse=True)
    ]
    headers = ("ID", "Node ID", "Task Group", "Version", "Desired", "Status", "Created", "Modified")
    say(table(headers, allocation_rows))
    return 0


def _find_job(client: AgentClient, wanted: str) -> dict[str, Any]:
    """The job by its id, else by a unique prefix (as Nomad's CLI takes one)."""
    try:
        found: dict[str, Any] = client.get(job_path(wanted))
        return found
    except APIRequestError as err:
        if err.status != 404:
            raise
    matches = client.get("/v1/jobs", prefix=wanted) or []
    if len(matches) == 1:
        job: dict[str, Any] = client.get(job_path(matches[0]["ID"]))
        return job
    if matches:
        names = ", ".join(m["ID"] for m in matches)
        raise VerbError(f'job prefix "{wanted}" matches {len(matches)} jobs ({names}); give the whole id')
    raise VerbError(f'job "{wanted}" not found on the agent; `driversdk job status` lists its jobs')


def _date(nanoseconds: int | None) -> str:
    if not nanoseconds:
        return "<none>"
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(nanoseconds / 1e9))


# --- stop ---------------------------------------------------------------------------------------


def cmd_job_stop(args: argparse.Namespace) -> int:
    try:
        client = client_of(args)
        job = _find_job(client, args.job)
    except AgentUnreachable as err:
        return _stop_offline(args, err)
    path = job_path(job["ID"])
    before = client.get(path + "/allocations") or []
    answer, index = client.request("DELETE", path, {"purge": "true"} if args.purge else None)
    if args.detach:
        if args.json:
            print_json(answer)
        else:
            say(f'Job "{job["ID"]}" is being stopped (evaluation {answer.get("EvalID", "")})')
        return 0
    allocs = _wait_terminal(client, path, [a["ID"] for a in before], index)
    if args.json:
        print_json(answer)
        return 0
    what = "stopped and purged" if args.purge else "stopped"
    say(f'==> Job "{job["ID"]}" {what}')
    for alloc in allocs:
        say(f'    Allocation "{alloc["ID"][:8]}" (group "{alloc["TaskGroup"]}"): {alloc["ClientStatus"]}')
    return 0


def _wait_terminal(client: AgentClient, path: str, known: list[str], index: int) -> list[dict[str, Any]]:
    """The job's allocations once every one is over; once the job is purged (the agent purges it
    after its allocations ended) each one known before the stop, as the agent last shows it."""
    while True:
        try:
            allocs, index = client.request("GET", path + "/allocations", {"index": index, "wait": "5s"})
        except APIRequestError as err:
            if err.status != 404:
                raise
            return _last_seen(client, known)
        allocs = allocs or []
        if all(a["ClientStatus"] in TERMINAL for a in allocs):
            return list(allocs)


def _last_seen(client: AgentClient, known: list[str]) -> list[dict[str, Any]]:
    seen = []
    for alloc_id in known:
        try:
            seen.append(client.get(f"/v1/allocation/{alloc_id}"))
        except APIRequestError as err:
            if err.status != 404:
                raise
    return seen


def _stop_offline(args: argparse.Namespace, unreachable: AgentUnreachable) -> int:
    """Record the stop in the data dir when no agent runs on it; the agent stops the job when it
    starts. Only for the local agent: an agent named by address is not this data dir's."""
    named = data_dir_of(args)
    if named is None and (args.api_address or os.environ.get("NOMAD_ADDR")):
        raise unreachable
    data_dir = named or DEFAULT_DATA_DIR
    if not os.path.isfile(os.path.join(data_dir, "state.db")):
        raise unreachable
    # The agent's modules, loaded only here: a stop while the agent is down.
    from driversdk.agent.datadirlock import DataDirBusy, DataDirLock
    from driversdk.agent.state.jobstore import JobStore

    lock = DataDirLock(data_dir)
    try:
        lock.acquire()  # no agent starts (and recovers the job unstopped) while the stop is written
    except DataDirBusy:
        raise VerbError(
            f"{unreachable} The agent that holds the data dir {data_dir} does not answer; the stop was not recorded"
        ) from None
    try:
        store = JobStore(data_dir)
        try:
            record = store.get(args.job)
            if record is None:
                raise VerbError(f'job "{args.job}" not found in the data dir {data_dir} (and no agent is running)')
            already = record.stop
            if not already:
                store.mark_stopped(args.job)
        finally:
            store.close()
    finally:
        lock.release()
    if args.json:
        print_json({"JobID": args.job, "Stop": True, "AgentRunning": False})
    elif already:
        say(f'the agent is not running: job "{args.job}" was already stopped and is stopped when it starts again')
    else:
        say(f'the agent is not running: job "{args.job}" is stopped when it starts again')
    if args.purge:
        warn(f"-purge needs the running agent: run `driversdk job stop -purge {args.job}` once it is up")
        return 1
    return 0
