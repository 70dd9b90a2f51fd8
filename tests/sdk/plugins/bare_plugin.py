#!/usr/bin/env python3
"""A plugin with only the go-plugin services, whose misbehaviour tests choose by env var.

BARE_MODE: "" (normal), "crash" (raise at start), "hang" (never handshake), "garbage" (print
to stdout before the handshake), "child" (start a `sleep` child and report its pid on stderr).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

mode = os.environ.get("BARE_MODE", "")
if mode == "crash":
    sys.stderr.write("bare plugin: configuration file /etc/bare.conf is unreadable\n")
    raise SystemExit(3)
if mode == "hang":
    time.sleep(3600)
if mode == "garbage":
    print("hello from a chatty plugin", flush=True)

from driversdk.plugin.server import serve_plugin  # noqa: E402


def register(server: grpc.aio.Server) -> None:
    # serve_plugin hands over its asyncio server before it listens, on the event loop, for a
    # plugin to add its own services. This one has none: the go-plugin services are all it
    # serves. A plugin whose register fails this way never handshakes, so every test would say so.
    import asyncio

    import grpc

    if not isinstance(server, grpc.aio.Server):
        raise TypeError(f"register got {type(server).__name__}, not a grpc.aio.Server")
    asyncio.get_running_loop()  # RuntimeError unless called on the server's event loop


def after_start() -> None:
    log = logging.getLogger("bare")
    if mode == "child":
        child = subprocess.Popen(["sleep", "300"])
        log.info("child started", extra={"child_pid": child.pid})
    log.info("record at microsecond zero")


if mode in ("child", "log"):
    import threading

    threading.Timer(0.3, after_start).start()

serve_plugin(register, name="bare")
