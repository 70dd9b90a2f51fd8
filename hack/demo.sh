#!/usr/bin/env bash
# The README's demo, on a fresh Debian machine as root: install, start dockerd, run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
exec python3 examples/demo.py
