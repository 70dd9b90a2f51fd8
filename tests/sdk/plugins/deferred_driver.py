#!/usr/bin/env python3
"""The hello driver served through a factory: serve(build, name=..., version=...).

DEFERRED_MODE: "" (builds the hello driver), "fail" (the factory raises, as a missing heavy
module would), "mismatch" (the built driver's version is not the one declared). Each build
appends a line to DEFERRED_BUILDS so a test can see when, and how often, it happened: "built",
or "built for checks" when the host launched it only for checks (launched_for_checks()).
DEFERRED_PRELOAD=1 serves it with preload=True.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from driversdk import DriverPlugin, serve
from driversdk.serving import launched_for_checks

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
    mode = os.environ.get("DEFERRED_MODE", "")

    def build() -> DriverPlugin:
        with open(os.environ["DEFERRED_BUILDS"], "a") as fh:
            fh.write("built for checks\n" if launched_for_checks() else "built\n")
        if mode == "fail":
            raise ModuleNotFoundError("No module named 'heavy_sdk'", name="heavy_sdk")
        from hello_driver import HelloDriver

        return HelloDriver()

    preload = os.environ.get("DEFERRED_PRELOAD") == "1"
    serve(build, name="hello", version="9.9.9" if mode == "mismatch" else "0.1.0", preload=preload)
