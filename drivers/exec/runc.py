"""A thin wrapper over the runc command line: one method per runc subcommand we use."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from typing import Any

from driversdk.errors import DriverError

RUNC_TIMEOUT = 30.0
DEFAULT_ROOT = "/run/runc"
"""Where runc run as root keeps its containers' state when no --root is given."""


class RuncError(DriverError):
    """runc answered with an error; the message keeps runc's own explanation."""


@dataclass(frozen=True)
class Runc:
    path: str = "runc"
    root: str = ""
    """runc's --root state directory; empty means runc's default (/run/runc)."""

    def command(self, *args: str) -> list[str]:
        base = [self.path]
        if self.root:
            base += ["--root", self.root]
        return [*base, *args]

    def _run(self, *args: str, check: bool = True, timeout: float = RUNC_TIMEOUT) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                self.command(*args),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise RuncError(
                f"runc binary {self.path!r} was not found; install runc or set the plugin's runtime_path"
            ) from None
        except subprocess.TimeoutExpired:
            raise RuncError(f"`runc {' '.join(args)}` did not answer within {timeout:.0f}s", recoverable=True) from None
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise RuncError(f"`runc {' '.join(args)}` failed: {detail[-1] if detail else f'exit {proc.returncode}'}")
        return proc

    def version(self) -> str:
        """runc's version number, e.g. "1.1.5+ds1"."""
        out = self._run("--version", timeout=10).stdout
        first = out.splitlines()[0] if out else ""
        return first.removeprefix("runc version").strip()

    def known(self, container_id: str) -> bool:
        """Whether the runtime keeps a container of that id. runc's state.json under its root
        answers without starting a process (a destroy among 1000 tasks pays for each); when it is
        absent (already deleted, or a runtime_path such as crun keeping its state elsewhere) the
        runtime itself is asked."""
        plain = bool(container_id) and "/" not in container_id and container_id not in (".", "..")
        if plain and os.path.exists(os.path.join(self.root or DEFAULT_ROOT, container_id, "state.json")):
            return True
        return self.state(container_id) is not None

    def state(self, container_id: str) -> dict[str, Any] | None:
        proc = self._run("state", container_id, check=False)
        if proc.returncode != 0:
            return None
        state: dict[str, Any] = json.loads(proc.stdout)
        return state

    def containers(self) -> list[str]:
        return list(self.bundles())

    def bundles(self) -> dict[str, str]:
        """Container id -> bundle dir of every container runc knows under its root."""
        proc = self._run("list", "--format", "json")
        items = json.loads(proc.stdout or "null") or []
        return {str(item["id"]): str(item.get("bundle", "")) for item in items}

    def kill(self, container_id: str, signal: str, *, all_processes: bool = False) -> bool:
        """Send a signal; False when the container is already gone or stopped."""
        args = ["kill", *(["--all"] if all_processes else []), container_id, signal]
        return self._run(*args, check=False).returncode == 0

    def delete_force(self, container_id: str) -> None:
        proc = self._run("delete", "--force", container_id, check=False)
        if proc.returncode != 0 and self.state(container_id) is not None:
            raise RuncError(f"`runc delete --force {container_id}` failed: {proc.stderr.strip()}")

    def exec_command(self, container_id: str, argv: list[str], *, pid_file: str = "") -> list[str]:
        """`runc exec` argv; with pid_file runc records the exec'd process's host pid there."""
        flags = ["--pid-file", pid_file] if pid_file else []
        return self.command("exec", *flags, container_id, *argv)
