"""A plugin the agent launched keeps its log lines in a file of its own under the data dir, so a
line it logs while no agent reads its stderr (the agent was killed; the plugin lives on to be
reattached) is not lost."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

from tests.agent.agentproc import AgentProcess


def _plugin_pids(parent: int, module: str) -> list[int]:
    """The children of ``parent`` running the bundled driver ``module`` (e.g. drivers.exec)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
        if ppid == parent and f"from {module}.main import".encode() in cmdline:
            found.append(int(entry))
    return found


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_plugin_lines_after_agent_kill9_are_in_its_log_file(agent_dir: Path) -> None:
    data = agent_dir / "data"
    first = AgentProcess(data).start()
    try:
        assert first.proc is not None
        [pid] = _plugin_pids(first.proc.pid, "drivers.exec")
        log_file = data / "logs" / "plugin-exec.log"
        assert stat.S_IMODE(os.stat(log_file).st_mode) == 0o600
        deadline = time.monotonic() + 30  # the plugin's lines are written by a thread of their own
        while not any(e["@message"] == "plugin started" and e.get("pid") == pid for e in _lines(log_file)):
            assert time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.05)
        first.kill9()
        # The agent is gone; the plugin lives on and says something only it can say now.
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while not any("ignoring SIGINT" in str(e["@message"]) for e in _lines(log_file)):
            assert time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.05)
        assert "ignoring SIGINT" not in (data / "logs" / "plugins.log").read_text()  # the relay was dead
        second = AgentProcess(data).start()
        try:
            # Reattached, not relaunched: the same process, and no exec plugin of the new agent's own.
            assert second.proc is not None and os.path.exists(f"/proc/{pid}")
            assert _plugin_pids(second.proc.pid, "drivers.exec") == []
            os.kill(pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while sum("ignoring SIGINT" in str(e["@message"]) for e in _lines(log_file)) < 2:
                assert time.monotonic() < deadline, log_file.read_text()
                time.sleep(0.05)
        finally:
            second.close()
    finally:
        first.close()


def test_a_stop_logs_what_was_removed_and_no_grpc_chatter(agent_dir: Path) -> None:
    """Each call a plugin serves made grpc's Cython layer log "Loaded running loop" at debug: lines
    a job of 1000 tasks stopping wrote thousands of, formatted twice and relayed by the agent. The
    plugin's own debug lines (what a destroy removed) stay."""
    agent = AgentProcess(agent_dir / "data").start()
    try:
        agent.submit(
            'job "quiet" {\n  group "g" {\n    count = 2\n    task "t" {\n      driver = "exec"\n'
            '      kill_timeout = "1s"\n      config {\n        command = "/bin/sleep"\n        args = ["600"]\n'
            "      }\n    }\n  }\n}\n"
        )
        agent.wait_allocs("quiet", "running")
        agent.stop_jobs()
        log_file = agent_dir / "data" / "logs" / "plugin-exec.log"
        messages = [str(e["@message"]) for e in _lines(log_file)]
        assert sum(m.startswith("release: removed runc container") for m in messages) == 2, messages
        assert not [m for m in messages if "Loaded running loop" in m]
    finally:
        agent.close()
