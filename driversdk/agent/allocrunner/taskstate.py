"""A task runner's lifecycle as one state machine: the states, the transitions allowed between
them, and the one place a state changes.

A task runner holds no thread while its task runs (a node runs a thousand tasks), so its loop is
not a blocked thread: each event (the start returned, the driver's wait settled, a kill or the
agent's shutdown was asked for, the driver plugin died) moves the machine through
:meth:`TaskStateMachine.transition`, which refuses a move the table does not allow.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from driversdk.errors import DriverSDKError


class TaskState(StrEnum):
    PENDING = "pending"  # built; nothing done yet
    PRESTART = "prestart"  # the prerun hooks run
    STARTING = "starting"  # StartTask was asked for
    RUNNING = "running"  # started or recovered; the driver's wait follows it
    RECOVERING = "recovering"  # its plugin died: a new one is dispensed and RecoverTask asked for
    KILLING = "killing"  # StopTask was sent
    EXITED = "exited"  # the wait settled: the restart policy decides what follows
    RESTARTING = "restarting"  # waits out the policy's delay before the next start
    DEAD = "dead"  # ended (finished, failed, killed, lost) or left running for the next agent


S = TaskState
# Each state, and the states it may move to. DEAD is left only by no one.
ALLOWED: dict[TaskState, frozenset[TaskState]] = {
    S.PENDING: frozenset({S.PRESTART, S.DEAD}),
    S.PRESTART: frozenset({S.STARTING, S.RUNNING, S.RESTARTING, S.DEAD}),  # RUNNING: recovered
    S.STARTING: frozenset({S.RUNNING, S.RESTARTING, S.DEAD}),
    S.RUNNING: frozenset({S.EXITED, S.KILLING, S.RECOVERING, S.DEAD}),
    S.RECOVERING: frozenset({S.RUNNING, S.KILLING, S.EXITED, S.DEAD}),
    S.KILLING: frozenset({S.EXITED, S.RECOVERING, S.DEAD}),
    S.EXITED: frozenset({S.RESTARTING, S.DEAD}),
    S.RESTARTING: frozenset({S.PRESTART, S.STARTING, S.DEAD}),
    S.DEAD: frozenset(),
}
del S


class IllegalTransition(DriverSDKError):
    """A task runner tried a state change its lifecycle does not allow (a bug in the runner)."""


@dataclass(frozen=True)
class Transition:
    before: TaskState
    after: TaskState
    why: str


class TaskStateMachine:
    """The task's state; changed only by :meth:`transition`, which checks :data:`ALLOWED` and
    keeps the last changes (for a failure's context and for tests)."""

    KEPT = 32  # transitions kept per task: enough to read a restart loop, small for a thousand tasks

    def __init__(self, task: str) -> None:
        self.task = task
        self._state = TaskState.PENDING
        self._lock = threading.Lock()
        self.history: deque[Transition] = deque(maxlen=self.KEPT)

    @property
    def state(self) -> TaskState:
        return self._state

    def transition(self, after: TaskState, why: str) -> TaskState:
        """Move to ``after`` (``why`` names the event); returns the state left. Raises
        :class:`IllegalTransition` when the table does not allow the move."""
        with self._lock:
            return self._move(after, why)

    def transition_if(self, expected: Collection[TaskState], after: TaskState, why: str) -> bool:
        """:meth:`transition` when the state is one of ``expected`` (checked and moved at once, as
        the events of two threads, a kill and the wait's end, may race); True when the state is
        ``after`` now. Being in ``after`` already is no move and nothing is kept."""
        with self._lock:
            if self._state not in expected:
                return False
            if self._state is not after:
                self._move(after, why)
            return True

    def _move(self, after: TaskState, why: str) -> TaskState:
        before = self._state
        if after not in ALLOWED[before]:
            raise IllegalTransition(
                f'task "{self.task}": its runner tried to go from {before} to {after} ({why}), '
                f"which its lifecycle does not allow; this is a bug in the task runner"
            )
        self._state = after
        self.history.append(Transition(before, after, why))
        return before

    def is_(self, *states: TaskState) -> bool:
        return self._state in states
