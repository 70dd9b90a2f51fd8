"""``driversdk agent``: the agent in the foreground."""

from __future__ import annotations

import argparse
import os
import sys


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
