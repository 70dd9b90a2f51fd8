"""Nomad's ``/v1`` endpoints the agent serves, each a small handler; :func:`handle` matches the
path and method, checks the token and turns every refusal into Nomad's status code with a
one-sentence body. Paths not served answer 404 with the sentence saying so (the README lists
which endpoints are served).
"""

from __future__ import annotations

import base64
import json
import queue
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from driversdk.agent.api import shapes
from driversdk.agent.api.httpserver import APIError, Request, Response
from driversdk.agent.api.routing import ROUTES, route
from driversdk.errors import DriverSDKError, StateWriteError

if TYPE_CHECKING:
    from driversdk.agent.agent import Agent

# The longest a blocking query waits (Nomad caps ``wait`` at 10 minutes; 5 minutes default).
MAX_WAIT = 600.0
DEFAULT_WAIT = 300.0


# Endpoints reachable without a token even with ACLs on: bootstrapping makes the first token.
_OPEN = {("POST", "/v1/acl/bootstrap"), ("PUT", "/v1/acl/bootstrap")}


def handle(agent: Agent, request: Request) -> Response:
    try:
        if request.over_tcp and agent.settings.acl_enabled and (request.method, request.path.rstrip("/")) not in _OPEN:
            assert agent.tokens is not None
            if not agent.tokens.valid(request.token):
                raise APIError(403, "Permission denied")
        for pattern, table in ROUTES:
            match = pattern.match(request.path)
            if match is None:
                continue
            method = "GET" if request.method == "HEAD" else request.method
            fn = table.get(method)
            if fn is None:
                raise APIError(405, "Invalid method")
            response = fn(agent, request, match)
            response.headers.setdefault("X-Nomad-Index", str(agent.index))
            response.headers.setdefault("X-Nomad-KnownLeader", "true")
            response.headers.setdefault("X-Nomad-LastContact", "0")
            return response
        raise APIError(404, f"Invalid URL path: {request.path} is not an endpoint this agent serves")
    except APIError as err:
        return Response(err.status, err.message)
    except StateWriteError as err:
        return Response(500, str(err))
    except DriverSDKError as err:
        return Response(400, str(err))
    except Exception as err:
        agent.log("error", f"http: {request.method} {request.path}: {type(err).__name__}: {err}")
        return Response(500, f"internal error: {type(err).__name__}: {err}")


def _blocking(agent: Agent, request: Request) -> None:
    """Nomad's blocking query: with ``index``, wait until something changed after it (or ``wait``)."""
    text = request.query.get("index")
    if not text:
        return
    try:
        after = int(text)
    except ValueError:
        raise APIError(400, f"Failed to parse index parameter {text!r}: not a number") from None
    agent.wait_change(after, _duration(request.query.get("wait"), DEFAULT_WAIT))


def _duration(text: str | None, default: float) -> float:
    if not text:
        return default
    from driversdk.durations import parse_duration

    try:
        return min(MAX_WAIT, parse_duration(text, "wait"))
    except DriverSDKError:
        raise APIError(400, f"Failed to parse wait parameter {text!r}: not a duration such as 5s or 1m") from None


# --- jobs ---------------------------------------------------------------------------------------


@route(r"/v1/jobs", "GET")
def list_jobs(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    _blocking(agent, request)
    assert agent.jobs is not None
    prefix = request.query.get("prefix", "")
    return Response(body=[shapes.job_stub(agent, r) for r in agent.jobs.all() if r.id.startswith(prefix)])


def _job_body(request: Request) -> dict[str, Any]:
    body = request.json()
    job = body.get("Job") if isinstance(body, dict) else None
    if not isinstance(job, dict):
        raise APIError(400, "Job must be specified")
    if not job.get("ID"):
        raise APIError(400, "Job ID hasn't been provided")
    return job


def _register(agent: Agent, job: dict[str, Any]) -> Response:
    from driversdk.agent.agent import JobInvalid

    try:
        record = agent.register(job)
    except JobInvalid as err:
        raise APIError(400, str(err)) from None
    return Response(
        body={
            "EvalID": str(uuid.uuid4()),
            "EvalCreateIndex": record.modify_index,
            "JobModifyIndex": record.modify_index,
            "Warnings": "",
            "Index": record.modify_index,
            "LastIndex": record.modify_index,
            "KnownLeader": True,
            "LastContact": 0,
        }
    )


@route(r"/v1/jobs", "PUT", "POST")
def register_job(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    return _register(agent, _job_body(request))


# What a file function says in a job sent over the API: the agent must not read its own host's
# files on behalf of a job that came from elsewhere (Nomad's API refuses them too).
API_FILES_OFF = (
    "file functions read no files in a job sent to the agent (it cannot read the files of the machine the job came "
    "from); put the content in the job file itself, or run the job with `driversdk run` while no agent is running, "
    "which reads files beside the job file"
)


@route(r"/v1/jobs/parse", "PUT", "POST")
def parse_job(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    """Nomad's parse: ``JobHCL`` and ``Variables`` (one var file's text), ``hclv1``. driversdk's
    CLI adds what ``-var``, ``-var-file`` and ``NOMAD_VAR_*`` give it, evaluated as ``validate``
    evaluates them (environment, then var files in order, then -var; the last wins):
    ``VarEnv`` ({"NOMAD_VAR_name": value}), ``VarFiles`` ([{"Name": path, "Text": content}], read
    by the CLI: a name ending in .json is JSON) and ``VarFlags`` (["name=value", …]); ``JobFile``
    names the job in problems instead of ``input.hcl``. Nomad's clients send none of them."""
    from driversdk.jobspec import jobapi
    from driversdk.jobspec.hcl import FilePolicy
    from driversdk.jobspec.jobjson import JobInputs

    body = request.json()
    if not isinstance(body, dict):
        raise APIError(400, "Job spec is empty")
    text = body.get("JobHCL")
    if not isinstance(text, str) or not text.strip():
        raise APIError(400, "Job spec is empty")
    variables = body.get("Variables") or ""
    if not isinstance(variables, str):
        raise APIError(400, "Variables must be the text of a variables file")
    var_texts = [("variables.hcl", variables)] if variables.strip() else []
    for item in body.get("VarFiles") or []:
        if not (isinstance(item, dict) and isinstance(item.get("Name"), str) and isinstance(item.get("Text"), str)):
            raise APIError(400, 'VarFiles must be a list of {"Name": file name, "Text": its content}')
        var_texts.append((item["Name"], item["Text"]))
    flags = body.get("VarFlags") or []
    if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
        raise APIError(400, 'VarFlags must be a list of "NAME=VALUE" strings')
    env = body.get("VarEnv") or {}
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise APIError(400, 'VarEnv must be an object of {"NOMAD_VAR_name": "value"}')
    name = body.get("JobFile") or jobapi.API_FILE
    if not isinstance(name, str) or len(name) > 4096:
        raise APIError(400, "JobFile must be the job file's name")
    inputs = JobInputs(
        vars=flags,
        var_texts=var_texts,
        env={k: v for k, v in env.items() if k.startswith("NOMAD_VAR_")},
        files=FilePolicy(None, API_FILES_OFF),
        hcl1=body.get("hclv1") is True or body.get("HCLv1") is True,
    )
    try:
        return Response(body=jobapi.parse_to_api(text, inputs, file=name))
    except DriverSDKError as err:
        raise APIError(400, str(err)) from None


@route(r"/v1/validate/job", "PUT", "POST")
def validate_job(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    from driversdk.agent.agent import JobInvalid

    job = _job_body(request)
    try:
        agent.check(job)
    except JobInvalid as err:
        errors = [str(p) for p in err.problems]
        return Response(body={"DriverConfigValidated": True, "ValidationErrors": errors, "Error": str(err),
                              "Warnings": ""})  # fmt: skip
    return Response(body={"DriverConfigValidated": True, "ValidationErrors": None, "Error": "", "Warnings": ""})


def _job_record(agent: Agent, job_id: str) -> Any:
    assert agent.jobs is not None
    record = agent.jobs.get(job_id)
    if record is None:
        raise APIError(404, "job not found")
    return record


@route(r"/v1/job/(?P<id>[^/]+)", "GET")
def read_job(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    _blocking(agent, request)
    return Response(body=shapes.job(agent, _job_record(agent, match["id"])))


@route(r"/v1/job/(?P<id>[^/]+)", "PUT", "POST")
def update_job(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    job = _job_body(request)
    if job.get("ID") != match["id"]:
        raise APIError(400, "Job ID does not match name")
    return _register(agent, job)


@route(r"/v1/job/(?P<id>[^/]+)", "DELETE")
def stop_job(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    from driversdk.agent.agent import JobNotFound

    try:
        record = agent.deregister(match["id"], purge=request.flag("purge"))
    except JobNotFound:
        raise APIError(404, "job not found") from None
    assert record is not None
    return Response(body={"EvalID": str(uuid.uuid4()), "EvalCreateIndex": agent.index,
                          "JobModifyIndex": agent.index, "VolumeEvalID": "", "VolumeEvalIndex": 0,
                          "Index": agent.index, "LastIndex": agent.index, "KnownLeader": True})  # fmt: skip


@route(r"/v1/job/(?P<id>[^/]+)/periodic/force", "PUT", "POST")
def force_periodic(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    from driversdk.agent.agent import JobInvalid, JobNotFound

    try:
        child = agent.force_launch(match["id"])
    except JobNotFound:
        raise APIError(404, "job not found") from None
    except JobInvalid as err:
        raise APIError(400, str(err)) from None
    agent.log("info", f"http: periodic job {match['id']!r} forced: {child!r}")
    return Response(body={"EvalID": str(uuid.uuid4()), "EvalCreateIndex": agent.index, "Index": agent.index})


@route(r"/v1/job/(?P<id>[^/]+)/allocations", "GET")
def job_allocations(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    _blocking(agent, request)
    _job_record(agent, match["id"])  # 404 for a job the agent does not know
    return Response(body=shapes.alloc_stubs(agent, job=match["id"]))


@route(r"/v1/job/(?P<id>[^/]+)/summary", "GET")
def job_summary(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    _blocking(agent, request)
    return Response(body=shapes.summary(agent, _job_record(agent, match["id"])))


# --- allocations --------------------------------------------------------------------------------


@route(r"/v1/allocations", "GET")
def list_allocations(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    _blocking(agent, request)
    assert agent.node is not None
    return Response(body=shapes.alloc_stubs(agent, prefix=request.query.get("prefix", "")))


def _alloc(agent: Agent, alloc_id: str) -> tuple[Any, float]:
    assert agent.node is not None
    exact_hit = agent.node.state.alloc_by_id(alloc_id)  # the primary key: no scan of every allocation
    if exact_hit is not None:
        return exact_hit
    found = agent.node.state.allocs_by_prefix(alloc_id)
    exact = [f for f in found if f[0].alloc_id == alloc_id]
    if exact:
        return exact[0]
    if len(alloc_id) < 36 and len(found) == 1:  # a short id, as Nomad's CLI takes one
        return found[0]
    if len(found) > 1:
        raise APIError(400, f"alloc id prefix {alloc_id!r} matches {len(found)} allocations; give more of the id")
    raise APIError(404, "alloc not found")


@route(r"/v1/allocation/(?P<id>[^/]+)", "GET")
def read_allocation(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    _blocking(agent, request)
    alloc, updated = _alloc(agent, match["id"])
    return Response(body=shapes.allocation(agent, alloc, updated))


@route(r"/v1/client/fs/logs/(?P<id>[^/]+)", "GET")
def logs(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    from driversdk import logtail

    alloc, _ = _alloc(agent, match["id"])
    task = request.query.get("task", "")
    kind = request.query.get("type", "")
    if not task:
        raise APIError(400, "must include task name")
    if kind not in ("stdout", "stderr"):
        raise APIError(400, "must include type: stdout or stderr")
    origin = request.query.get("origin", "start")
    if origin not in ("start", "end"):
        raise APIError(400, 'origin must be "start" or "end"')
    try:
        offset = int(request.query.get("offset") or 0)
    except ValueError:
        raise APIError(400, "offset must be a number of bytes") from None
    assert agent.node is not None
    records = [r for r in agent.node.state.tasks(alloc.alloc_id) if r.task == task]
    if not records:
        raise APIError(404, f'task "{task}" not found in allocation {alloc.alloc_id[:8]}')
    logs_dir = logtail.LogDir.open(alloc.alloc_dir, task, kind)
    if logs_dir is None:
        raise APIError(404, f"log entry for task {task!r} and log type {kind!r} not found")
    plain = request.flag("plain")
    frame = (lambda data, at: data) if plain else _framer(f"alloc/logs/{task}.{kind}")
    if not request.flag("follow"):
        chunks: list[bytes] = []
        follower = logtail.Follower(logs_dir)
        try:
            follower.drain(chunks.append)
        finally:
            follower.close()
            logs_dir.close()
        data = b"".join(chunks)
        data = data[-offset:] if origin == "end" and offset else (b"" if origin == "end" else data[offset:])
        if origin == "end" and not offset:
            data = b""
        body = frame(data, 0) if data else b""
        return Response(body=body, content_type="text/plain" if plain else "application/json")
    state = agent.node.state

    def running() -> bool:
        now = [r for r in state.tasks(alloc.alloc_id) if r.task == task]
        return bool(now) and now[0].state in ("running", "starting", "restarting")

    return Response(stream=_follow(logs_dir, running, frame, origin == "end", offset),
                    content_type="text/plain" if plain else "application/json")  # fmt: skip


def _alloc_fs(agent: Agent, request: Request, match: re.Match[str], read: Callable[[str, str], Any]) -> Any:
    from driversdk.agent.api.allocfs import AllocFSError

    alloc, _ = _alloc(agent, match["id"])
    try:
        return read(alloc.alloc_dir, request.query.get("path", "/"))
    except AllocFSError as err:
        raise APIError(err.status, str(err)) from None


@route(r"/v1/client/fs/ls/(?P<id>[^/]+)", "GET")
def fs_list(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    from driversdk.agent.api import allocfs

    return Response(body=_alloc_fs(agent, request, match, allocfs.list_dir))


@route(r"/v1/client/fs/stat/(?P<id>[^/]+)", "GET")
def fs_stat(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    from driversdk.agent.api import allocfs

    return Response(body=_alloc_fs(agent, request, match, allocfs.stat_file))


@route(r"/v1/client/fs/cat/(?P<id>[^/]+)", "GET")
def fs_cat(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    from driversdk.agent.api import allocfs

    data = _alloc_fs(agent, request, match, allocfs.read_file)
    return Response(body=data, content_type="text/plain; charset=utf-8")


def _framer(file: str) -> Callable[[bytes, int], bytes]:
    """Nomad's StreamFrame, one JSON object per chunk with its data in base64."""
    position = [0]

    def frame(data: bytes, _: int) -> bytes:
        out = json.dumps({"File": file, "Offset": position[0], "Data": base64.b64encode(data).decode()})
        position[0] += len(data)
        return out.encode()

    return frame


def _follow(logs_dir: Any, running: Callable[[], bool], frame: Callable[[bytes, int], bytes],
            from_end: bool, offset: int = 0) -> Iterator[bytes]:  # fmt: skip
    """The log as it grows: from ``offset`` bytes in (``origin=start``) or the last ``offset``
    bytes (``origin=end``), then every byte written until the task ends or the client goes."""
    from driversdk import logtail

    chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=256)
    stop = threading.Event()
    follower = logtail.Follower(logs_dir)
    first = b""
    skip = 0 if from_end else offset
    if from_end:
        kept = bytearray()

        def keep_tail(data: bytes) -> None:
            kept.extend(data)
            del kept[: max(0, len(kept) - offset)]

        follower.drain(keep_tail)
        first = bytes(kept)

    def put(data: bytes) -> None:
        nonlocal skip
        if skip:
            cut = min(skip, len(data))
            data, skip = data[cut:], skip - cut
        while data and not stop.is_set():
            try:
                chunks.put(data, timeout=1.0)
                return
            except queue.Full:
                continue  # a slow reader; given up on once it has gone (stop)

    def pump() -> None:
        try:
            logtail.follow(follower, put, lambda: running() and not stop.is_set())
        finally:
            follower.close()
            logs_dir.close()
            while True:
                try:
                    chunks.put(None, timeout=1.0)
                    break
                except queue.Full:
                    if stop.is_set():
                        break  # nobody reads any more

    threading.Thread(target=pump, daemon=True, name="logs-follow").start()
    try:
        if first:
            yield frame(first, 0)
        while (chunk := chunks.get()) is not None:
            yield frame(chunk, 0)
    finally:
        stop.set()


# --- event stream -------------------------------------------------------------------------------


@route(r"/v1/event/stream", "GET")
def event_stream(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    from driversdk.agent.api.eventstream import HEARTBEAT, Subscription

    try:
        index = int(request.query.get("index") or 0)
    except ValueError:
        raise APIError(400, "index must be a number") from None
    subscription = Subscription.parse(request.all("topic"))

    def lines() -> Iterator[bytes]:
        after = index
        while True:
            events, newest = agent.events.after(after, HEARTBEAT)
            wanted = [e.to_api() for e in events if subscription.wants(e)]
            after = max(after, newest)
            if wanted:
                yield json.dumps({"Index": after, "Events": wanted}).encode() + b"\n"
            elif not events:
                yield b"{}\n"  # a heartbeat: the connection lives, nothing happened

    return Response(stream=lines(), content_type="application/json")


# --- node and agent -----------------------------------------------------------------------------


@route(r"/v1/nodes", "GET")
def list_nodes(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    _blocking(agent, request)
    return Response(body=[shapes.node(agent, full=False)])


@route(r"/v1/node/(?P<id>[^/]+)", "GET")
def read_node(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    node = shapes.node(agent)
    if not node["ID"].startswith(match["id"]) and match["id"] != node["Name"]:
        raise APIError(404, "node not found")
    return Response(body=node)


@route(r"/v1/node/(?P<id>[^/]+)/allocations", "GET")
def node_allocations(agent: Agent, request: Request, match: re.Match[str]) -> Response:
    read_node(agent, request, match)
    return list_allocations(agent, Request("GET", "", {}, b"", "", False), match)


@route(r"/v1/agent/self", "GET")
def agent_self(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    info = agent.node_info()
    tcp = agent.settings.tcp
    config = {
        "Region": info.region, "Datacenter": info.datacenter, "NodeName": info.name, "DataDir": agent.client.data_dir,
        "Version": {"Version": agent.version(), "VersionPrerelease": "", "Revision": ""},
        "Client": {"Enabled": True}, "Server": {"Enabled": False}, "ACL": {"Enabled": agent.settings.acl_enabled},
        "BindAddr": tcp.host if tcp else "", "Ports": {"HTTP": tcp.port if tcp else 0},
    }  # fmt: skip
    member = {"Name": info.name, "Addr": tcp.host if tcp else "", "Port": tcp.port if tcp else 0,
              "Status": "alive", "Tags": {"dc": info.datacenter, "region": info.region}}  # fmt: skip
    count = len(agent.node.state.allocs()) if agent.node else 0
    stats = {"client": {"known_servers": "", "num_allocations": str(count), "last_heartbeat": "0"}}
    return Response(body={"config": config, "member": member, "stats": stats})


@route(r"/v1/agent/health", "GET")
def agent_health(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    return Response(body={"client": {"ok": True, "message": "ok"}})


@route(r"/v1/status/leader", "GET")
def leader(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    tcp = agent.settings.tcp
    return Response(body=f"{tcp.host}:{tcp.port}" if tcp else "unix")


# --- ACL ----------------------------------------------------------------------------------------


@route(r"/v1/acl/bootstrap", "PUT", "POST")
def acl_bootstrap(agent: Agent, request: Request, _: re.Match[str]) -> Response:
    from driversdk.agent.acl import BootstrapDone

    if not agent.settings.acl_enabled or agent.tokens is None:
        raise APIError(400, "ACL support disabled")
    try:
        token = agent.tokens.bootstrap()
    except BootstrapDone:
        raise APIError(400, "ACL bootstrap already done") from None
    agent.log("info", "http: ACL bootstrap: management token created")
    return Response(body=token.to_api(agent.index))


# The CSI endpoints live in their own module; importing it registers their routes.
from driversdk.agent.api import csiroutes  # noqa: E402, F401
