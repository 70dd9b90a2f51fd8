"""The ``driversdk`` command line.

Each command's module is imported when that command runs, and a command line whose command is
plain to see (``driversdk [--debug] [--client F] [--data-dir D] COMMAND ...``) is parsed by a parser
holding that command alone: the agent's verbs are a few milliseconds' round trip, and building
every command's parser (or importing every command's module) would cost more than that."""

from __future__ import annotations

import argparse
import atexit
import os
import sys

from driversdk.cli.parsing import Parser, line_count
from driversdk.errors import DriverSDKError

# Not typing.TYPE_CHECKING: importing typing costs a verb ~2 ms (type checkers know this spelling).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn


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
    where = Parser(add_help=False)
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


# One builder per command word, in the order `driversdk --help` lists them.


def _plugin(sub: Any, where: argparse.ArgumentParser) -> None:
    from driversdk.cli.plugins import cmd_plugin_package, cmd_plugin_probe, cmd_plugin_test
    from driversdk.cli.volume import add_agent_flags, cmd_plugin_status

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
    pstatus = plugin_sub.add_parser("status", parents=[where], help="CSI plugins registered on this client")
    pstatus.add_argument("--json", action="store_true")
    pstatus.set_defaults(func=cmd_plugin_status)
    add_agent_flags(pstatus)


def _validate(sub: Any, where: argparse.ArgumentParser) -> None:
    from driversdk.cli.jobfile import add_job_input_flags, cmd_validate

    validate = sub.add_parser("validate", help="check a job before any task starts")
    validate.add_argument("job", help="the job file (HCL)")
    # Not the data-dir parent: validate reads the client config, and a --data-dir would be ignored.
    validate.add_argument("--client", help="the client config file (HCL): host volumes, plugins")
    validate.add_argument("--json", action="store_true", help="machine-readable output")
    add_job_input_flags(validate)
    validate.set_defaults(func=cmd_validate)


def _run(sub: Any, where: argparse.ArgumentParser) -> None:
    from driversdk.cli.jobfile import add_job_input_flags, cmd_run

    run = sub.add_parser("run", help="run jobs' tasks on this machine (exit 0 ok, 1 a task failed, 2 refused)")
    run.add_argument("job", nargs="+", help="the job file(s) (HCL); one process runs them all, one plugin per driver")
    run.add_argument("--client", help="the client config file (HCL): data_dir, host volumes, plugins")
    run.add_argument("--json", action="store_true", help="print one JSON object per event line")
    add_job_input_flags(run)
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


def _agent(sub: Any, where: argparse.ArgumentParser) -> None:
    from driversdk.cli.agentcmd import cmd_agent

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


def _verbs(module: str) -> Callable[[Any, argparse.ArgumentParser], None]:
    """Nomad's everyday verbs, each the agent's client through its HTTP API."""

    def build(sub: Any, where: argparse.ArgumentParser) -> None:
        __import__(module)
        sys.modules[module].add_parsers(sub, where)

    return build


def _status(sub: Any, where: argparse.ArgumentParser) -> None:
    from driversdk.cli.datadir import cmd_status

    status = sub.add_parser("status", parents=[where], help="tasks started by `driversdk run` on this client")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)


def _logs(sub: Any, where: argparse.ArgumentParser) -> None:
    from driversdk.cli.datadir import cmd_logs

    logs = sub.add_parser("logs", parents=[where], help="print a task's collected stdout (or --stderr)")
    logs.add_argument("task")
    logs.add_argument("--alloc", help="allocation id (prefix); default: the newest run of the task")
    logs.add_argument("--stderr", action="store_true")
    logs.add_argument("-n", "--tail", type=line_count, metavar="N", help="only the last N lines, across rotated files")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing while the task runs")
    logs.set_defaults(func=cmd_logs)


def _system(sub: Any, where: argparse.ArgumentParser) -> None:
    from driversdk.cli.datadir import cmd_system_gc

    system = sub.add_parser("system", parents=[where], help="maintenance of this client's data dir")
    system_sub = system.add_subparsers(dest="system_cmd", required=True)
    gc = system_sub.add_parser("gc", parents=[where], help="garbage-collect every terminal allocation now")
    gc.set_defaults(func=cmd_system_gc)


def _volume(sub: Any, where: argparse.ArgumentParser) -> None:
    from driversdk.cli.volume import (
        add_agent_flags,
        cmd_volume_create,
        cmd_volume_delete,
        cmd_volume_deregister,
        cmd_volume_detach,
        cmd_volume_register,
        cmd_volume_snapshot_create,
        cmd_volume_snapshot_delete,
        cmd_volume_snapshot_list,
        cmd_volume_status,
    )

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
    add_agent_flags(register, vstatus, dereg, create, delete, detach, screate, sdelete, slist)


_COMMANDS: dict[str, Callable[[Any, argparse.ArgumentParser], None]] = {
    "plugin": _plugin,
    "validate": _validate,
    "run": _run,
    "agent": _agent,
    "job": _verbs("driversdk.cli.job"),
    "alloc": _verbs("driversdk.cli.alloc"),
    "node": _verbs("driversdk.cli.node"),
    "acl": _verbs("driversdk.cli.acl"),
    "status": _status,
    "logs": _logs,
    "system": _system,
    "volume": _volume,
}


class _OneCommandParser(Parser):
    """The top level with one command's parser: what the top level refuses, it refuses as the whole
    parser does (its usage names every command)."""

    def error(self, message: str) -> NoReturn:
        build_parser().error(message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command, or ``command``'s alone."""
    # The top level keeps what it is given apart (global_client, global_data_dir): `run` and
    # `validate` have a --client of their own whose default would overwrite it; main() merges.
    parser = (Parser if command is None else _OneCommandParser)(
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
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for name, add in _COMMANDS.items():
        if command is None or name == command:
            add(sub, where)
    return parser


def _command_word(argv: Sequence[str]) -> str | None:
    """The command of a plain command line: only the data-dir options and --debug before it (as
    given, not abbreviated), else None (the whole parser reads it)."""
    at = 0
    while at < len(argv):
        word = argv[at]
        if word == "--debug" or word.startswith(("--client=", "--data-dir=")):
            at += 1
        elif word in ("--client", "--data-dir") and at + 1 < len(argv) and not argv[at + 1].startswith("-"):
            at += 2
        else:
            return word if word in _COMMANDS else None
    return None


# Which of --client / --data-dir each command reads; the others refuse them (exit 2) rather than
# ignore them. A command missing here takes neither.
DATA_DIR_OPTIONS = ("client", "data_dir")


_TAKES: dict[str, tuple[str, ...]] = {  # by the command function's name
    "cmd_validate": ("client",),
    "cmd_run": ("client",),
    "cmd_status": DATA_DIR_OPTIONS,
    "cmd_logs": DATA_DIR_OPTIONS,
    "cmd_system_gc": DATA_DIR_OPTIONS,
    "cmd_plugin_status": DATA_DIR_OPTIONS,
    "cmd_volume_register": DATA_DIR_OPTIONS,
    "cmd_volume_status": DATA_DIR_OPTIONS,
    "cmd_volume_deregister": DATA_DIR_OPTIONS,
    "cmd_volume_create": DATA_DIR_OPTIONS,
    "cmd_volume_delete": DATA_DIR_OPTIONS,
    "cmd_volume_detach": DATA_DIR_OPTIONS,
    "cmd_volume_snapshot_create": DATA_DIR_OPTIONS,
    "cmd_volume_snapshot_delete": DATA_DIR_OPTIONS,
    "cmd_volume_snapshot_list": DATA_DIR_OPTIONS,
    # The agent's verbs: the data dir names the local agent's socket (and a stop while it is down).
    "cmd_job_status": DATA_DIR_OPTIONS,
    "cmd_job_stop": DATA_DIR_OPTIONS,
    "cmd_alloc_status": DATA_DIR_OPTIONS,
    "cmd_alloc_logs": DATA_DIR_OPTIONS,
    "cmd_node_status": DATA_DIR_OPTIONS,
    "cmd_acl_bootstrap": DATA_DIR_OPTIONS,
}


def _merge_where(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Apply a --client / --data-dir given before the sub-command, and refuse one given to a command
    that would not read it."""
    takes = _TAKES.get(args.func.__name__, ())
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
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_word(words))
    args = parser.parse_args(words)
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
    # No threading module loaded, no thread of ours (a verb does not load it).
    threading = sys.modules.get("threading")
    if threading and any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
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
