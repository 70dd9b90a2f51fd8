"""What several commands share: the error class of a command line, the data dir a command works on, and
``--flag key=value`` lists."""

from __future__ import annotations

import argparse
import os

from driversdk.errors import DriverSDKError


class CLIError(DriverSDKError):
    """A command line that cannot be acted on (bad --config, a data dir that does not exist)."""


def resolve_data_dir(args: argparse.Namespace, *, existing: bool = False) -> str:
    """The data dir the command works on; ``existing`` for commands that only read it, which
    must not create an empty one (and then report that nothing ran) when the path is wrong."""
    from driversdk.jobspec.clientconfig import load_client

    path = str(getattr(args, "data_dir", None) or load_client(getattr(args, "client", None)).data_dir)
    if existing and not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise CLIError(
            f"data dir {path} {what}; nothing has been run with it (check --data-dir or the client config's data_dir)"
        )
    return path


def key_values(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"{flag} takes KEY=VALUE, not {item!r}")
        out[key] = value
    return out
