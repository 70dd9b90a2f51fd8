"""A host shutting a plugin down cancels its own open streams first: the plugin's server then
stops with no call in flight (instead of waiting out its grace for streams nobody reads), and a
reader of such a stream sees it end, not a plugin that stopped answering."""

from __future__ import annotations

import sys
import threading

from driversdk.client import launch
from tests.agent.runs import ROOT

HELLO = [sys.executable, str(ROOT / "examples" / "hello_driver.py")]


def test_kill_cancels_the_open_streams_before_shutdown() -> None:
    client = launch(HELLO, name="hello")
    ended: list[str] = []
    reading = threading.Event()

    def read_events() -> None:
        try:
            stream = client.task_events()
            reading.set()
            for _ in stream:
                pass
            ended.append("ended")
        except Exception as err:  # what the reader saw when the stream was not cancelled first
            ended.append(f"{type(err).__name__}: {err}")

    reader = threading.Thread(target=read_events, daemon=True)
    reader.start()
    try:
        fingerprints = client.fingerprint()
        next(iter(fingerprints))  # open and left open, as a host that stopped reading leaves it
        assert reading.wait(30)
        assert len(client._open_streams) == 2
    finally:
        client.kill()  # what is tested; also never leaves the plugin behind when an assert failed
    reader.join(timeout=30)
    assert ended == ["ended"]
    assert client._open_streams == set()
    assert not client.process.alive()
    assert list(fingerprints) == []  # cancelled: it ends, it does not fail


def test_the_config_schema_is_asked_for_once_and_can_be_asked_for_ahead() -> None:
    client = launch(HELLO, name="hello")
    try:
        client.prefetch_config_schema()  # answered in the background
        first = client.config_schema()
        assert first is not None
        assert client.config_schema() is first
        client.set_config({})  # encodes with the same schema
        assert client.config_schema() is first
    finally:
        client.kill()
