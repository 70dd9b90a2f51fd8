"""For benches that time `driversdk run` with its default linger: the plugins the last run kept
idle (driversdk.runner.linger) and the run server (driversdk.runner.runserver) are stopped when the
bench ends, not when their linger runs out, since the bench removes the dirs they were kept for."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stop_run_servers(cache_dir: Path) -> None:
    """The run servers listening in the bench's cache dir (driversdk.runner.runserver)."""
    sys.path.insert(0, str(ROOT))
    from driversdk.runner.runwire import stop_servers

    stop_servers(str(cache_dir))


def stop_kept_plugins(data_dir: Path) -> None:
    """The plugins the bench's runs kept for its data dir (what `driversdk stop-kept` stops)."""
    sys.path.insert(0, str(ROOT))
    from driversdk.runner.linger import stop_kept
    from driversdk.runner.runstate import RunState

    if not (data_dir / "state.db").exists():
        return
    state = RunState(str(data_dir))
    try:
        stop_kept(state)
    finally:
        state.close()
