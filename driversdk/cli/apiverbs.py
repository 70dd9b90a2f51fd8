"""What every agent-client verb (`job`, `alloc`, `node`, `acl`) shares: Nomad's global flags
(``-address``, ``-token``), ``--json``, finding the agent, the one-sentence refusals, and the
tables and ages Nomad's CLI prints. Stdlib and the API client only: these commands must start
fast and load nothing of the runner.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from driversdk.cli.apiclient import AgentClient
from driversdk.cli.parsing import Parser
from driversdk.errors import DriverSDKError

# Not typing.TYPE_CHECKING: importing typing costs a verb ~2 ms (type checkers know this spelling).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


class VerbError(DriverSDKError):
    """A verb that could not do its work (exit 1): a thing the agent does not know, an ambiguous id."""


def api_flags() -> argparse.ArgumentParser:
    """Nomad's CLI flags for reaching the agent, a parent of every verb's parser."""
    flags = Parser(add_help=False)
    group = flags.add_argument_group("agent")
    group.add_argument(
        "-address",
        "--address",
        dest="api_address",
        metavar="ADDR",
        help="the agent's HTTP API: http://host:port or unix:///path (default: NOMAD_ADDR, else the local socket)",
    )
    group.add_argument("-token", "--token", dest="api_token", metavar="TOKEN", help="ACL token (default: NOMAD_TOKEN)")
    flags.add_argument(
        "-json", "--json", dest="json", action="store_true", help="print the agent's API objects as JSON"
    )
    return flags


def data_dir_of(args: argparse.Namespace) -> str | None:
    """The data dir named by --data-dir or the --client config's data_dir; None when neither is given."""
    if getattr(args, "data_dir", None):
        return str(args.data_dir)
    if getattr(args, "client", None):
        from driversdk.jobspec.clientconfig import load_client  # the HCL reader: only when asked for

        return str(load_client(args.client).data_dir)
    return None


def client_of(args: argparse.Namespace) -> AgentClient:
    return AgentClient.find(args.api_address, args.api_token, data_dir_of(args))


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def age(nanoseconds: int | float | None, now: float | None = None) -> str:
    """How long ago, in the two largest units, as Nomad's CLI shows it (``1m3s ago``)."""
    if not nanoseconds:
        return "<none>"
    seconds = max(0, round((now if now is not None else time.time()) - nanoseconds / 1e9))
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count or (unit == "s" and not parts):
            parts.append(f"{count}{unit}")
        if len(parts) == 2:
            break
    return "".join(parts) + " ago"


def timestamp(nanoseconds: int | float | None) -> str:
    """An event's time in the local zone, as Nomad's CLI formats it (RFC 3339, seconds)."""
    if not nanoseconds:
        return "<none>"
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(nanoseconds / 1e9))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns two spaces apart, as Nomad's CLI lays them out."""
    cells = [list(map(str, headers))] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``Key = value`` lines, aligned."""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)} = {'<none>' if v in (None, '') else v}" for k, v in pairs)


def say(text: str) -> None:
    print(text, flush=True)


def warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def short(identifier: str, verbose: bool = False) -> str:
    return identifier if verbose else identifier[:8]


TERMINAL = ("complete", "failed", "lost")


def env_address() -> bool:
    """Whether the operator named an agent (NOMAD_ADDR) rather than the local one."""
    return bool(os.environ.get("NOMAD_ADDR"))
