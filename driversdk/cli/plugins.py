"""``driversdk plugin probe|package|test``: a driver plugin binary launched and judged as Nomad's client would."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from enum import Enum
from typing import Any

from driversdk.cli.common import CLIError


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
