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

mode = os.environ.get("BARE_MODE", "")
if mode == "crash":
    sys.stderr.write("bare plugin: configuration file /etc/bare.conf is unreadable\n")
    raise SystemExit(3)
if mode == "hang":
    time.sleep(3600)
if mode == "garbage":
    print("hello from a chatty plugin", flush=True)

from driversdk.plugin.server import serve_plugin  # noqa: E402


def register(server: object) -> None:
    if mode == "child":
        # The plugin's logging is not configured yet; tell the test on the real stderr later.
        pass


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
