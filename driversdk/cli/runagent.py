"""`driversdk run JOB` when an agent is running: the job is submitted to it and its allocations
followed, as `nomad job run` does, and nothing runs in this process.

The agent parses the job (``POST /v1/jobs/parse``; a JSON job goes straight to ``PUT /v1/jobs``),
with ``-var``, ``-var-file`` and ``NOMAD_VAR_*`` sent as driversdk's extension fields of the parse
body (see :func:`driversdk.agent.api.routes.parse_job`): the var files are read here, where they are,
and sent as text. Then each new task event of the job's allocations is printed as a line of the
in-process run (:meth:`RunEvent.text`, or its ``--json`` object), from blocking queries, until
every allocation is over (exit 0 when all completed, 1 when one failed). Ctrl-C detaches, as
Nomad's monitor does: the job runs on in the agent, and the command that stops it is printed.

Stdlib, the API client and the event formatter only: this module must not load grpc, a plugin
client or the HCL evaluator (tests/agent/test_run_via_agent.py checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from driversdk.agent.events import RunEvent, RunEventType, error_event
from driversdk.cli.apiclient import AgentClient, AgentUnreachable, APIRequestError, job_path
from driversdk.errors import DriverSDKError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2

TERMINAL = ("complete", "failed", "lost")
VAR_ENV_PREFIX = "NOMAD_VAR_"
# Nomad's task event types that say why a task failed (the reason printed at the end).
_FAILURE_TYPES = ("Driver Failure", "Setup Failure", "Failed Validation", "Task hook failed",
                  "Failed Restoring Task", str(RunEventType.FAILED))  # fmt: skip
# Detail keys RunEvent.to_api adds from its own fields: given back to those fields here.
_FIELD_DETAILS = ("exit_code", "signal", "fails_task")
# How long one blocking query waits before asking again (the agent answers at once on a change).
WAIT = "30s"
# How long the end of a run waits for a task's last events after its allocation is over.
SETTLE_WAIT = "1s"
# -detach waits at most this long (seconds of blocking queries) for the allocations to be placed.
DETACH_WAIT = "10s"


class Refused(DriverSDKError):
    """The run was refused before anything was registered (exit 2)."""


def find_agent(args: argparse.Namespace) -> tuple[AgentClient, bool] | None:
    """The agent to submit to and whether the operator named it (-address / NOMAD_ADDR); None when
    no agent is running here."""
    from driversdk.cli.apiverbs import data_dir_of

    named = bool(getattr(args, "api_address", None) or os.environ.get("NOMAD_ADDR"))
    try:
        client = AgentClient.find(getattr(args, "api_address", None), getattr(args, "api_token", None),
                                  data_dir_of(args))  # fmt: skip
    except AgentUnreachable:
        return None
    client.timeout = None  # blocking queries wait as long as they were asked to
    return client, named


@dataclass
class Submitted:
    id: str
    type: str
    count: int  # allocations the job asks for (its groups' counts)
    earlier: frozenset[str] = frozenset()  # allocations of an earlier run of the same job id: not followed
    periodic: bool = False  # runs nothing itself: the agent launches its children on schedule


def _read(path: str, what: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise Refused(f"cannot read the {what} {path}: {getattr(err, 'strerror', None) or err}") from None


def _api_job(text: str, path: str) -> dict[str, Any]:
    """A JSON job file as PUT /v1/jobs takes it: ``{"Job": {…}}`` or the job object itself."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise Refused(f"{path}: the job file is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise Refused(f'{path}: a JSON job file must hold an object (the job, or {{"Job": …}})')
    for key, value in data.items():
        if key.lower() == "job" and isinstance(value, dict):
            return value
    return data


def parse_body(args: argparse.Namespace, path: str, text: str, env: dict[str, str]) -> dict[str, Any]:
    """The ``POST /v1/jobs/parse`` body of one job file, with its variables."""
    body: dict[str, Any] = {"JobHCL": text, "Canonicalize": True, "JobFile": path}
    if getattr(args, "job_hcl1", False):
        body["hclv1"] = True
    files = [{"Name": p, "Text": _read(p, "var file")} for p in args.var_file or ()]
    if files:
        body["VarFiles"] = files
    if args.var:
        body["VarFlags"] = list(args.var)
    variables = {k: v for k, v in env.items() if k.startswith(VAR_ENV_PREFIX)}
    if variables:
        body["VarEnv"] = variables
    return body


def submit(client: AgentClient, args: argparse.Namespace, paths: Sequence[str]) -> list[Submitted]:
    """Parse every job, then register them: a job the agent refuses leaves none registered (with
    several files, each is validated before any is registered)."""
    jobs: list[dict[str, Any]] = []
    for path in paths:
        text = _read(path, "job file")
        if args.job_json or text.lstrip().startswith("{"):
            jobs.append(_api_job(text, path))
        else:
            jobs.append(
                client.request("POST", "/v1/jobs/parse", body=parse_body(args, path, text, dict(os.environ)))[0]
            )
    if len(jobs) > 1:
        for job in jobs:
            answer = client.request("POST", "/v1/validate/job", body={"Job": job})[0] or {}
            if answer.get("Error"):
                raise APIRequestError(400, str(answer["Error"]))
    done = []
    for job in jobs:
        job_id = str(job.get("ID") or "")
        before = _job(client, job_id) if job_id else None
        earlier = (
            frozenset(a["ID"] for a in _allocations(client, job_id, before is not None)) if job_id else frozenset()
        )
        answer = client.request("PUT", "/v1/jobs", body={"Job": job})[0] or {}
        if (
            before is not None
            and before.get("Status") != "dead"
            and not before.get("Stop")
            and answer.get("JobModifyIndex") == before.get("JobModifyIndex")
        ):
            earlier = frozenset()  # unchanged and still running, so the agent keeps it: its allocations are ours
        groups = [g for g in job.get("TaskGroups") or [] if isinstance(g, dict)]
        count = sum(g["Count"] if isinstance(g.get("Count"), int) else 1 for g in groups)
        periodic = isinstance(job.get("Periodic"), dict) and job["Periodic"].get("Enabled") is not False
        done.append(Submitted(job_id, str(job.get("Type") or "service"), count, earlier, periodic))
    return done


def _job(client: AgentClient, job_id: str) -> dict[str, Any] | None:
    try:
        job: dict[str, Any] = client.get(job_path(job_id))
    except APIRequestError as err:
        if err.status != 404:
            raise
        return None
    return job


def _allocations(client: AgentClient, job_id: str, known: bool) -> list[dict[str, Any]]:
    """The allocations a job id has before this run: its own, or, for a job id the agent does not
    know (never run, or purged), those a purged job of that id left (the agent lists them under
    the new job as well until they are collected)."""
    if not known:
        return [a for a in client.get("/v1/allocations") or [] if a.get("JobID") == job_id]
    try:
        allocs: list[dict[str, Any]] = client.request("GET", job_path(job_id) + "/allocations")[0] or []
    except APIRequestError as err:
        if err.status != 404:
            raise
        return []
    return allocs


def event_of(api: dict[str, Any], alloc: dict[str, Any], task: str) -> RunEvent:
    """An API TaskEvent back as the event the in-process run prints (its fields from the details
    RunEvent.to_api put them in)."""
    details = {str(k): str(v) for k, v in (api.get("Details") or {}).items()}
    exit_text = details.get("exit_code")
    exit_code = int(exit_text) if exit_text and exit_text.lstrip("-").isdigit() else None
    signal_text = details.get("signal")
    signal = int(signal_text) if signal_text and signal_text.isdigit() else (0 if exit_code is not None else None)
    kind = {"plugin": "plugin", "error": "error"}.get(str(api.get("Type")), "task")
    return RunEvent(
        kind,
        str(api.get("Message") or api.get("DisplayMessage") or ""),
        job=str(alloc.get("JobID") or ""),
        group=str(alloc.get("TaskGroup") or ""),
        alloc_id=str(alloc.get("ID") or ""),
        task=task,
        time=(api.get("Time") or 0) / 1e9,
        type=str(api.get("Type") or ""),
        exit_code=exit_code,
        signal=signal,
        fails_task=bool(api.get("FailsTask")),
        kill_timeout=(api.get("KillTimeout") or 0) / 1e9,
        start_delay=(api.get("StartDelay") or 0) / 1e9,
        details={k: v for k, v in details.items() if k not in _FIELD_DETAILS},
    )


def _sorted_events(state: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(state.get("Events") or [], key=lambda e: e.get("Time") or 0)


def task_settled(state: dict[str, Any]) -> bool:
    """A dead task whose closing events are all in (a task ended by itself is dead once its
    Terminated event and the restart policy's verdict are recorded; a start that failed is
    marked dead before its Driver Failure and Not Restarting events)."""
    if state.get("State") != "dead":
        return False
    types = [e.get("Type") for e in state.get("Events") or []]
    if "Not Restarting" in types or "Killed" in types or str(RunEventType.NOT_STARTED) in types:
        return True
    return "Terminated" in types and not state.get("Failed")


def finish_of(state: dict[str, Any], alloc: dict[str, Any], task: str) -> RunEvent | None:
    """The in-process run's closing "finished with …" line of a dead task that ran (the agent
    does not keep it as one of Nomad's events: its last Terminated event says the same)."""
    events = _sorted_events(state)
    terminated = [e for e in events if e.get("Type") == "Terminated"]
    if not terminated:
        return None
    last = event_of(terminated[-1], alloc, task)
    exit_code, signal = last.exit_code if last.exit_code is not None else 0, last.signal or 0
    how = f"signal {signal}" if signal else f"exit code {exit_code}"
    failed = bool(state.get("Failed"))
    if not failed and any(e.get("Type") in ("Killing", "Killed") for e in events):
        how += " (stopped, not failed)"
    elif last.details.get("oom_killed") == "true":
        how += " (killed: out of memory)"
    return RunEvent(
        "task",
        f"finished with {how}",
        job=last.job,
        group=last.group,
        alloc_id=last.alloc_id,
        task=task,
        time=max(float(e.get("Time") or 0) for e in events) / 1e9,
        type=RunEventType.FINISHED,
        exit_code=exit_code,
        signal=signal,
        fails_task=failed,
    )


def failure_of(alloc: dict[str, Any]) -> RunEvent:
    """Why a failed allocation failed, as the error line that ends the run."""
    where = {"job": str(alloc.get("JobID") or ""), "group": str(alloc.get("TaskGroup") or ""),
             "alloc_id": str(alloc.get("ID") or "")}  # fmt: skip
    for task, state in sorted((alloc.get("TaskStates") or {}).items()):
        if not state.get("Failed"):
            continue
        events = _sorted_events(state)
        found = [e for e in events if e.get("Type") in _FAILURE_TYPES]
        finish = finish_of(state, alloc, task)
        if not found and finish is not None:
            return error_event(finish.message, task=task, **where)
        found = found or [e for e in events if e.get("FailsTask")]
        return error_event(str(found[-1].get("Message") or "failed") if found else "failed", task=task, **where)
    return error_event(
        f"the allocation failed before its tasks started; `driversdk alloc status {where['alloc_id'][:8]}` "
        "and the agent's log say why",
        **where,
    )


@dataclass
class Follower:
    """Prints each task event of the followed jobs once, oldest first."""

    client: AgentClient
    jobs: list[Submitted]
    out: Callable[[RunEvent], None]
    seen: set[tuple[str, str, int, str, str]] = field(default_factory=set)
    finished: set[tuple[str, str]] = field(default_factory=set)  # (alloc, task) whose end was printed
    allocs: dict[str, dict[str, Any]] = field(default_factory=dict)
    purged: set[str] = field(default_factory=set)
    placed_none: set[str] = field(default_factory=set)  # jobs the agent ended without an allocation

    def poll(self, index: int, wait: str) -> int:
        """One round: the first job's allocations by a blocking query (the agent's index covers
        every job), the others read at once; prints what is new and returns the new index."""
        fresh: list[RunEvent] = []
        for n, job in enumerate(self.jobs):
            if job.id in self.purged:
                continue
            query = {"index": index, "wait": wait} if n == 0 else None
            try:
                stubs, at = self.client.request("GET", job_path(job.id) + "/allocations", query)
            except APIRequestError as err:
                if err.status != 404:
                    raise
                self.purged.add(job.id)  # stopped with -purge meanwhile: what was seen stays
                continue
            if n == 0:
                index = at
            for stub in stubs or []:
                if stub["ID"] in job.earlier:
                    continue
                if stub.get("TaskStates") is None:  # a stub without its tasks: read the allocation
                    stub = self.client.get(f"/v1/allocation/{stub['ID']}")
                self.allocs[stub["ID"]] = stub
                for task, state in (stub.get("TaskStates") or {}).items():
                    for api in state.get("Events") or []:
                        key = (
                            stub["ID"],
                            task,
                            int(api.get("Time") or 0),
                            str(api.get("Type")),
                            str(api.get("Message")),
                        )
                        if key not in self.seen:
                            self.seen.add(key)
                            fresh.append(event_of(api, stub, task))
                    if (stub["ID"], task) not in self.finished and task_settled(state):
                        self.finished.add((stub["ID"], task))
                        finish = finish_of(state, stub, task)
                        if finish is not None:
                            fresh.append(finish)
        for event in sorted(fresh, key=lambda e: e.time):
            self.out(event)
        return index

    def of(self, job: Submitted) -> list[dict[str, Any]]:
        return [a for a in self.allocs.values() if a.get("JobID") == job.id]

    def over(self) -> bool:
        """Every allocation of every job is over (and each job placed all it asks for, or one
        failed, which ends its run); a job purged meanwhile is over."""
        for job in self.jobs:
            if job.id in self.purged:
                continue
            allocs = self.of(job)
            if not allocs and self._ended_empty(job):
                continue
            if not allocs or any(a.get("ClientStatus") not in TERMINAL for a in allocs):
                return False
            if len(allocs) < job.count and not any(a.get("ClientStatus") != "complete" for a in allocs):
                return False
        return True

    def _ended_empty(self, job: Submitted) -> bool:
        """The job is over with no allocation of this run (its runner failed before placing one).
        Asked only of a job with no earlier allocations: the agent calls a job dead while every
        allocation it lists is over, and the earlier ones are over before this run places any."""
        if job.id in self.placed_none:
            return True
        if job.earlier:
            return False
        found = _job(self.client, job.id)
        if found is None or found.get("Status") == "dead":
            self.placed_none.add(job.id)
            return True
        return False

    def settled(self) -> bool:
        """Every task has said its last word (see :func:`task_settled`)."""
        return all(task_settled(state) for a in self.allocs.values() for state in (a.get("TaskStates") or {}).values())

    def failed(self) -> list[dict[str, Any]]:
        return [a for a in self.allocs.values() if a.get("ClientStatus") in ("failed", "lost")]


def _stop_command(args: argparse.Namespace, job: str) -> str:
    words = ["driversdk", "job", "stop"]
    if getattr(args, "api_address", None):
        words += ["-address", args.api_address]
    return " ".join(shlex.quote(w) for w in [*words, job])


def _say(args: argparse.Namespace, message: str, job: str = "") -> None:
    event = RunEvent("run", message, job=job, type=RunEventType.RUN)
    print(event.json() if args.json else event.text(), flush=True)


def run_via_agent(client: AgentClient, named: bool, args: argparse.Namespace) -> int | None:
    """Submit and follow; None when the local agent's socket is there but no agent answers (the
    caller runs the job in-process, as with no agent)."""
    try:
        jobs = submit(client, args, list(args.job))
    except AgentUnreachable:
        if named:
            raise
        return None
    except (Refused, APIRequestError) as err:
        if isinstance(err, APIRequestError) and err.status != 400:
            raise  # 403 (token), 5xx: main's "error: …", exit 1
        if args.json:
            print(error_event(str(err)).json(), flush=True)
        else:
            for line in str(err).splitlines() or [""]:  # a problem a line, as `validate` lists them
                print(f"error: {line}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    for job in jobs:
        if job.periodic:  # as `nomad job run` of a periodic job: registered, nothing to follow
            stop = _stop_command(args, job.id)
            what = "the agent launches its children on schedule; `driversdk job status` lists them"
            _say(args, f'job "{job.id}" is periodic: {what}, `{stop}` stops it', job=job.id)
    jobs = [j for j in jobs if not j.periodic]
    if not jobs:
        return EXIT_OK
    follower = Follower(client, jobs, lambda e: print(e.json() if args.json else e.text(), flush=True))
    if args.detach:
        return _detached(args, follower)
    names = ", ".join(f'"{j.id}"' for j in jobs)
    _say(args, f"job {names} submitted to the agent at {client.address}; Ctrl-C detaches (the job runs on)")
    index = 0
    try:
        while True:
            index = follower.poll(index, WAIT)
            if follower.over():
                break
        # A start that failed is marked dead before its last events are recorded: wait for them,
        # only while they keep coming.
        while not follower.settled():
            before = len(follower.seen)
            index = follower.poll(index, SETTLE_WAIT)
            if len(follower.seen) == before:
                break
    except KeyboardInterrupt:
        for job in jobs:
            stop = _stop_command(args, job.id)
            _say(args, f'detached: job "{job.id}" keeps running in the agent; stop it with `{stop}`', job=job.id)
        return EXIT_OK
    ends = [failure_of(alloc) for alloc in follower.failed()]
    ends += [
        error_event(
            f'job "{job}" ended without an allocation; `driversdk job status {job}` and the agent\'s log say why',
            job=job,
        )
        for job in sorted(follower.placed_none - follower.purged)
    ]
    for event in ends:
        if args.json:
            print(event.json(), flush=True)
        else:
            print(event.text(), file=sys.stderr, flush=True)
    return EXIT_FAILED if ends else EXIT_OK


def _detached(args: argparse.Namespace, follower: Follower) -> int:
    """-detach: the job ids and the allocations placed so far (waiting briefly for the first)."""
    index = 0
    for _ in range(3):
        if all(follower.of(j) for j in follower.jobs):
            break
        index = _placed(follower, index)
    if args.json:
        print(json.dumps({"Jobs": [{"ID": j.id, "Allocations": sorted(a["ID"] for a in follower.of(j))}
                                   for j in follower.jobs]}, sort_keys=True), flush=True)  # fmt: skip
        return EXIT_OK
    for job in follower.jobs:
        print(f'==> job "{job.id}" submitted to the agent at {follower.client.address}', flush=True)
        for alloc in sorted(follower.of(job), key=lambda a: a.get("CreateTime") or 0):
            print(f'    allocation {alloc["ID"]} (group "{alloc.get("TaskGroup")}")', flush=True)
        print(f"    stop it with `{_stop_command(args, job.id)}`", flush=True)
    return EXIT_OK


def _placed(follower: Follower, index: int) -> int:
    """One blocking round that records the allocations without printing their events."""
    for n, job in enumerate(follower.jobs):
        query = {"index": index, "wait": DETACH_WAIT} if n == 0 and index else None
        stubs, at = follower.client.request("GET", job_path(job.id) + "/allocations", query)
        index = max(index, at)
        for stub in stubs or []:
            if stub["ID"] not in job.earlier:
                follower.allocs[stub["ID"]] = stub
    return index
