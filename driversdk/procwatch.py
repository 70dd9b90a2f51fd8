"""Wait for many processes on one thread: a pidfd per process in one epoll set.

A driver that blocked a thread in ``waitpid`` (or polled a pidfd) per task needs a thread per
running task; a thousand tasks would need a thousand threads. Here one daemon thread, started on
first use, waits for all of them: a pidfd (Linux 5.3+) turns readable when its process exits,
for children and non-children alike.

::

    procwatch.watch(pid, on_exit, reap=True)                    # our own child
    procwatch.watch(pid, on_exit, reap=False, identity=check)   # someone else's process

``on_exit(returncode)`` runs on the watcher thread, so it must return quickly. ``returncode``
follows :mod:`subprocess` (exit code, or minus the signal number) for a child this module
reaped, and is None otherwise: the exit status of a process that is not our child is not ours to
read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("driversdk.procwatch")

ExitCallback = Callable[[int | None], None]


@dataclass(frozen=True)
class _Watch:
    pid: int
    callback: ExitCallback
    reap: bool


class ProcessWatcher:
    """One thread, one epoll set, any number of watched processes.

    Registrations and already-gone processes go through a queue the thread drains when an
    eventfd wakes it, so every callback runs on the watcher thread and only that thread touches
    the epoll set's bookkeeping.
    """

    def __init__(self, name: str = "procwatch") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._epoll: select.epoll | None = None
        self._wake = -1
        # (pidfd or -1 when the process is already gone, what to do on its exit)
        self._pending: list[tuple[int, _Watch]] = []

    def watch(
        self, pid: int, callback: ExitCallback, *, reap: bool, identity: Callable[[], bool] | None = None
    ) -> None:
        """Call ``callback`` once, on the watcher thread, when process ``pid`` has exited.

        ``reap`` is for our own children only: their exit is collected with ``waitpid`` so no
        zombie stays behind. A pid that is not our child must not be reaped (it is not ours,
        and ``waitpid`` would fail anyway).

        ``identity``, for a process that is not our child, tells whether ``pid`` still names the
        process meant (its number may have been reused since it was recorded). It is asked
        before the pidfd is opened and again after: the pidfd pins the process it was opened
        for, so once the second answer is yes a later reuse of the number cannot fool the watch.
        A no means the process meant is gone, and the callback runs at once.

        A process that has already exited is reported at once (an unreaped child is a zombie,
        whose pidfd is readable at once; anything else has no pidfd to open).
        """
        fd = -1
        if identity is None or identity():
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                fd = -1
            if fd >= 0 and identity is not None and not identity():
                os.close(fd)
                fd = -1
        with self._lock:
            self._start_locked()
            self._pending.append((fd, _Watch(pid, callback, reap)))
        os.eventfd_write(self._wake, 1)

    def _start_locked(self) -> None:
        if self._thread is not None:
            return
        _raise_fd_limit()
        self._epoll = select.epoll()
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._epoll.register(self._wake, select.EPOLLIN)
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._epoll is not None
        epoll = self._epoll
        # Owned by this thread alone: the pidfds in the epoll set and what each is for.
        watches: dict[int, _Watch] = {}
        while True:
            for fd, _mask in epoll.poll():
                if fd == self._wake:
                    self._take_pending(epoll, watches)
                    continue
                watch = watches.pop(fd, None)
                if watch is None:
                    continue
                epoll.unregister(fd)
                os.close(fd)
                self._exited(watch)

    def _take_pending(self, epoll: select.epoll, watches: dict[int, _Watch]) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._wake)
        with self._lock:
            pending, self._pending = self._pending, []
        for fd, watch in pending:
            if fd < 0:
                self._exited(watch)
                continue
            watches[fd] = watch
            # Level-triggered: a process that exited before this line is reported by the next poll.
            epoll.register(fd, select.EPOLLIN)

    def _exited(self, watch: _Watch) -> None:
        code: int | None = None
        if watch.reap:
            code = _reap(watch.pid)
        try:
            watch.callback(code)
        except Exception:
            log.exception("exit callback for pid %d failed", watch.pid)


def _reap(pid: int) -> int | None:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            # The pidfd turns readable only once the process is a zombie, so this does not block
            # in practice; it is here so a kernel that reported early cannot leave a zombie.
            done, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None  # reaped elsewhere (or never our child): nothing left to collect
    return os.waitstatus_to_exitcode(status)


# The soft open-file limit before _raise_fd_limit lifted it (None while it has not).
_original_nofile_soft: int | None = None


def original_nofile_soft() -> int | None:
    """The soft open-file limit this process had before the watcher raised it, or None.

    Go restores the original soft limit in the processes it starts, so Nomad's tasks keep the
    limit the agent was started with; a driver passes this one on to its tasks the same way."""
    return _original_nofile_soft


def _raise_fd_limit() -> None:
    """Each watched process holds a pidfd: lift the soft open-file limit to the hard one, as Go
    programs (and with them Nomad) do at start-up, so a thousand tasks do not run out of fds."""
    global _original_nofile_soft
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as err:
        log.warning("could not raise the open file limit from %d to %d: %s", soft, hard, err)
        return
    _original_nofile_soft = soft
    log.info("raised the open file limit from %d to %d (one pidfd per watched process)", soft, hard)


_default = ProcessWatcher()


def watch(pid: int, callback: ExitCallback, *, reap: bool, identity: Callable[[], bool] | None = None) -> None:
    """:meth:`ProcessWatcher.watch` on the process-wide watcher."""
    _default.watch(pid, callback, reap=reap, identity=identity)
