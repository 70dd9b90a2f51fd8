"""The driver API end to end: the example hello driver as a real plugin subprocess.

Each test goes through the go-plugin handshake and real gRPC on a unix socket. Where the
reference lists what implementations get wrong (driver-protocol §6, §8), the test checks the
raw wire message, not only what our own client makes of it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_status import rpc_status

from driversdk import convert
from driversdk import hclspec as hs
from driversdk.errors import PluginCallError
from driversdk.model import (
    GO_ZERO_TIME_SECONDS,
    Attribute,
    Fingerprint,
    HealthState,
    MountConfigSupport,
    NetworkIsolationMode,
    TaskState,
)
from driversdk.pb import base_pb2, base_pb2_grpc, driver_pb2, driver_pb2_grpc, recoverable_error_pb2
from driversdk.testing import AllocDir, DriverHarness

HELLO = [sys.executable, str(Path(__file__).resolve().parents[2] / "examples" / "hello_driver.py")]


@pytest.fixture
def harness() -> Iterator[DriverHarness]:
    with DriverHarness(HELLO, plugin_config={"greeting": "hi"}) as h:
        yield h


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[AllocDir]:
    a = AllocDir.create(tmp_path, tasks=["web"])
    yield a
    a.remove()


def _raw(h: DriverHarness) -> driver_pb2_grpc.DriverStub:
    return driver_pb2_grpc.DriverStub(h.client.process.channel)


def test_hello_plugin_info_is_what_nomad_loads(harness: DriverHarness) -> None:
    base = base_pb2_grpc.BasePluginStub(harness.client.process.channel)
    info = base.PluginInfo(base_pb2.PluginInfoRequest(), timeout=10)
    assert info.type == base_pb2.DRIVER == 2
    assert "v0.1.0" in info.plugin_api_versions
    assert info.name == "hello"
    assert info.plugin_version == "0.1.0"


def test_hello_set_config_twice_and_empty_without_nomad_config(harness: DriverHarness) -> None:
    # Nomad's validation launch: SetConfig twice, nomad_config unset; msgpack_config may be empty.
    base = base_pb2_grpc.BasePluginStub(harness.client.process.channel)
    base.SetConfig(base_pb2.SetConfigRequest(plugin_api_version="v0.1.0"), timeout=10)
    base.SetConfig(base_pb2.SetConfigRequest(plugin_api_version="v0.1.0"), timeout=10)
    fp = next(iter(harness.client.fingerprint()))
    # Empty config means the schema default applies.
    assert fp.attributes["driver.hello.greeting"].value == "hello"


def test_hello_bad_plugin_config_names_field(harness: DriverHarness) -> None:
    base = base_pb2_grpc.BasePluginStub(harness.client.process.channel)
    import msgpack

    with pytest.raises(grpc.RpcError) as info:
        base.SetConfig(base_pb2.SetConfigRequest(msgpack_config=msgpack.packb({"greting": "x"})), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "greting" in info.value.details()
    assert "hello plugin config" in info.value.details()


def test_hello_capabilities_on_the_wire(harness: DriverHarness) -> None:
    raw = _raw(harness).Capabilities(driver_pb2.CapabilitiesRequest(), timeout=10).capabilities
    # Field 6 (mount_configs) must really be on the wire: the hello driver cannot mount.
    assert raw.mount_configs == driver_pb2.DriverCapabilities.NO_MOUNTS == 1
    assert list(raw.network_isolation_modes) == [driver_pb2.NetworkIsolationSpec.HOST]
    caps = harness.client.capabilities()
    assert caps.mount_configs is MountConfigSupport.NONE
    assert caps.network_isolation_modes == (NetworkIsolationMode.HOST,)
    assert caps.send_signals and caps.exec


def test_hello_task_schema_round_trips(harness: DriverHarness) -> None:
    spec = harness.client.task_config_schema()
    assert isinstance(spec, hs.Spec)
    raw = _raw(harness).TaskConfigSchema(driver_pb2.TaskConfigSchemaRequest(), timeout=10)
    assert raw.HasField("spec")


def test_hello_fingerprint_answers_at_once_and_stays_open(harness: DriverHarness) -> None:
    stream = _raw(harness).Fingerprint(driver_pb2.FingerprintRequest())
    first = next(stream)
    assert first.health == driver_pb2.FingerprintResponse.HEALTHY
    assert first.health_description == "Healthy"
    # Nomad sets driver.<name> itself; a plugin must not send the bare key.
    assert "driver.hello" not in first.attributes
    assert first.attributes["driver.hello.greeting"].string_val == "hi"
    # Still open: the stream has not ended after the first answer.
    assert stream.is_active()
    stream.cancel()


def test_hello_lifecycle_through_fifos(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config(
        "web", driver_config={"command": "/bin/sh", "args": ["-c", "echo out; echo err >&2; exit 3"]}
    )
    handle = harness.start(task)
    assert handle.version >= 1
    result = harness.client.wait_task(task.id, timeout=30)
    assert result.exit_code == 3 and not result.successful
    assert alloc.wait_for_output("web", b"out\n", 10)
    assert alloc.wait_for_output("web", b"err\n", 10, stderr=True)
    # Waiting again on an exited task answers at once with the same result.
    assert harness.client.wait_task(task.id, timeout=5).exit_code == 3
    status = harness.client.inspect_task(task.id)
    assert status.state is TaskState.EXITED and status.result is not None and status.result.exit_code == 3
    harness.client.destroy_task(task.id, force=True)
    harness.forget(task.id)
    with pytest.raises(PluginCallError) as info:
        harness.client.inspect_task(task.id)
    assert info.value.code == "NOT_FOUND"
    assert task.id in str(info.value)


def test_hello_start_echoes_task_config_in_handle(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config={"command": "/bin/true"})
    task = harness.client.encode_task_config(task)
    resp = _raw(harness).StartTask(
        driver_pb2.StartTaskRequest(task=__import__("driversdk.convert").convert.task_config_to_proto(task)),
        timeout=30,
    )
    harness._tasks.add(task.id)
    assert resp.handle.version >= 1
    assert resp.handle.config.id == task.id
    assert resp.handle.config.msgpack_driver_config == task.msgpack_driver_config
    assert resp.handle.config.alloc_dir == task.alloc_dir


def test_hello_inspect_running_task_has_zero_completed_time(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["30"]})
    harness.start(task)
    raw = _raw(harness).InspectTask(driver_pb2.InspectTaskRequest(task_id=task.id), timeout=10)
    assert raw.HasField("task") and raw.task.HasField("result")
    assert raw.task.HasField("started_at") and raw.task.started_at.seconds > 0
    assert raw.task.HasField("completed_at")
    assert raw.task.completed_at.seconds == GO_ZERO_TIME_SECONDS and raw.task.completed_at.nanos == 0
    assert raw.task.state == driver_pb2.RUNNING
    harness.client.stop_task(task.id, timeout=5, signal="")
    assert harness.client.wait_task(task.id, timeout=30).signal == 15


def test_hello_stop_escalates_to_kill_after_timeout(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config={"command": "/bin/sh", "args": ["-c", "trap '' TERM; sleep 60"]})
    harness.start(task)
    time.sleep(0.3)  # let the shell install its trap
    harness.client.stop_task(task.id, timeout=0.5, signal="SIGTERM")
    assert harness.client.wait_task(task.id, timeout=30).signal == 9


def test_hello_signal_and_exec(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config(
        "web",
        driver_config={
            "command": "/bin/sh",
            "args": ["-c", "trap 'echo got-hup' HUP; while :; do sleep 0.1; done"],
        },
    )
    harness.start(task)
    time.sleep(0.3)
    harness.client.signal_task(task.id, "SIGHUP")
    alloc.wait_for_output("web", b"got-hup", 10)
    res = harness.client.exec_task(task.id, ["/bin/sh", "-c", "echo $NOMAD_TASK_NAME; exit 4"], timeout=10)
    assert res.stdout == b"web\n" and res.result.exit_code == 4
    raw = _raw(harness).ExecTask(driver_pb2.ExecTaskRequest(task_id=task.id, command=["/bin/true"]), timeout=10)
    assert raw.HasField("result")
    with pytest.raises(PluginCallError) as info:
        harness.client.signal_task(task.id, "SIGNOPE")
    assert "SIGNOPE" in str(info.value)


def test_hello_unsupported_calls_answer_unimplemented_with_a_sentence(harness: DriverHarness) -> None:
    with pytest.raises(PluginCallError) as info:
        harness.client.create_network("alloc-1")
    assert info.value.code == "UNIMPLEMENTED"
    assert str(info.value) == "the 'hello' driver does not support creating networks"


def test_hello_stats_stream_until_exit(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config={"command": "/bin/sh", "args": ["-c", "sleep 1.5"]})
    harness.start(task)
    raw = _raw(harness).TaskStats(
        driver_pb2.TaskStatsRequest(task_id=task.id, collection_interval=convert.duration_to_proto(0.2))
    )
    samples = list(raw)  # ends by itself once the task exits
    assert len(samples) >= 2
    for resp in samples:
        # Nomad's Go decoder needs both the timestamp and the aggregate usage.
        assert resp.stats.HasField("timestamp") and resp.stats.HasField("agg_resource_usage")
        assert resp.stats.agg_resource_usage.memory.rss > 0
        assert list(resp.stats.agg_resource_usage.memory.measured_fields) == [driver_pb2.MemoryUsage.RSS]


def test_hello_streaming_exec_frames(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["30"]})
    harness.start(task)
    stream = harness.client.exec_task_streaming(
        task.id, ["/bin/sh", "-c", "cat; echo oops >&2; exit 5"], stdin=[b"one ", b"two\n"]
    )
    out, err, result = stream.collect()
    assert out == b"one two\n" and err == b"oops\n" and result.exit_code == 5
    # On the wire: data frames, one close frame per stream, then exited with the result.
    req = iter(
        [
            driver_pb2.ExecTaskStreamingRequest(
                setup=driver_pb2.ExecTaskStreamingRequest.Setup(task_id=task.id, command=["/bin/echo", "hi"])
            ),
            driver_pb2.ExecTaskStreamingRequest(),  # a heartbeat
            driver_pb2.ExecTaskStreamingRequest(stdin=driver_pb2.ExecTaskStreamingIOOperation(close=True)),
        ]
    )
    frames = list(_raw(harness).ExecTaskStreaming(req, timeout=30))
    assert frames[-1].exited and frames[-1].result.exit_code == 0
    assert [f.stdout.close for f in frames if f.HasField("stdout")][-1] is True
    assert [f.stderr.close for f in frames if f.HasField("stderr")] == [True]
    assert b"".join(f.stdout.data for f in frames if f.HasField("stdout")) == b"hi\n"


def test_hello_many_tasks_with_open_streams_do_not_starve_the_pool(harness: DriverHarness, alloc: AllocDir) -> None:
    # Every task holds a WaitTask call and a stats stream, as a Nomad client does (gotcha 9).
    stub = _raw(harness)
    futures = []
    streams = []
    for _ in range(60):
        task = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["60"]})
        harness.start(task)
        futures.append(stub.WaitTask.future(driver_pb2.WaitTaskRequest(task_id=task.id)))
        streams.append(
            stub.TaskStats(
                driver_pb2.TaskStatsRequest(task_id=task.id, collection_interval=convert.duration_to_proto(1))
            )
        )
    caps = stub.Capabilities(driver_pb2.CapabilitiesRequest(), timeout=10)
    assert caps.HasField("capabilities")
    for s in streams:
        s.cancel()
    for f in futures:
        f.cancel()


def test_hello_start_failure_is_a_status_with_recoverable_detail(harness: DriverHarness, alloc: AllocDir) -> None:
    task = harness.client.encode_task_config(alloc.task_config("web", driver_config={"command": "/no/such/binary"}))
    from driversdk import convert

    with pytest.raises(grpc.RpcError) as info:
        _raw(harness).StartTask(driver_pb2.StartTaskRequest(task=convert.task_config_to_proto(task)), timeout=30)
    err = info.value
    assert err.code() != grpc.StatusCode.OK
    assert "cannot run '/no/such/binary'" in err.details()
    status = rpc_status.from_call(err)
    assert status is not None and status.details, "first detail must be RecoverableError"
    detail = recoverable_error_pb2.RecoverableError()
    assert status.details[0].Unpack(detail)
    assert status.details[0].type_url == ("type.googleapis.com/hashicorp.nomad.plugins.shared.structs.RecoverableError")
    assert detail.recoverable is False


def test_hello_bad_task_config_names_task_and_field(harness: DriverHarness, alloc: AllocDir) -> None:
    import msgpack

    from driversdk import convert

    task = alloc.task_config("web")
    task.msgpack_driver_config = msgpack.packb({"command": 5, "nope": True})
    with pytest.raises(grpc.RpcError) as info:
        _raw(harness).StartTask(driver_pb2.StartTaskRequest(task=convert.task_config_to_proto(task)), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "task 'web' config" in info.value.details()
    assert "nope" in info.value.details()


def test_hello_unknown_propagation_mode_is_rejected_by_name(harness: DriverHarness, alloc: AllocDir) -> None:
    from driversdk import convert

    task = harness.client.encode_task_config(alloc.task_config("web", driver_config={"command": "/bin/true"}))
    pb = convert.task_config_to_proto(task)
    pb.mounts.append(driver_pb2.Mount(task_path="/data", host_path="/tmp", propagation_mode="sideways"))
    with pytest.raises(grpc.RpcError) as info:
        _raw(harness).StartTask(driver_pb2.StartTaskRequest(task=pb), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown propagation_mode 'sideways'" in info.value.details()


def test_hello_recover_uses_handle_config_id(harness: DriverHarness, alloc: AllocDir) -> None:
    from driversdk import convert

    task = alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": ["30"]})
    handle = harness.start(task)
    # Nomad leaves task_id empty and, after an agent restart, msgpack_driver_config too.
    pb = convert.task_handle_to_proto(handle)
    pb.config.msgpack_driver_config = b""
    _raw(harness).RecoverTask(driver_pb2.RecoverTaskRequest(task_id="", handle=pb), timeout=10)
    # A fresh plugin process finds the task through the handle alone (its shim recorded the pid).
    client = harness.restart_plugin()
    client.recover_task(handle)
    assert client.inspect_task(task.id).state is TaskState.RUNNING
    client.stop_task(task.id, timeout=5, signal="SIGTERM")
    assert client.wait_task(task.id, timeout=30).signal == 15


def test_hello_task_events_routed_by_alloc_and_task(harness: DriverHarness, alloc: AllocDir) -> None:
    events = harness.client.task_events()
    import threading

    got: list[object] = []
    ready = threading.Event()

    def consume() -> None:
        for ev in events:
            got.append(ev)
            ready.set()
            return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    time.sleep(0.5)  # the stream must be open before the event is emitted
    task = alloc.task_config("web", driver_config={"command": "/bin/true"})
    harness.start(task)
    assert ready.wait(20)
    ev = got[0]
    assert ev.task_id == task.id and ev.alloc_id == alloc.alloc_id and ev.task_name == "web"  # type: ignore[attr-defined]
    assert "hi: started pid" in ev.message  # type: ignore[attr-defined]


def test_hello_fingerprint_health_model(harness: DriverHarness) -> None:
    fp = next(iter(harness.client.fingerprint()))
    assert fp.health is HealthState.HEALTHY


def test_hello_host_reattaches_without_set_config(tmp_path: Path) -> None:
    import driversdk

    alloc = AllocDir.create(tmp_path, tasks=["web"])
    client = driversdk.launch(HELLO)
    try:
        client.set_config({"greeting": "kept"})
        task = alloc.task_config("web", driver_config={"command": "/bin/sh", "args": ["-c", "sleep 1; exit 4"]})
        client.start_task(task)
        saved = client.process.reattach_config.to_json()
        client.process.channel.close()  # the host crashes; the plugin keeps running
        from driversdk.plugin.reattach import ReattachConfig

        again = driversdk.reattach(ReattachConfig.from_json(saved), name="hello")
        again.init()
        # The configuration survived (no SetConfig after a reattach) and so did the task.
        fp = next(iter(again.fingerprint()))
        assert fp.attributes["driver.hello.greeting"].value == "kept"
        assert again.wait_task(task.id, timeout=30).exit_code == 4
        again.destroy_task(task.id)
        again.kill()
        assert not again.process.alive()
    finally:
        client.process.kill()
        alloc.remove()


def test_attributes_read_back_from_the_wire_as_attribute_of_gives_them() -> None:
    # What driversdk.agent.pluginmanager.inprocess hands validation must be what a plugin's fingerprint reads
    # as on the host: plain values, Attributes with units, and values of other types as text.
    attrs = {"b": True, "i": 7, "f": 1.5, "s": "x", "u": Attribute(2048, "MiB"), "p": Path("/srv")}
    sent = Fingerprint(HealthState.HEALTHY, "Healthy", attrs)  # type: ignore[arg-type]
    received = convert.fingerprint_from_proto(convert.fingerprint_to_proto(sent))
    assert received.attributes == {k: Attribute.of(v) for k, v in attrs.items()}  # type: ignore[arg-type]
    assert Attribute.of(Path("/srv")) == Attribute("/srv")  # type: ignore[arg-type]
