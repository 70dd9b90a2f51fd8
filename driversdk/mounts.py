"""Mount propagation modes and the rules a mount must follow before a task starts.

This module is the one place that knows what ``private`` / ``host-to-task`` /
``bidirectional`` mean on Linux and which requests can never work.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Propagation(Enum):
    """A volume_mount ``propagation_mode``; the value is the wire string."""

    PRIVATE = "private"
    HOST_TO_TASK = "host-to-task"
    BIDIRECTIONAL = "bidirectional"

    @property
    def linux(self) -> str:
        """The recursive bind-mount propagation flag the mode maps to."""
        return _LINUX_PROPAGATION[self]

    @property
    def needs_shared_source(self) -> bool:
        """rslave and rshared only work when the host source is on a shared or slave mount."""
        return self is not Propagation.PRIVATE

    @classmethod
    def parse(cls, text: str) -> Propagation:
        """Parse a wire string; the empty string means private. Raises UnknownPropagationError."""
        if text == "":
            return cls.PRIVATE
        for mode in cls:
            if mode.value == text:
                return mode
        raise UnknownPropagationError(text)


_LINUX_PROPAGATION = {
    Propagation.PRIVATE: "rprivate",
    Propagation.HOST_TO_TASK: "rslave",
    Propagation.BIDIRECTIONAL: "rshared",
}


class UnknownPropagationError(ValueError):
    def __init__(self, text: str) -> None:
        choices = ", ".join(repr(m.value) for m in Propagation)
        super().__init__(f"unknown propagation_mode {text!r}: use one of {choices} (empty means 'private')")
        self.text = text


@dataclass(frozen=True)
class Mount:
    """One host path bound into a task."""

    task_path: str
    host_path: str
    readonly: bool = False
    propagation: Propagation = Propagation.PRIVATE
    selinux_label: str = ""
    request_name: str = ""
    """The host volume name or the CSI volume request name this mount came from."""
