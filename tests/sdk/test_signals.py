"""driversdk.signals: the one signal-name parser validate and the drivers share."""

from __future__ import annotations

import signal

import pytest

from driversdk.errors import ConfigError, DriverError
from driversdk.signals import UnknownSignalError, signal_name, signal_number


@pytest.mark.parametrize("name", ["SIGTERM", "sigterm", "TERM", "term", "SigTerm"])
def test_spellings_of_one_signal(name: str) -> None:
    assert signal_name(name) == "SIGTERM"
    assert signal_number(name) == signal.SIGTERM


@pytest.mark.parametrize("name", ["SIGBOGUS", "", "SIG_DFL", "SIG_IGN", "15", "SIGTERM "])
def test_unknown_names_are_refused_with_one_sentence(name: str) -> None:
    with pytest.raises(UnknownSignalError) as err:
        signal_name(name)
    assert str(err.value) == f"failed to parse signal: unknown signal {name!r}; use a name such as SIGTERM"


def test_unknown_signal_is_a_plain_driver_error() -> None:
    # Not a ConfigError: the drivers' SignalTask/StopTask have always answered INTERNAL.
    assert issubclass(UnknownSignalError, DriverError)
    assert not issubclass(UnknownSignalError, ConfigError)
    with pytest.raises(UnknownSignalError) as err:
        signal_name("nope")
    assert not err.value.recoverable
