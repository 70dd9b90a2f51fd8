"""Cancelling CSI calls: a token that ends the calls in flight on it and the waits between their
attempts, so an operator's interrupt never waits out a plugin that does not answer."""

from __future__ import annotations

import threading
from collections.abc import Callable

from driversdk.csi.errors import CSIError


class CallCancelled(CSIError):
    """A CSI call was given up because its token was cancelled (an interrupt), not because the
    plugin failed; the text says what was left undone instead of the call's own error."""


class Cancel:
    """Cancelled once, for good. ``on_cancel`` callbacks run in the thread that cancels."""

    def __init__(self, reason: str = "interrupted") -> None:
        self.reason = reason
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], object]] = {}
        self._next = 0

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "") -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason or self.reason
            self._event.set()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            callback()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless cancelled first; True when cancelled."""
        return self._event.wait(seconds)

    def on_cancel(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Run ``callback`` when cancelled (at once when it is already); returns what unregisters it."""
        with self._lock:
            if not self._event.is_set():
                key = self._next
                self._next += 1
                self._callbacks[key] = callback

                def remove() -> None:
                    with self._lock:
                        self._callbacks.pop(key, None)

                return remove
        callback()
        return lambda: None

    def child(self, reason: str = "") -> Cancel:
        """A token cancelled with this one, and on its own as well."""
        token = Cancel(reason or self.reason)
        self.on_cancel(lambda: token.cancel(self.reason))
        return token
