"""The ``driversdk`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from enum import Enum
from typing import Any

from driversdk.errors import DriverSDKError


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def cmd_plugin_probe(args: argparse.Namespace) -> int:
    """Launch a plugin as a Nomad client would and print what it says about itself."""
    from driversdk.client import launch
    from driversdk.hclspec import decode

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
    client = launch(args.command, timeout=args.timeout)
    try:
        info = client.plugin_info()
        schema = client.config_schema()
        client.set_config(config)
        client.init()
        caps = client.capabilities()
        fingerprint = next(iter(client.fingerprint()))
        report = {
            "name": info.name,
            "plugin_version": info.plugin_version,
            "plugin_api_versions": list(info.plugin_api_versions),
            "plugin_config": decode(schema, b"", what="defaults") if schema and not config else config,
            "capabilities": _plain(asdict(caps)),
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
        print(f"  health:       {report['health']} ({report['health_description']})")
        caps_text = ", ".join(f"{k}={v}" for k, v in report["capabilities"].items())
        print(f"  capabilities: {caps_text}")
        for key, value in report["attributes"].items():
            print(f"  {key} = {value}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a job file against the client config, its drivers and this host before any start."""
    from driversdk.runner.validate import check_files

    report = check_files(args.job, args.client)
    if not report.job and report.problems and not report.checked and len(report.problems) == 1:
        problem = report.problems[0]
        if not problem.file and not args.json:  # a file that cannot be read as HCL at all
            print(f"error: {problem}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        for line in report.checked:
            print(f"ok    {line}")
        for problem in report.problems:
            print(f"error {problem}")
        verdict = "valid" if report.valid else f"{len(report.problems)} problem(s)"
        name = report.job or args.job
        # repr escapes control characters; a hostile 5000-character name is shortened.
        print(f"job {name if len(name) <= 60 else name[:60] + '...'!r}: {verdict}")
    return 0 if report.valid else 1


def cmd_run(args: argparse.Namespace) -> int:
    """Run jobs' tasks here through their driver plugins; Ctrl-C stops them cleanly. Exit 0 when
    every task succeeded, 1 when one failed, 2 when the run was refused before anything started."""
    from driversdk.runner.clientconfig import load_client
    from driversdk.runner.events import printer
    from driversdk.runner.run import EXIT_REFUSED, RunRefused, run_jobs

    try:
        return run_jobs(list(args.job), load_client(args.client), printer(args.json, lambda s: print(s, flush=True)))
    except RunRefused as err:  # before anything started
        print(f"error: {err}", file=sys.stderr)
        return EXIT_REFUSED


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

    records = RunState(_data_dir(args, existing=True)).tasks()
    if args.json:
        print(json.dumps([{k: v for k, v in r.__dict__.items() if k != "handle"} for r in records], indent=2))
        return 0
    if not records:
        print("no tasks have been run with this data_dir")
    for r in records:
        result = "" if r.exit_code is None else f" exit={r.exit_code}" + (f" signal={r.signal}" if r.signal else "")
        oom = " oom-killed" if r.oom else ""
        print(f"{r.alloc_id[:8]}  {r.job}/{r.group}/{r.task}  {r.driver:<8} {r.state}{result}{oom}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Print a task's collected log files in order; -f keeps following while the task runs."""
    import time

    from driversdk.runner.run import log_files
    from driversdk.runner.runstate import RunState, RunStateError

    state = RunState(_data_dir(args, existing=True))
    records = [
        r for r in state.tasks() if r.task == args.task and (not args.alloc or r.alloc_id.startswith(args.alloc))
    ]
    if not records:
        raise RunStateError(f"task {args.task!r} has not been run with this data_dir; `driversdk status` lists tasks")
    record = records[-1]
    kind = "stderr" if args.stderr else "stdout"
    files = log_files(record.alloc_dir, record.task, kind)
    if not files and record.state != "running":
        raise RunStateError(f"log entry for task {args.task!r} and log type {kind!r} not found (were logs disabled?)")
    offsets: dict[str, int] = {}
    while True:
        for path in log_files(record.alloc_dir, record.task, kind):
            with open(path, "rb") as fh:
                fh.seek(offsets.get(path, 0))
                data = fh.read()
                offsets[path] = fh.tell()
            sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        if not args.follow:
            return 0
        current = [r for r in state.tasks() if r.alloc_id == record.alloc_id and r.task == record.task]
        if current and current[0].state != "running":
            return 0
        time.sleep(0.5)


def _volume_store(args: argparse.Namespace, *, existing: bool = False) -> Any:
    from driversdk.runner.volumes import VolumeStore

    return VolumeStore.for_data_dir(_data_dir(args, existing=existing))


def cmd_volume_register(args: argparse.Namespace) -> int:
    from driversdk.runner.volumes import parse_volume_file

    volume = parse_volume_file(args.file)
    stored, created = _volume_store(args).register(volume)
    print(f'{"registered" if created else "updated"} CSI volume "{stored.id}" (plugin "{stored.plugin_id}")')
    return 0


def cmd_volume_status(args: argparse.Namespace) -> int:
    from driversdk.runner.volumes import VolumeError, public_view

    store = _volume_store(args, existing=True)
    if args.id:
        volume = store.get(args.id, args.namespace)
        if volume is None:
            raise VolumeError(f'volume "{args.id}" is not registered in namespace "{args.namespace}"')
        view = public_view(volume)
        view["claims"] = [
            {"alloc_id": c.alloc_id, "job": c.job, "mode": c.mode, "access_mode": c.access_mode}
            for c in store.claims(volume.id, volume.namespace)
        ]
        print(json.dumps(view, indent=2))
        return 0
    volumes = store.list()
    if args.json:
        print(json.dumps([public_view(v) for v in volumes], indent=2))
    elif not volumes:
        print("no CSI volumes registered")
    for v in [] if args.json else volumes:
        caps = ", ".join(f"{c.access_mode.value}/{c.attachment_mode.value}" for c in v.capabilities)
        print(f"{v.namespace}/{v.id}  plugin={v.plugin_id}  external_id={v.remote_id}  capabilities={caps}")
    return 0


def cmd_plugin_status(args: argparse.Namespace) -> int:
    """CSI plugin instances registered on this client, each probed now."""
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
    _volume_store(args, existing=True).deregister(args.id, args.namespace)
    print(f'deregistered CSI volume "{args.id}"')
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="driversdk", description="Nomad-compatible task-driver plugins in Python.")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    sub = parser.add_subparsers(dest="cmd", required=True)
    plugin = sub.add_parser("plugin", help="work with driver plugin binaries")
    plugin_sub = plugin.add_subparsers(dest="plugin_cmd", required=True)
    probe = plugin_sub.add_parser("probe", help="launch a plugin through the handshake and describe it")
    probe.add_argument("--config", help="plugin config as JSON (encoded with the plugin's own schema)")
    probe.add_argument("--timeout", type=float, default=60.0)
    probe.add_argument("--json", action="store_true")
    probe.add_argument("command", nargs="+", help="the plugin command line")
    probe.set_defaults(func=cmd_plugin_probe)
    validate = sub.add_parser("validate", help="check a job before any task starts")
    validate.add_argument("job", help="the job file (HCL)")
    validate.add_argument("--client", help="the client config file (HCL): host volumes, plugins")
    validate.add_argument("--json", action="store_true", help="machine-readable output")
    validate.set_defaults(func=cmd_validate)

    run = sub.add_parser("run", help="run jobs' tasks on this machine (exit 0 ok, 1 a task failed, 2 refused)")
    run.add_argument("job", nargs="+", help="the job file(s) (HCL); one process runs them all, one plugin per driver")
    run.add_argument("--client", help="the client config file (HCL): data_dir, host volumes, plugins")
    run.add_argument("--json", action="store_true", help="print one JSON object per event line")
    run.set_defaults(func=cmd_run)

    status = sub.add_parser("status", help="tasks started by `driversdk run` on this client")
    status.add_argument("--client", help="client config file (for its data_dir)")
    status.add_argument("--data-dir")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)
    logs = sub.add_parser("logs", help="print a task's collected stdout (or --stderr)")
    logs.add_argument("task")
    logs.add_argument("--alloc", help="allocation id (prefix); default: the newest run of the task")
    logs.add_argument("--stderr", action="store_true")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--client", help="client config file (for its data_dir)")
    logs.add_argument("--data-dir")
    logs.set_defaults(func=cmd_logs)

    # --client / --data-dir are accepted before or after the sub-command.
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--client", default=argparse.SUPPRESS, help="client config file (for its data_dir)")
    where.add_argument("--data-dir", default=argparse.SUPPRESS, help="state directory (default: the client's)")

    pstatus = plugin_sub.add_parser("status", parents=[where], help="CSI plugins registered on this client")
    pstatus.add_argument("--json", action="store_true")
    pstatus.set_defaults(func=cmd_plugin_status)

    volume = sub.add_parser("volume", help="register and inspect CSI volumes on this client")
    volume.add_argument("--client", help="client config file (for its data_dir)")
    volume.add_argument("--data-dir", help="state directory (default: the client config's data_dir)")
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
    return parser


def _command(args: argparse.Namespace) -> str:
    words = [args.cmd] + [getattr(args, k) for k in ("plugin_cmd", "volume_cmd") if getattr(args, k, None)]
    return "driversdk " + " ".join(words)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except DriverSDKError as err:
        if args.debug:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # the last stop before a traceback would reach an operator
        if args.debug:
            traceback.print_exc()
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


if __name__ == "__main__":
    sys.exit(main())
