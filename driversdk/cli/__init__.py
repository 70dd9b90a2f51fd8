"""The ``driversdk`` command line."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import threading
from collections.abc import Sequence
from enum import Enum
from typing import Any, NoReturn

from driversdk.cli import acl as acl_verbs
from driversdk.cli import alloc as alloc_verbs
from driversdk.cli import job as job_verbs
from driversdk.cli import node as node_verbs
from driversdk.cli import volume as volume_verbs
from driversdk.errors import DriverSDKError


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _probe_command(args: argparse.Namespace) -> list[str]:
    """The command line to probe: given, or the file Nomad's loader would pick from --plugin-dir."""
    by_dir = args.plugin_dir is not None or args.name is not None
    if by_dir and args.command:
        args.probe_parser.error("give either --plugin-dir and --name or a plugin command line, not both")
    if not by_dir:
        if not args.command:
            args.probe_parser.error("the following arguments are required: command (or --plugin-dir and --name)")
        return list(args.command)
    if args.plugin_dir is None or args.name is None:
        args.probe_parser.error("--plugin-dir and --name go together: the client's plugin_dir and the plugin's name")
    from driversdk.pluginpack.catalog import find_plugin

    return [find_plugin(args.plugin_dir, args.name).path]


def cmd_plugin_probe(args: argparse.Namespace) -> int:
    """Launch a plugin as a Nomad client would and print what it says about itself; exit 1 when
    Nomad would not use it or it does not fingerprint healthy."""
    import dataclasses

    from driversdk.client import launch
    from driversdk.hclspec import decode
    from driversdk.model import HealthState
    from driversdk.pluginpack.catalog import api_problem, render

    command = _probe_command(args)
    config: dict[str, Any] = {}
    if args.config:
        # Checked before the plugin is launched: a typo should not cost a plugin start.
        try:
            parsed = json.loads(args.config)
        except json.JSONDecodeError as err:
            raise CLIError(
                f"--config is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}); "
                'give the plugin config as a JSON object, e.g. --config \'{"gc": {"image": false}}\''
            ) from None
        if not isinstance(parsed, dict):
            raise CLIError(f"--config must be a JSON object ({{...}}), not {type(parsed).__name__}")
        config = parsed
    client = launch(command, timeout=args.timeout, name=args.name)
    try:
        info = client.plugin_info()
        schema = client.config_schema()
        client.set_config(config)
        client.init()
        task_schema = client.task_config_schema()
        caps = client.capabilities()
        fingerprint = next(iter(client.fingerprint()))
        report = {
            "name": info.name,
            "type": "driver",
            "path": command[0],
            "plugin_version": info.plugin_version,
            "plugin_api_versions": list(info.plugin_api_versions),
            "config_schema": render(schema),
            "task_config_schema": render(task_schema),
            "plugin_config": decode(schema, b"", what="defaults") if schema and not config else config,
            "capabilities": _plain(dataclasses.asdict(caps)),
            "health": fingerprint.health.name,
            "health_description": fingerprint.health_description,
            "attributes": {k: getattr(v, "value", v) for k, v in sorted(fingerprint.attributes.items())},
        }
    finally:
        client.kill()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(f"{report['name']} {report['plugin_version']} (api {', '.join(report['plugin_api_versions'])})")
        print(f"  type:         {report['type']}")
        print(f"  health:       {report['health']} ({report['health_description']})")
        caps_text = ", ".join(f"{k}={v}" for k, v in report["capabilities"].items())
        print(f"  capabilities: {caps_text}")
        for key, value in report["attributes"].items():
            print(f"  {key} = {value}")
        print("  plugin config schema:")
        print(render(schema, "    "))
        print("  task config schema:")
        print(render(task_schema, "    "))
    problem = api_problem(info.plugin_api_versions, info.plugin_version)
    if problem is None and fingerprint.health != HealthState.HEALTHY:
        problem = f"it fingerprints {fingerprint.health.name} ({fingerprint.health_description or 'no description'})"
    if problem is not None:
        raise CLIError(f"plugin {info.name!r} ({command[0]}) would not run tasks on a Nomad client: {problem}")
    return 0


def cmd_plugin_package(args: argparse.Namespace) -> int:
    """Package a driver into one executable file for a Nomad client's plugin_dir."""
    from driversdk.pluginpack.build import package

    done = package(args.target, args.output, python=args.python, requires=args.require or ())
    name = done.name or os.path.basename(done.path)
    print(
        f"wrote {done.path} ({done.size / 1e6:.1f} MB): driver {name!r} {done.version or ''} ({done.entry}) for "
        f"{done.python['implementation']} {done.python['version']} ({done.python['platform']}), run by "
        f"{args.python or 'python' + done.python['version'] + ' on PATH'}".replace("  ", " ")
    )
    if os.path.basename(done.path) != name:
        print(f'note: Nomad matches the file name against plugin "NAME" {{}}: copy it into plugin_dir as {name!r}')
    return 0


def _json_arg(flag: str, text: str, example: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:
        raise CLIError(
            f"{flag} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}); give a JSON object, "
            f"e.g. {flag} '{example}'"
        ) from None
    if not isinstance(parsed, dict):
        raise CLIError(f"{flag} must be a JSON object ({{...}}), not {type(parsed).__name__}")
    return parsed


def _task_factory(template: dict[str, Any]) -> Any:
    """``--task``'s JSON as a conformance TaskFactory: "$0" is the command, "$@" its arguments."""

    def fill(value: Any, argv: Sequence[str]) -> Any:
        if value == "$0":
            return argv[0]
        if value == "$@":
            return list(argv[1:])
        if isinstance(value, dict):
            return {k: fill(v, argv) for k, v in value.items()}
        if isinstance(value, list):
            out: list[Any] = []
            for item in value:
                out.extend(argv[1:] if item == "$@" else [fill(item, argv)])
            return out
        return value

    return lambda argv: fill(template, argv)


def cmd_plugin_test(args: argparse.Namespace) -> int:
    """Run the conformance kit against a plugin: one line per check, exit 1 when any fails."""
    import logging
    import shutil
    import tempfile

    from driversdk.testing import DriverHarness
    from driversdk.testing.conformance import run_conformance

    example = '{"command": "$0", "args": "$@"}'
    template = _json_arg("--task", args.task, example)
    if "$0" not in json.dumps(template):
        raise CLIError(f"--task must use \"$0\" where the command to run goes, e.g. --task '{example}'")
    config = _json_arg("--config", args.config, '{"enabled": true}') if args.config else {}
    verbose = args.verbose or os.environ.get("DRIVERSDK_VERBOSE", "") not in ("", "0")
    # The plugin's stderr (grpc's debug lines among it) only with --verbose: a failing check
    # must not drown in it.
    logging.basicConfig(level=logging.DEBUG if verbose else logging.CRITICAL, format="%(name)s: %(message)s")
    workdir = tempfile.mkdtemp(prefix="driversdk-plugin-test-")
    failed = 0

    def show(result: Any) -> None:
        nonlocal failed
        failed += not result.passed
        print(result, flush=True)

    try:
        with DriverHarness(args.command, plugin_config=config, timeout=args.timeout) as harness:
            run_conformance(harness, _task_factory(template), workdir, timeout=args.timeout, on_result=show)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a job file against the client config, its drivers and this host before any start."""
    from driversdk.runner.hcl import FilePolicy
    from driversdk.runner.jobjson import JobInputs
    from driversdk.runner.validate import check_files

    # File functions read only below the job file's directory (see FilePolicy).
    files = FilePolicy.beside(args.job)
    inputs = JobInputs(
        vars=args.var or (),
        var_files=args.var_file or (),
        env=dict(os.environ),
        files=files,
        json=args.job_json,
        hcl1=args.job_hcl1,
    )
    report = check_files(args.job, args.client, inputs)
    # A file that could not be read as a job at all (an empty job name still parses: it is listed).
    if report.parsed is None and report.problems and not report.checked and len(report.problems) == 1:
        problem = report.problems[0]
        if problem.field == "file" and not args.json:  # a file that cannot be read as HCL at all
            print(f"error: {problem}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        # Errors first: an `ok` never comes before an error (validate prints none for an object
        # that has one).
        for problem in report.problems:
            print(f"error {problem}")
        for line in report.checked:
            print(f"ok    {line}")
        for note in report.notes:
            print(f"note  {note}")
        verdict = "valid" if report.valid else f"{len(report.problems)} problem(s)"
        name = report.job or args.job
        # repr escapes control characters; a hostile 5000-character name is shortened.
        print(f"job {name if len(name) <= 60 else name[:60] + '...'!r}: {verdict}")
    return 0 if report.valid else 1


def cmd_run(args: argparse.Namespace) -> int:
    """Run jobs' tasks: submitted to the agent when one is running (followed; Ctrl-C detaches),
    else here through their driver plugins (Ctrl-C stops them cleanly). Exit 0 when every task
    succeeded, 1 when one failed, 2 when the run was refused before anything started."""
    # Before any runner import: with an agent, this process loads no HCL, grpc or plugin client.
    from driversdk.cli import runagent

    found = runagent.find_agent(args)
    if found is not None:
        code = runagent.run_via_agent(found[0], found[1], args)
        if code is not None:
            return code
    if args.detach:
        print("error: -detach needs a running agent to leave the job with; start one with `driversdk agent -dev` "
              "(or set NOMAD_ADDR), or run without -detach", file=sys.stderr)  # fmt: skip
        return 2
    from driversdk.runner.clientconfig import load_client
    from driversdk.runner.events import error_event, printer
    from driversdk.runner.jobjson import JobInputs
    from driversdk.runner.run import EXIT_REFUSED, EXIT_TASK_FAILED, AllocRefused, RunFailed, RunRefused, run_jobs

    client = load_client(args.client)
    try:
        emit = printer(args.json, lambda s: print(s, flush=True))
        variables = JobInputs(
            vars=args.var or (),
            var_files=args.var_file or (),
            env=dict(os.environ),
            json=args.job_json,
            hcl1=args.job_hcl1,
        )
        return run_jobs(list(args.job), client, emit, variables=variables)
    except RunRefused as err:  # before any task started (an allocation's setup may have refused it)
        if args.json:
            print((err.event if isinstance(err, AllocRefused) else error_event(str(err))).json(), flush=True)
        else:
            print(f"error: {err}", file=sys.stderr)
        return EXIT_REFUSED
    except DriverSDKError as err:
        if not args.json:
            raise  # main's "error: …" line; a RunFailed names the job, allocation and task
        # --json: every line of stdout is an event, the one that ends the run too.
        print((err.event if isinstance(err, RunFailed) else error_event(str(err))).json(), flush=True)
        return EXIT_TASK_FAILED


def cmd_agent(args: argparse.Namespace) -> int:
    """The agent, in the foreground until SIGINT or SIGTERM."""
    from driversdk.agent.main import run_agent
    from driversdk.agent.settings import load_settings

    settings = load_settings(args.agent_config, dev=args.agent_dev)
    if args.agent_data_dir:
        settings.client.data_dir = os.path.abspath(args.agent_data_dir)
        settings.ephemeral_data_dir = False
    code = run_agent(settings, allow_unauthenticated_loopback=args.agent_allow_loopback)
    # The agent's threads (job runners, HTTP) are left as they are: the tasks run on, recovered by
    # the next agent; everything they would record is recorded already.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# As `nomad job run -json`; a file whose first non-space character is { is read as JSON anyway.
_JOB_JSON = "the job file is JSON in Nomad's API format (one dash; --json is the output format)"
# As `nomad job run -hcl1` of Nomad 1.0-1.5: the job file is HCL1, read as jobspec v1 read it.
_JOB_HCL1 = "the job file is HCL1, as older Nomad versions ran it with -hcl1 (no variables or functions)"


class CLIError(DriverSDKError):
    """A command line that cannot be acted on (bad --config, a data dir that does not exist)."""


def _data_dir(args: argparse.Namespace, *, existing: bool = False) -> str:
    """The data dir the command works on; ``existing`` for commands that only read it, which
    must not create an empty one (and then report that nothing ran) when the path is wrong."""
    from driversdk.runner.clientconfig import load_client

    path = str(getattr(args, "data_dir", None) or load_client(getattr(args, "client", None)).data_dir)
    if existing and not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise CLIError(
            f"data dir {path} {what}; nothing has been run with it (check --data-dir or the client config's data_dir)"
        )
    return path


def cmd_status(args: argparse.Namespace) -> int:
    """Tasks that `driversdk run` started on this client, newest last."""
    from driversdk.runner.runstate import RunState

    state = RunState(_data_dir(args, existing=True))
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
    from driversdk.runner.allocgc import GCPolicy, collect
    from driversdk.runner.runstate import RunState

    data_dir = _data_dir(args, existing=True)
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
    from driversdk.runner.runstate import RunState, RunStateError

    data_dir = _data_dir(args, existing=True)
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


def _volume_store(args: argparse.Namespace, *, existing: bool = False) -> Any:
    from driversdk.runner.volumes import VolumeStore

    data_dir = _data_dir(args, existing=existing)
    _watch(data_dir)
    return VolumeStore.for_data_dir(data_dir)


def _watch(data_dir: str) -> None:
    """Every `volume` command first gives the volume watcher a pass: past claims whose backoff
    ran out are released (said on stderr, so --json output stays clean)."""
    from driversdk.runner.volumewatcher import VolumeWatcher, describe

    watcher = VolumeWatcher(data_dir)
    try:
        outcome = watcher.reap(wait=10.0)
    finally:
        watcher.close()
    for released in outcome.released:
        print(f"volume watcher: {describe(released)}", file=sys.stderr)


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"{flag} takes KEY=VALUE, not {item!r}")
        out[key] = value
    return out


def _stores(args: argparse.Namespace) -> Any:
    from driversdk.runner.volumeops import Stores

    data_dir = _data_dir(args, existing=True)
    _watch(data_dir)
    return Stores.open(data_dir)


def cmd_volume_register(args: argparse.Namespace) -> int:
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    from driversdk.runner.volumes import parse_volume_file

    volume = parse_volume_file(args.file)
    stored, created = _volume_store(args).register(volume)
    print(f'{"registered" if created else "updated"} CSI volume "{stored.id}" (plugin "{stored.plugin_id}")')
    return 0


def cmd_volume_create(args: argparse.Namespace) -> int:
    """CreateVolume through the plugin's controller, then register the result (`nomad volume create`)."""
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    from driversdk.runner.volumeops import Stores, create_volume
    from driversdk.runner.volumes import parse_volume_file

    volume = parse_volume_file(args.file)
    data_dir = _data_dir(args)
    _watch(data_dir)
    stores = Stores.open(data_dir)
    try:
        before = stores.volumes.get(volume.id, volume.namespace)
        stored, created = create_volume(stores, volume)
    finally:
        stores.close()
    if not created:
        grown = (
            f"; expanded from {before.capacity} to {stored.capacity} bytes"
            if before is not None and stored.capacity != before.capacity
            else ""
        )
        print(f'updated CSI volume "{stored.id}" (it exists already; plugin "{stored.plugin_id}"){grown}')
        return 0
    print(
        f'created CSI volume "{stored.id}" (external ID "{stored.external_id}", capacity {stored.capacity} bytes, '
        f'plugin "{stored.plugin_id}")'
    )
    return 0


def cmd_volume_delete(args: argparse.Namespace) -> int:
    """DeleteVolume through the controller and deregister; refused while the volume is claimed."""
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    from driversdk.runner.volumeops import delete_volume

    stores = _stores(args)
    try:
        volume = delete_volume(stores, args.id, args.namespace, _pairs(args.secret, "--secret"))
    finally:
        stores.close()
    print(f'deleted CSI volume "{volume.id}" (external ID "{volume.external_id}")')
    return 0


def cmd_volume_detach(args: argparse.Namespace) -> int:
    """Release the volume's claims whose allocations are over (`nomad volume detach`): node
    unpublish, unstage, controller unpublish, free. With the plugin gone for good a claim is freed
    once nothing of it is mounted, saying what could not be undone."""
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    from driversdk.runner.volumewatcher import DetachError, VolumeWatcher, describe, describe_failure

    data_dir = _data_dir(args, existing=True)
    watcher = VolumeWatcher(data_dir)
    try:
        if watcher.volumes.get(args.volume, args.namespace) is None:
            raise DetachError(f'volume "{args.volume}" is not registered in namespace "{args.namespace}"')
        watcher.denormalize()
        claims = [
            c
            for c in watcher.volumes.claims(args.volume, args.namespace)
            if not args.alloc or c.alloc_id.startswith(args.alloc)
        ]
        if not claims:
            which = f" by an allocation starting with {args.alloc!r}" if args.alloc else ""
            print(f'volume "{args.volume}" has no claims{which}; nothing to detach')
            return 0
        live = [c for c in claims if not c.past]
        for claim in live:
            found = watcher.volumes.alloc_state(claim.alloc_id)
            how = f"its run (pid {found[1]})" if found else "it"
            print(
                f'error: alloc {claim.alloc_id[:8]} of job {claim.job} still uses volume "{args.volume}" ({how} is '
                "not over); stop the job first (or run it again to recover it, then stop it), then detach",
                file=sys.stderr,
            )
        outcome = watcher.reap(
            volume_id=args.volume, namespace=args.namespace, alloc_id=args.alloc or None, force=True, detach=True
        )
    finally:
        watcher.close()
    for released in outcome.released:
        print(describe(released))
    for claim, error in outcome.failed:
        print(f"error: {describe_failure(claim, error)}", file=sys.stderr)
    return 1 if live or outcome.failed else 0


def cmd_volume_status(args: argparse.Namespace) -> int:
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    from driversdk.runner.volumeops import plugin_health, volume_status
    from driversdk.runner.volumes import VolumeError, claim_state_text, public_view

    stores = _stores(args)
    try:
        if args.id:
            volume = stores.volumes.get(args.id, args.namespace)
            if volume is None:
                raise VolumeError(f'volume "{args.id}" is not registered in namespace "{args.namespace}"')
            view = public_view(volume)
            view.update(volume_status(stores, volume, plugin_health(stores, volume.plugin_id)))
            print(json.dumps(view, indent=2))
            return 0
        volumes = stores.volumes.list()
        health = {p: plugin_health(stores, p) for p in sorted({v.plugin_id for v in volumes})}
        views = []
        for v in volumes:
            view = public_view(v)
            view.update(volume_status(stores, v, health[v.plugin_id]))
            views.append(view)
        if args.json:
            print(json.dumps(views, indent=2))
            return 0
        if not volumes:
            print("no CSI volumes registered")
        for v, view in zip(volumes, views, strict=True):
            caps = ", ".join(f"{c.access_mode.value}/{c.attachment_mode.value}" for c in v.capabilities)
            print(
                f"{v.namespace}/{v.id}  plugin={v.plugin_id}  external_id={v.remote_id}  capabilities={caps}  "
                f"capacity={v.capacity}  schedulable={str(view['schedulable']).lower()}  "
                f"node plugin: {view['plugin_node']}"
            )
            for c in stores.volumes.claims(v.id, v.namespace):
                print(f"  claim  alloc {c.alloc_id[:8]}  job {c.job}  {c.mode}  {claim_state_text(c)}")
    finally:
        stores.close()
    return 0


def cmd_volume_snapshot_create(args: argparse.Namespace) -> int:
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    from driversdk.runner.volumeops import create_snapshot

    stores = _stores(args)
    try:
        snap = create_snapshot(
            stores,
            args.volume,
            args.namespace,
            args.name or "",
            secrets=_pairs(args.secret, "--secret"),
            parameters=_pairs(args.parameter, "--parameter"),
        )
    finally:
        stores.close()
    ready = "ready" if snap.ready_to_use else "not ready yet"
    print(f'created snapshot "{snap.snapshot_id}" of volume "{args.volume}" (size {snap.size_bytes} bytes, {ready})')
    return 0


def cmd_volume_snapshot_delete(args: argparse.Namespace) -> int:
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    from driversdk.runner.volumeops import delete_snapshot

    stores = _stores(args)
    try:
        existed = delete_snapshot(stores, args.plugin_id, args.snapshot_id, _pairs(args.secret, "--secret"))
    finally:
        stores.close()
    unknown = "" if existed else " (the plugin cannot list snapshots, so whether it existed is not known)"
    print(f'deleted snapshot "{args.snapshot_id}" of CSI plugin "{args.plugin_id}"{unknown}')
    return 0


def cmd_volume_snapshot_list(args: argparse.Namespace) -> int:
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    from driversdk.runner.volumeops import list_snapshots

    stores = _stores(args)
    try:
        listing = list_snapshots(stores, args.plugin, _pairs(args.secret, "--secret"))
    finally:
        stores.close()
    rows = listing.rows
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no snapshots" + (" from the plugins that could be asked" if listing.not_asked else ""))
    for r in rows:
        volume = r["volume_id"] or f"(external {r['external_volume_id']})"
        ready = "ready" if r["ready"] else "not ready"
        print(f"{r['snapshot_id']}  plugin={r['plugin_id']}  volume={volume}  size={r['size_bytes']}  "
              f"created={r['created']}  {ready}")  # fmt: skip
    for plugin, why in sorted(listing.not_asked.items()):
        print(f'not asked: CSI plugin "{plugin}" ({why}); its snapshots, if any, are not listed')
    return 0


def cmd_plugin_status(args: argparse.Namespace) -> int:
    """CSI plugin instances registered on this client, each probed now."""
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    from driversdk.csi.client import CSIClient
    from driversdk.csi.errors import CSIError
    from driversdk.csi.registry import PLUGIN_TYPES, PluginRegistry
    from driversdk.csi.state import StateStore

    data_dir = _data_dir(args, existing=True)
    store = StateStore(os.path.join(data_dir, "state.db"))
    volumes = _volume_store(args, existing=True).list()
    rows: list[dict[str, Any]] = []
    for kind in PLUGIN_TYPES:
        for name in sorted(PluginRegistry(store).plugins(kind)):
            for position, reg in enumerate(PluginRegistry(store).instances(kind, name)):
                health = "healthy"
                try:
                    client = CSIClient(reg.socket_path, plugin=name)
                    try:
                        health = "healthy" if client.probe() else "unhealthy: not ready"
                    finally:
                        client.close()
                except CSIError as err:
                    health = f"unhealthy: {err}"
                rows.append(
                    {
                        "type": kind,
                        "id": name,
                        "alloc_id": reg.alloc_id,
                        "current": position == 0,
                        "health": health,
                        "provider": reg.options.get("Provider", ""),
                        "version": reg.version,
                        "socket": reg.socket_path,
                        "volumes": sorted(v.id for v in volumes if v.plugin_id == name),
                        "mounts": len(store.usages(name)) if kind == "csi-node" else 0,
                    }
                )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no CSI plugins are registered on this client; run a job with a csi_plugin task")
    for r in rows:
        older = "" if r["current"] else " (older instance)"
        print(
            f"{r['type']:<15} {r['id']}  alloc {str(r['alloc_id'])[:8]}{older}  {r['health']}  "
            f"provider={r['provider']} {r['version']}  volumes={len(r['volumes'])} mounts={r['mounts']}"
        )
    return 0 if all(str(r["health"]) == "healthy" for r in rows) else 1


def cmd_volume_deregister(args: argparse.Namespace) -> int:
    if (through_agent := volume_verbs.via_agent(args)) is not None:  # an agent is reachable: its API
        return through_agent
    _volume_store(args, existing=True).deregister(args.id, args.namespace)
    print(f'deregistered CSI volume "{args.id}"')
    return 0


class _Version(argparse.Action):
    """``--version``: looked up only when asked, so other commands do not pay for the metadata."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from driversdk.model import DRIVER_API_VERSION
        from driversdk.plugin.handshake import APP_PROTOCOL_VERSION

        try:
            mine = version("driversdk")
        except PackageNotFoundError:  # run from a source tree that was never installed
            mine = "unknown (not installed)"
        print(f"driversdk {mine}")
        print(f"driver plugin API {DRIVER_API_VERSION} (go-plugin protocol {APP_PROTOCOL_VERSION}, grpc)")
        parser.exit(0)


def _where(prefix: str = "") -> argparse.ArgumentParser:
    """--client / --data-dir, the one definition for every command that works on a data dir.

    It is a parent of the top-level parser, of the `volume` and `plugin` groups and of each data-dir
    sub-command, so the options go before or after the sub-command. SUPPRESS as the default: a
    sub-parser's default would otherwise overwrite what was given before it."""
    where = argparse.ArgumentParser(add_help=False)
    group = where.add_argument_group("data dir")
    group.add_argument(
        "--client",
        dest=prefix + "client",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="client config file (HCL); its data_dir is used",
    )
    group.add_argument(
        "--data-dir",
        dest=prefix + "data_dir",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="state directory (default: the client config's data_dir)",
    )
    return where


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of lines (0 or more), not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    # The top level keeps what it is given apart (global_client, global_data_dir): `run` and
    # `validate` have a --client of their own whose default would overwrite it; main() merges.
    parser = argparse.ArgumentParser(
        prog="driversdk",
        description="Nomad-compatible task-driver plugins in Python.",
        epilog="exit status: 0 success; 1 a task failed, the checked thing is invalid or the command "
        "could not do its work (one sentence on stderr); 2 the command line was refused before "
        "anything started; 130 interrupted.",
        parents=[_where("global_")],
    )
    parser.add_argument("--version", action=_Version, help="the SDK's version and the plugin API it speaks")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    where = _where()
    sub = parser.add_subparsers(dest="cmd", required=True)
    plugin = sub.add_parser("plugin", parents=[where], help="work with driver plugin binaries")
    plugin_sub = plugin.add_subparsers(dest="plugin_cmd", required=True)
    probe = plugin_sub.add_parser(
        "probe", help="launch a plugin through the handshake and describe it (exit 1 unless Nomad could use it)"
    )
    probe.add_argument("--config", help="plugin config as JSON (encoded with the plugin's own schema)")
    probe.add_argument("--timeout", type=float, default=60.0)
    probe.add_argument("--json", action="store_true")
    probe.add_argument("--plugin-dir", help="a Nomad client's plugin_dir: find the plugin there as Nomad does")
    probe.add_argument("--name", help="with --plugin-dir: the plugin's name (its file name there)")
    probe.add_argument("command", nargs="*", help="the plugin command line (or --plugin-dir and --name)")
    probe.set_defaults(func=cmd_plugin_probe, probe_parser=probe)
    package = plugin_sub.add_parser("package", help="make one executable file of a driver for a Nomad plugin_dir")
    package.add_argument("target", metavar="MODULE[:ATTR] | PROJECT_DIR", help="the driver: its module or project")
    package.add_argument("-o", "--output", required=True, help="the file to write")
    package.add_argument("--python", help="the interpreter the plugin runs with on the client (absolute path)")
    package.add_argument("--require", action="append", help="a further requirement to include (repeatable)")
    package.set_defaults(func=cmd_plugin_package)
    ptest = plugin_sub.add_parser(
        "test", help="run the conformance kit against a plugin (one line per check; exit 1 when any fails)"
    )
    ptest.add_argument(
        "--task",
        required=True,
        help='the task config {} as JSON; "$0" stands for the command to run, "$@" for its arguments '
        '(docker: \'{"image": "busybox", "command": "$0", "args": "$@"}\')',
    )
    ptest.add_argument("--config", help="plugin config as JSON (sent in SetConfig)")
    ptest.add_argument("--timeout", type=float, default=60.0, help="seconds each task may take")
    ptest.add_argument("--verbose", action="store_true", help="show the plugin's log lines (grpc's debug too)")
    ptest.add_argument("command", nargs="+", help="the plugin command line (after --)")
    ptest.set_defaults(func=cmd_plugin_test)
    validate = sub.add_parser("validate", help="check a job before any task starts")
    validate.add_argument("job", help="the job file (HCL)")
    # Not the data-dir parent: validate reads the client config, and a --data-dir would be ignored.
    validate.add_argument("--client", help="the client config file (HCL): host volumes, plugins")
    validate.add_argument("--json", action="store_true", help="machine-readable output")
    validate_format = validate.add_mutually_exclusive_group()  # a job file is JSON or HCL1, not both
    validate_format.add_argument("-json", dest="job_json", action="store_true", help=_JOB_JSON)
    validate_format.add_argument("-hcl1", dest="job_hcl1", action="store_true", help=_JOB_HCL1)
    # As `nomad job run`: -var NAME=VALUE and -var-file FILE, repeatable, the last value wins
    # (after NOMAD_VAR_<name> from the environment).
    validate.add_argument(
        "-var", "--var", action="append", metavar="NAME=VALUE", help="a value for a variable the job declares"
    )
    validate.add_argument(
        "-var-file", "--var-file", action="append", metavar="FILE", help="variable values (HCL, or JSON if .json)"
    )
    validate.set_defaults(func=cmd_validate)

    run = sub.add_parser("run", help="run jobs' tasks on this machine (exit 0 ok, 1 a task failed, 2 refused)")
    run.add_argument("job", nargs="+", help="the job file(s) (HCL); one process runs them all, one plugin per driver")
    run.add_argument("--client", help="the client config file (HCL): data_dir, host volumes, plugins")
    run.add_argument("--json", action="store_true", help="print one JSON object per event line")
    run_format = run.add_mutually_exclusive_group()  # a job file is JSON or HCL1, not both
    run_format.add_argument("-json", dest="job_json", action="store_true", help=_JOB_JSON)
    run_format.add_argument("-hcl1", dest="job_hcl1", action="store_true", help=_JOB_HCL1)
    run.add_argument(
        "-var", "--var", action="append", metavar="NAME=VALUE", help="a value for a variable the job declares"
    )
    run.add_argument(
        "-var-file", "--var-file", action="append", metavar="FILE", help="variable values (HCL, or JSON if .json)"
    )
    run.add_argument("-detach", "--detach", action="store_true", help="with an agent: submit and return at once")
    run.add_argument(
        "-address",
        "--address",
        dest="api_address",
        metavar="ADDR",
        help="the agent (default: NOMAD_ADDR, else the local socket; with none, the job runs in this process)",
    )
    run.add_argument("-token", "--token", dest="api_token", metavar="TOKEN", help="ACL token (default: NOMAD_TOKEN)")
    run.set_defaults(func=cmd_run)

    agent = sub.add_parser(
        "agent", help="run the agent: owns this node's plugins, jobs and allocations, serves Nomad's HTTP API"
    )
    agent.add_argument("-config", dest="agent_config", metavar="FILE", help="agent config file (Nomad's format)")
    agent.add_argument(
        "-dev",
        dest="agent_dev",
        action="store_true",
        help="a throwaway agent: a data dir of its own, removed with every job when it exits",
    )
    agent.add_argument("-data-dir", dest="agent_data_dir", metavar="DIR", help="state directory (over the config's)")
    agent.add_argument(
        "-allow-unauthenticated-loopback",
        dest="agent_allow_loopback",
        action="store_true",
        help="serve the HTTP API on a loopback TCP address without ACLs (any local user may then use it)",
    )
    agent.set_defaults(func=cmd_agent)
    # Nomad's everyday verbs, each the agent's client through its HTTP API.
    for verbs in (job_verbs, alloc_verbs, node_verbs, acl_verbs):
        verbs.add_parsers(sub, where)
    status = sub.add_parser("status", parents=[where], help="tasks started by `driversdk run` on this client")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)
    logs = sub.add_parser("logs", parents=[where], help="print a task's collected stdout (or --stderr)")
    logs.add_argument("task")
    logs.add_argument("--alloc", help="allocation id (prefix); default: the newest run of the task")
    logs.add_argument("--stderr", action="store_true")
    logs.add_argument("-n", "--tail", type=_count, metavar="N", help="only the last N lines, across rotated files")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing while the task runs")
    logs.set_defaults(func=cmd_logs)

    system = sub.add_parser("system", parents=[where], help="maintenance of this client's data dir")
    system_sub = system.add_subparsers(dest="system_cmd", required=True)
    gc = system_sub.add_parser("gc", parents=[where], help="garbage-collect every terminal allocation now")
    gc.set_defaults(func=cmd_system_gc)

    pstatus = plugin_sub.add_parser("status", parents=[where], help="CSI plugins registered on this client")
    pstatus.add_argument("--json", action="store_true")
    pstatus.set_defaults(func=cmd_plugin_status)

    volume = sub.add_parser("volume", parents=[where], help="register and inspect CSI volumes on this client")
    vsub = volume.add_subparsers(dest="volume_cmd", required=True)
    register = vsub.add_parser("register", parents=[where], help="register a volume, or merge an update onto it")
    register.add_argument("file", help="volume specification (HCL)")
    register.set_defaults(func=cmd_volume_register)
    vstatus = vsub.add_parser("status", parents=[where], help="list volumes, or show one (secrets never shown)")
    vstatus.add_argument("id", nargs="?")
    vstatus.add_argument("--namespace", default="default")
    vstatus.add_argument("--json", action="store_true")
    vstatus.set_defaults(func=cmd_volume_status)
    dereg = vsub.add_parser("deregister", parents=[where], help="forget a volume")
    dereg.add_argument("id")
    dereg.add_argument("--namespace", default="default")
    dereg.set_defaults(func=cmd_volume_deregister)
    create = vsub.add_parser("create", parents=[where], help="create a volume through its plugin and register it")
    create.add_argument("file", help="volume specification (HCL): capacity_min/max, topology_request, …")
    create.set_defaults(func=cmd_volume_create)
    delete = vsub.add_parser("delete", parents=[where], help="delete a volume through its plugin (not while claimed)")
    delete.add_argument("id")
    delete.add_argument("--namespace", default="default")
    delete.add_argument("--secret", action="append", metavar="KEY=VALUE", help="a secret for DeleteVolume")
    delete.set_defaults(func=cmd_volume_delete)
    detach = vsub.add_parser("detach", parents=[where], help="release the claims of allocations that are over")
    detach.add_argument("volume")
    detach.add_argument("--alloc", help="only this allocation's claim (id or prefix)")
    detach.add_argument("--namespace", default="default")
    detach.set_defaults(func=cmd_volume_detach)
    snapshot = vsub.add_parser("snapshot", parents=[where], help="snapshots of volumes, when the plugin has them")
    ssub = snapshot.add_subparsers(dest="snapshot_cmd", required=True)
    screate = ssub.add_parser("create", parents=[where], help="snapshot a volume")
    screate.add_argument("volume")
    screate.add_argument("name", nargs="?", help="snapshot name (default: the volume's name and the time)")
    screate.add_argument("--namespace", default="default")
    screate.add_argument("--secret", action="append", metavar="KEY=VALUE")
    screate.add_argument("--parameter", action="append", metavar="KEY=VALUE")
    screate.set_defaults(func=cmd_volume_snapshot_create)
    sdelete = ssub.add_parser("delete", parents=[where], help="delete a snapshot")
    sdelete.add_argument("plugin_id")
    sdelete.add_argument("snapshot_id")
    sdelete.add_argument("--secret", action="append", metavar="KEY=VALUE")
    sdelete.set_defaults(func=cmd_volume_snapshot_delete)
    slist = ssub.add_parser("list", parents=[where], help="list snapshots")
    slist.add_argument("-plugin", "--plugin", dest="plugin", help="only this CSI plugin's snapshots")
    slist.add_argument("--secret", action="append", metavar="KEY=VALUE")
    slist.add_argument("--json", action="store_true")
    slist.set_defaults(func=cmd_volume_snapshot_list)
    volume_verbs.add_agent_flags(pstatus, register, vstatus, dereg, create, delete, detach, screate, sdelete, slist)
    return parser


# Which of --client / --data-dir each command reads; the others refuse them (exit 2) rather than
# ignore them. A command missing here takes neither.
DATA_DIR_OPTIONS = ("client", "data_dir")
_TAKES: dict[Any, tuple[str, ...]] = {
    cmd_validate: ("client",),
    cmd_run: ("client",),
    cmd_status: DATA_DIR_OPTIONS,
    cmd_logs: DATA_DIR_OPTIONS,
    cmd_system_gc: DATA_DIR_OPTIONS,
    cmd_plugin_status: DATA_DIR_OPTIONS,
    cmd_volume_register: DATA_DIR_OPTIONS,
    cmd_volume_status: DATA_DIR_OPTIONS,
    cmd_volume_deregister: DATA_DIR_OPTIONS,
    cmd_volume_create: DATA_DIR_OPTIONS,
    cmd_volume_delete: DATA_DIR_OPTIONS,
    cmd_volume_detach: DATA_DIR_OPTIONS,
    cmd_volume_snapshot_create: DATA_DIR_OPTIONS,
    cmd_volume_snapshot_delete: DATA_DIR_OPTIONS,
    cmd_volume_snapshot_list: DATA_DIR_OPTIONS,
    # The agent's verbs: the data dir names the local agent's socket (and a stop while it is down).
    job_verbs.cmd_job_status: DATA_DIR_OPTIONS,
    job_verbs.cmd_job_stop: DATA_DIR_OPTIONS,
    alloc_verbs.cmd_alloc_status: DATA_DIR_OPTIONS,
    alloc_verbs.cmd_alloc_logs: DATA_DIR_OPTIONS,
    node_verbs.cmd_node_status: DATA_DIR_OPTIONS,
    acl_verbs.cmd_acl_bootstrap: DATA_DIR_OPTIONS,
}


def _merge_where(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Apply a --client / --data-dir given before the sub-command, and refuse one given to a command
    that would not read it."""
    takes = _TAKES.get(args.func, ())
    for name in DATA_DIR_OPTIONS:
        flag = "--" + name.replace("_", "-")
        early = getattr(args, "global_" + name, None)
        if name not in takes and (early is not None or getattr(args, name, None) is not None):
            parser.error(f"{flag} does not apply to `{_command(args)}`")
        if early is not None and getattr(args, name, None) is None:
            setattr(args, name, early)


def _command(args: argparse.Namespace) -> str:
    keys = ("plugin_cmd", "volume_cmd", "snapshot_cmd", "system_cmd", "job_cmd", "alloc_cmd", "node_cmd", "acl_cmd")
    words = [args.cmd] + [getattr(args, k) for k in keys if getattr(args, k, None)]
    return "driversdk " + " ".join(words)


# Packages that only an extra installs (pyproject's optional dependencies), by import name.
_EXTRA_OF = {
    "hcl2": "runner",
    "lark": "runner",
    "hcl": "runner",
    "docker": "docker",
    "requests": "docker",
    "pyroute2": "exec",
}


def _print_traceback() -> None:
    import traceback  # only for --debug: a verb that succeeds does not load it

    traceback.print_exc()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _merge_where(parser, args)
    try:
        code: int = args.func(args)
    except DriverSDKError as err:
        if args.debug:
            _print_traceback()
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as err:
        extra = _EXTRA_OF.get((err.name or "").split(".")[0])
        if extra is None:
            raise
        if args.debug:
            _print_traceback()
        print(
            f"error: `{_command(args)}` needs the {extra!r} extra, which is not installed (no module {err.name!r}); "
            f"install it with: pip install 'driversdk[{extra}]'",
            file=sys.stderr,
        )
        return 1
    except BrokenPipeError:
        # The reader went away (`driversdk logs web | head`): not a failure of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not complain about the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:  # the last stop before a traceback would reach an operator
        if args.debug:
            _print_traceback()
        # One sentence: what failed, where, and how to see more; the traceback is for --debug.
        where = f" ({err.filename})" if isinstance(err, OSError) and err.filename else ""
        detail = (err.strerror if isinstance(err, OSError) and err.strerror else str(err)) or type(err).__name__
        print(
            f"error: `{_command(args)}` failed unexpectedly: {type(err).__name__}: {detail}{where}"
            + ("" if args.debug else "; run again with --debug for the traceback"),
            file=sys.stderr,
        )
        return 1
    return code


def entry() -> NoReturn:
    """The ``driversdk`` command: :func:`main`, then out without the interpreter's teardown.

    Tearing down the ~400 modules a validate or run loads (the HCL parsers' tables, grpc,
    protobuf) takes ~0.1 s after the last line is printed; nothing needs it once the exit handlers
    (logging's flush, weakref finalizers) have run and no thread of ours is left. With a
    non-daemon thread still running, the interpreter exits as usual, waiting for it."""
    code = main()
    if any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a reader that went away (BrokenPipeError) or a closed stream: nothing left to say
    os._exit(code)


if __name__ == "__main__":
    entry()
