"""Long-lived calls on the asyncio plugin server, with real plugin subprocesses through the handshake.

The make-believe driver (plugins/streams_driver.py) runs hundreds of tasks without a process or a
thread each, so the plugin's thread count is what the SDK holds: an open WaitTask call or stream
must cost no thread. Nothing here asserts a duration; waits have generous deadlines only so that
a broken plugin fails the test instead of hanging it.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from driversdk import convert
from driversdk.errors import PluginCallError
from driversdk.pb import driver_pb2, driver_pb2_grpc
from driversdk.testing import AllocDir, DriverHarness

ROOT = Path(__file__).resolve().parents[2]
WATCHING = [sys.executable, str(ROOT / "tests" / "sdk" / "plugins" / "streams_driver.py")]
NOT_WATCHING = [*WATCHING, "--no-watch"]
HELLO = [sys.executable, str(ROOT / "examples" / "hello_driver.py")]
THREAD_BUDGET = 64
PATIENCE = 60.0


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE
    while not check():
        assert time.monotonic() < deadline, f"still not true after {PATIENCE:.0f} s: {what}"
        time.sleep(0.05)


class _Drain:
    """Reads a server stream on a thread of the test into a queue (a stream has no timed next())."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.items: queue.Queue[Any] = queue.Queue()
        self.error: grpc.RpcError | None = None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for item in self.stream:
                self.items.put(item)
        except grpc.RpcError as err:
            self.error = err
        self.items.put(None)

    def next(self) -> Any:
        return self.items.get(timeout=PATIENCE)


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[AllocDir]:
    a = AllocDir.create(tmp_path, tasks=[])
    a.add_task("t", log_collection=False)
    yield a
    a.remove()


def _stub(h: DriverHarness) -> driver_pb2_grpc.DriverStub:
    return driver_pb2_grpc.DriverStub(h.client.process.channel)


def _start(h: DriverHarness, alloc: AllocDir, count: int) -> list[str]:
    """``count`` tasks that run until stopped or destroyed."""
    ids = []
    for _ in range(count):
        task = alloc.task_config("t", driver_config={})
        h.start(task)
        ids.append(task.id)
    return ids


def _attrs(h: DriverHarness, task_id: str) -> dict[str, int]:
    return {k: int(v) for k, v in h.client.inspect_task(task_id).driver_attributes.items()}


def _stats(stub: driver_pb2_grpc.DriverStub, task_id: str, interval: float) -> Any:
    req = driver_pb2.TaskStatsRequest(task_id=task_id, collection_interval=convert.duration_to_proto(interval))
    return stub.TaskStats(req)


def test_hundreds_of_waits_and_stats_streams_hold_no_thread_each(alloc: AllocDir) -> None:
    with DriverHarness(WATCHING) as h:
        stub = _stub(h)
        ids = _start(h, alloc, 300)
        waits = [stub.WaitTask.future(driver_pb2.WaitTaskRequest(task_id=i)) for i in ids]
        stats = [_stats(stub, i, 1.0) for i in ids]
        events = stub.TaskEvents(driver_pb2.TaskEventsRequest())
        fingerprint = _Drain(stub.Fingerprint(driver_pb2.FingerprintRequest()))
        assert fingerprint.next().health == driver_pb2.FingerprintResponse.HEALTHY
        # Every stats stream has taken a sample and now waits for its next one.
        _until("300 stats streams sampled", lambda: _attrs(h, ids[0])["stats_samples"] >= 300)
        _until("the events stream listens", lambda: _attrs(h, ids[0])["event_listeners"] == 1)
        threads = _threads(h.client.process.pid)
        assert threads < THREAD_BUDGET, f"{threads} threads for 300 waits and 300 stats streams"

        # Each waiting call answers with its own task's exit, and unary calls still answer.
        for i in ids[:100]:
            h.client.stop_task(i, timeout=1, signal="")
        for done in waits[:100]:
            assert done.result(timeout=PATIENCE).result.signal == 15
        assert not any(w.done() for w in waits[100:])
        for i in ids[100:]:
            h.client.destroy_task(i, force=True)
            h.forget(i)
        for done in waits[100:]:
            assert done.result(timeout=PATIENCE).result.signal == 9
        assert _threads(h.client.process.pid) < THREAD_BUDGET
        for stream in [*stats, events]:
            stream.cancel()
        fingerprint.stream.cancel()


def test_without_watch_exit_wait_task_still_answers_and_never_starves_unary_calls(alloc: AllocDir) -> None:
    with DriverHarness(NOT_WATCHING) as h:
        stub = _stub(h)
        # More blocked waits than the driver-call pool has workers: they wait on threads of their own.
        ids = _start(h, alloc, 40)
        idle = _threads(h.client.process.pid)
        waits = [stub.WaitTask.future(driver_pb2.WaitTaskRequest(task_id=i)) for i in ids]
        again = stub.WaitTask.future(driver_pb2.WaitTaskRequest(task_id=ids[0]))  # a second caller, same task
        _until("the waits are blocked in wait_task", lambda: _threads(h.client.process.pid) >= idle + 40)
        assert h.client.inspect_task(ids[-1]).state.name == "RUNNING"
        assert h.client.capabilities().send_signals
        for i in ids:
            h.client.stop_task(i, timeout=1, signal="")
        for done in [*waits, again]:
            assert done.result(timeout=PATIENCE).result.signal == 15
        # A task that has exited answers at once.
        assert h.client.wait_task(ids[0], timeout=PATIENCE).signal == 15


def test_stops_waiting_out_their_kill_timeout_never_starve_unary_calls(alloc: AllocDir) -> None:
    with DriverHarness(WATCHING) as h:
        stub = _stub(h)
        # Counted before any call: the threads of starts that just answered may not have ended yet.
        idle = _threads(h.client.process.pid)
        # More stops blocked at once than the driver-call pool has workers.
        ids = _start(h, alloc, 40)
        stop = driver_pb2.StopTaskRequest
        stops = [
            stub.StopTask.future(stop(task_id=i, timeout=convert.duration_to_proto(3600), signal="IGNORED"))
            for i in ids
        ]
        _until("the stops are blocked", lambda: _threads(h.client.process.pid) >= idle + 40)
        assert h.client.inspect_task(ids[-1]).state.name == "RUNNING"
        assert h.client.capabilities().send_signals
        for i in ids:
            h.client.destroy_task(i, force=True)
            h.forget(i)
        for done in stops:
            done.result(timeout=PATIENCE)
        # What is left is the pool's few workers: the stop threads ended with their calls.
        _until("the stop threads ended", lambda: _threads(h.client.process.pid) < idle + 40)


@pytest.mark.parametrize("cmd", [WATCHING, NOT_WATCHING], ids=["watch_exit", "wait_task"])
def test_waiting_on_an_unknown_task_is_not_found_with_its_id(cmd: list[str]) -> None:
    with DriverHarness(cmd) as h:
        with pytest.raises(grpc.RpcError) as raw:
            _stub(h).WaitTask(driver_pb2.WaitTaskRequest(task_id="no-such-task"), timeout=PATIENCE)
        assert raw.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no-such-task" in (raw.value.details() or "")
        with pytest.raises(PluginCallError) as info:
            h.client.wait_task("no-such-task", timeout=PATIENCE)
        assert info.value.code == "NOT_FOUND"


def test_stream_errors_keep_their_status_and_sentence(alloc: AllocDir) -> None:
    with DriverHarness(WATCHING) as h:
        with pytest.raises(grpc.RpcError) as raw:
            next(_stats(_stub(h), "no-such-task", 1.0))
        assert raw.value.code() == grpc.StatusCode.NOT_FOUND and "no-such-task" in (raw.value.details() or "")
        (task_id,) = _start(h, alloc, 1)
        with pytest.raises(PluginCallError) as info:
            h.client.signal_task(task_id, "SIGNOPE")
        assert info.value.code == "INTERNAL"
        assert str(info.value) == "unknown signal 'SIGNOPE': EVENT or FINGERPRINT"


def test_events_emitted_while_streams_are_open_reach_every_stream(alloc: AllocDir) -> None:
    with DriverHarness(WATCHING) as h:
        stub = _stub(h)
        (task_id,) = _start(h, alloc, 1)
        first, second = (_Drain(stub.TaskEvents(driver_pb2.TaskEventsRequest())) for _ in range(2))
        _until("both streams listen", lambda: _attrs(h, task_id)["event_listeners"] == 2)
        h.client.signal_task(task_id, "EVENT")
        for drain in (first, second):
            event = drain.next()
            assert (event.task_id, event.message) == (task_id, task_id)
        first.stream.cancel()
        _until("the cancelled stream stopped listening", lambda: _attrs(h, task_id)["event_listeners"] == 1)
        h.client.signal_task(task_id, "EVENT")
        assert second.next().message == task_id
        second.stream.cancel()


def test_a_fingerprint_change_is_sent_at_once(alloc: AllocDir) -> None:
    with DriverHarness(WATCHING) as h:
        (task_id,) = _start(h, alloc, 1)
        stream = _Drain(_stub(h).Fingerprint(driver_pb2.FingerprintRequest()))
        assert stream.next().attributes["driver.streams.generation"].string_val == "0"
        # The interval is an hour: only notify_fingerprint_changed can bring the next one.
        for generation in ("1", "2"):
            h.client.signal_task(task_id, "FINGERPRINT")
            assert stream.next().attributes["driver.streams.generation"].string_val == generation
        stream.stream.cancel()
        _until("the cancelled stream stopped listening", lambda: _attrs(h, task_id)["fingerprint_listeners"] == 0)


def test_batched_stats_streams_each_get_fresh_samples_of_their_own_task(alloc: AllocDir) -> None:
    with DriverHarness(WATCHING) as h:
        stub = _stub(h)
        ids = _start(h, alloc, 60)
        # Sixty streams of one interval: their samples fall due together and are taken in batches.
        drains = {task_id: _Drain(_stats(stub, task_id, 0.1)) for task_id in ids}
        for task_id, drain in drains.items():
            samples = [drain.next().stats for _ in range(5)]
            assert {s.id for s in samples} == {task_id}, "a stream was answered with another task's sample"
            # The driver numbers each task's samples: each answer is a new one, none repeated.
            taken = [s.agg_resource_usage.memory.rss for s in samples]
            assert taken == sorted(set(taken)), taken
            stamps = [s.timestamp.ToNanoseconds() for s in samples]
            assert stamps == sorted(set(stamps)), stamps
        # A task that exits ends its own stream; the others it was batched with go on.
        h.client.stop_task(ids[0], timeout=1, signal="")
        ended = drains[ids[0]]
        while ended.next() is not None:
            pass
        assert ended.error is None
        after_exit = time.time_ns()
        for task_id in ids[1:]:
            while (sample := drains[task_id].next()) is not None:
                if sample.stats.timestamp.ToNanoseconds() > after_exit:
                    break
            assert sample is not None, f"the stream of {task_id} ended with another task's exit"
        for drain in drains.values():
            drain.stream.cancel()


def test_cancelled_streams_release_what_they_held(alloc: AllocDir) -> None:
    with DriverHarness(WATCHING) as h:
        stub = _stub(h)
        ids = _start(h, alloc, 50)
        stats = [_stats(stub, i, 0.1) for i in ids]
        events = [stub.TaskEvents(driver_pb2.TaskEventsRequest()) for _ in range(3)]
        fingerprints = [stub.Fingerprint(driver_pb2.FingerprintRequest()) for _ in range(3)]
        _until(
            "every stream is being served",
            lambda: (
                (a := _attrs(h, ids[0]))["event_listeners"] == 3
                and a["fingerprint_listeners"] == 3
                and a["stats_samples"] >= 100
            ),
        )
        for stream in [*stats, *events, *fingerprints]:
            stream.cancel()
        _until(
            "no listener left",
            lambda: (a := _attrs(h, ids[0]))["event_listeners"] == 0 and a["fingerprint_listeners"] == 0,
        )
        # A sample already on the pool when its stream was cancelled may still land; then none.
        deadline = time.monotonic() + PATIENCE
        samples = -1
        while (now := _attrs(h, ids[0])["stats_samples"]) != samples:
            assert time.monotonic() < deadline, "the cancelled stats streams kept sampling"
            samples = now
            time.sleep(0.5)
        time.sleep(1.0)  # ten intervals: a stream still sampling would have moved the count
        assert _attrs(h, ids[0])["stats_samples"] == samples


def _cats(pid: int) -> list[str]:
    return subprocess.run(["pgrep", "-P", str(pid), "-x", "cat"], capture_output=True, text=True).stdout.split()


def test_streaming_exec_ends_the_drivers_session_when_the_client_leaves(tmp_path: Path) -> None:
    alloc = AllocDir.create(tmp_path, tasks=["web"])
    try:
        with DriverHarness(HELLO) as h:
            task = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["60"]})
            h.start(task)
            pid = h.client.process.pid
            idle = _threads(pid)
            keep_open = threading.Event()

            def requests() -> Iterator[driver_pb2.ExecTaskStreamingRequest]:
                setup = driver_pb2.ExecTaskStreamingRequest.Setup(task_id=task.id, command=["cat"])
                yield driver_pb2.ExecTaskStreamingRequest(setup=setup)
                yield driver_pb2.ExecTaskStreamingRequest(stdin=driver_pb2.ExecTaskStreamingIOOperation(data=b"hi\n"))
                keep_open.wait()  # the client never closes its input: only the cancel can end it

            call = _stub(h).ExecTaskStreaming(requests())
            frames = _Drain(call)
            assert frames.next().stdout.data == b"hi\n"
            assert _cats(pid), "cat should be running for the session"
            call.cancel()
            keep_open.set()
            # The driver saw the end of its input: cat exited and its threads are gone.
            _until("the session's cat exited", lambda: not _cats(pid))
            _until("the session's threads ended", lambda: _threads(pid) <= idle)
            assert h.client.inspect_task(task.id).state.name == "RUNNING"
    finally:
        alloc.remove()


def test_queue_subscribers_and_listeners_hear_the_same_events(monkeypatch: pytest.MonkeyPatch) -> None:
    # In process: subscribe_events (the queue API drivers and tests used before listeners) still works.
    import importlib
    from datetime import UTC, datetime

    from driversdk.model import TaskEvent

    monkeypatch.syspath_prepend(str(Path(WATCHING[1]).parent))
    driver = importlib.import_module("streams_driver").StreamsDriver(watch=True)
    heard: list[TaskEvent] = []
    subscriber = driver.subscribe_events()
    driver.add_event_listener(heard.append)
    event = TaskEvent("t1", "a1", "web", "started", datetime.now(UTC))
    driver.emit_event(event)
    assert subscriber.get_nowait() == event and heard == [event]
    driver.unsubscribe_events(subscriber)
    driver.remove_event_listener(heard.append)
    driver.emit_event(event)
    assert subscriber.empty() and heard == [event]
    changes: list[str] = []
    driver.add_fingerprint_listener(lambda: changes.append("changed"))
    generation = driver.wait_fingerprint_change(-1, 0)
    driver.notify_fingerprint_changed()
    assert changes == ["changed"] and driver.wait_fingerprint_change(generation, 0) == generation + 1
