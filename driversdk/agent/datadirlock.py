"""One agent per data dir: an exclusive ``flock`` on ``<data_dir>/agent.lock``, held for the
agent's life and dropped by the kernel when the process dies (a ``kill -9`` leaves no stale lock).
The file records the holder's pid, for the sentence that refuses a second agent."""

from __future__ import annotations

import fcntl
import os

from driversdk.errors import ConfigError

LOCK_NAME = "agent.lock"


class DataDirBusy(ConfigError):
    """Another agent (or ``driversdk run``) holds the data dir."""


class DataDirLock:
    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise DataDirBusy(
                f"another driversdk agent{who} already uses the data dir {os.path.dirname(self.path)}; stop it first, "
                "or give this agent another data_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def holder(self) -> int | None:
        """The pid of the live agent holding the lock, or None."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                return int(text) if text.isdigit() else 0
            return None
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
