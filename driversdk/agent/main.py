"""``driversdk agent``: start the agent, serve its API until SIGINT or SIGTERM, then go.

A normal agent leaves its tasks running when it stops (the next agent on the data dir recovers
them), as a Nomad client does. A ``-dev`` agent is a throwaway: on the way out it stops every job
it ran and removes its data dir, so nothing of it is left.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import shutil
import signal
import sys
import threading

from driversdk.agent.agent import Agent
from driversdk.agent.api.httpserver import Listeners
from driversdk.agent.api.routes import handle
from driversdk.agent.settings import AgentSettings
from driversdk.mallocarenas import limit_malloc_arenas

# Plugin log files: each plugin's lines, kept across agent restarts (the agent's own stderr is
# not), rotated at this size with this many old files kept.
PLUGIN_LOG_BYTES = 10 * 1024 * 1024
PLUGIN_LOG_FILES = 3


class _PluginLines(logging.Handler):
    """A plugin's log lines (relayed from its stderr by the plugin host) in the agent's log."""

    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self.agent = agent

    def emit(self, record: logging.LogRecord) -> None:
        name = record.name.removeprefix("driversdk.plugin.")
        self.agent.log(record.levelname.lower(), f"client.driver_mgr.{name}: {record.getMessage()}")


class _PluginLogFile(logging.handlers.RotatingFileHandler):
    """plugins.log; a line that cannot be written (a full disk) is dropped and counted, never
    a traceback on the agent's stderr."""

    dropped = 0

    def handleError(self, record: logging.LogRecord) -> None:
        self.dropped += 1


def _plugin_logging(agent: Agent) -> None:
    logs = os.path.join(agent.client.data_dir, "logs")
    os.makedirs(logs, mode=0o700, exist_ok=True)
    to_file = _PluginLogFile(os.path.join(logs, "plugins.log"), maxBytes=PLUGIN_LOG_BYTES, backupCount=PLUGIN_LOG_FILES)
    to_file.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    logger = logging.getLogger("driversdk.plugin")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(to_file)
    logger.addHandler(_PluginLines(agent))
    logger.propagate = False


def run_agent(settings: AgentSettings, allow_unauthenticated_loopback: bool = False) -> int:
    settings.check(allow_unauthenticated_loopback)
    limit_malloc_arenas()  # before the agent's threads: see driversdk.mallocarenas
    agent = Agent(settings)
    if settings.ephemeral_data_dir:
        # A fixed path in the shared temp dir: another local user may have made it first (their
        # directory, or a link) to read the state or swap the socket. Only a private dir of ours.
        from driversdk.pinning import private_dir

        private_dir(settings.data_dir)
    elif settings.dev:
        os.makedirs(settings.data_dir, mode=0o700, exist_ok=True)
    agent.log("info", f"agent: starting (data dir {settings.data_dir})")
    agent.start()
    _plugin_logging(agent)
    listeners = Listeners(agent, handle)
    try:
        listeners.start()
    except BaseException:
        agent.shutdown()
        raise

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    say("==> driversdk agent started! Log data will stream in below:")
    say(f"    API: unix://{settings.socket_path}")
    if listeners.tcp_address is not None:
        host, port = listeners.tcp_address
        say(f"    API: http://{host}:{port}" + (" (ACL tokens required)" if settings.acl_enabled else ""))
    if settings.dev:
        say(f"    dev mode: export NOMAD_ADDR=unix://{settings.socket_path}; jobs are stopped when the agent exits")
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        pass
    say("==> caught signal, shutting down")
    listeners.stop()
    if settings.dev:
        _stop_everything(agent)
        if settings.ephemeral_data_dir:
            shutil.rmtree(settings.data_dir, ignore_errors=True)
    else:
        agent.shutdown()
    return 0


def _stop_everything(agent: Agent) -> None:
    """The dev agent's exit: every job stopped and its allocations torn down, the plugins shut down."""
    with agent._lock:
        runners = list(agent.runners.values())
    for runner in runners:
        runner.stopping.set()
    for runner in runners:
        runner.ended.wait(120)
    agent.close()
