"""`driversdk acl bootstrap`: the agent's management token, made once, printed as Nomad's CLI
prints it (``POST /v1/acl/bootstrap``)."""

from __future__ import annotations

import argparse

from driversdk.cli.apiclient import APIRequestError
from driversdk.cli.apiverbs import VerbError, api_flags, client_of, fields, print_json, say

# Not typing.TYPE_CHECKING: importing typing costs a verb ~2 ms (type checkers know this spelling).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def add_parsers(sub: Any, where: argparse.ArgumentParser) -> None:
    acl = sub.add_parser("acl", help="the agent's ACL tokens: bootstrap")
    acl_sub = acl.add_subparsers(dest="acl_cmd", required=True)
    bootstrap = acl_sub.add_parser(
        "bootstrap", parents=[api_flags(), where], help="create the management token (once; ACLs must be enabled)"
    )
    bootstrap.set_defaults(func=cmd_acl_bootstrap)


def cmd_acl_bootstrap(args: argparse.Namespace) -> int:
    client = client_of(args)
    try:
        token, _ = client.request("POST", "/v1/acl/bootstrap")
    except APIRequestError as err:
        if err.status == 400 and "disabled" in str(err):
            raise VerbError(
                "the agent has ACLs disabled: set acl { enabled = true } in its config to use tokens"
            ) from None
        if err.status == 400 and "already done" in str(err):
            raise VerbError("the ACL system was bootstrapped already; its management token was shown then") from None
        raise
    if args.json:
        print_json(token)
        return 0
    say(
        fields(
            [
                ("Accessor ID", token.get("AccessorID")),
                ("Secret ID", token.get("SecretID")),
                ("Name", token.get("Name")),
                ("Type", token.get("Type")),
                ("Global", str(bool(token.get("Global"))).lower()),
                ("Create Time", token.get("CreateTime")),
                ("Expiry Time", token.get("ExpirationTime")),
                ("Create Index", token.get("CreateIndex")),
                ("Modify Index", token.get("ModifyIndex")),
                ("Policies", "n/a"),
                ("Roles", "n/a"),
            ]
        )
    )
    return 0
