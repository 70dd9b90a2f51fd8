"""The dev agent's data dir and socket sit at a fixed path in the shared temp dir. Another local
user who makes that path first must get neither root's state nor root's jobs and token: the agent
refuses a data dir it does not own alone, and the CLI does not talk to a socket in such a dir."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays another local user: root only")


def _shared_tmp(tmp_path: Path) -> Path:
    """A temp dir like /tmp: world-writable and sticky."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    return tmp


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    return {**env, "TMPDIR": str(tmp)}


def test_dev_agent_refuses_a_data_dir_another_user_made(tmp_path: Path) -> None:
    tmp = _shared_tmp(tmp_path)
    planted = tmp / f"driversdk-dev-{os.geteuid()}"
    planted.mkdir()
    os.chown(planted, NOBODY, NOBODY)
    os.chmod(planted, 0o777)
    done = subprocess.run([sys.executable, "-m", "driversdk.cli", "agent", "-dev"], cwd=ROOT, env=_env(tmp),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "is not a private directory" in done.stderr and "Traceback" not in done.stderr
    assert sorted(os.listdir(planted)) == []  # no state.db, lock or socket written into the attacker's dir


def test_cli_does_not_talk_to_a_socket_in_another_users_dir(tmp_path: Path) -> None:
    tmp = _shared_tmp(tmp_path)
    planted = tmp / f"driversdk-dev-{os.geteuid()}"
    planted.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(planted / "agent.sock"))
    listener.listen(4)
    os.chown(planted, NOBODY, NOBODY)
    received: list[bytes] = []

    def accept() -> None:
        listener.settimeout(8)
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        received.append(conn.recv(65536))
        conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        done = subprocess.run([sys.executable, "-m", "driversdk.cli", "job", "status", "--data-dir", str(tmp_path)],
                              cwd=ROOT, env={**_env(tmp), "NOMAD_TOKEN": "secret-token"}, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    finally:
        listener.close()
        thread.join(12)
    assert received == []  # nothing, not even the token, went to the planted socket
    assert done.returncode == 1 and "no driversdk agent is running here" in done.stderr
