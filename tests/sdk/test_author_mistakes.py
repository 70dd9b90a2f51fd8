"""A driver author's mistakes reach the host as one sentence naming the method and what was expected.

Each case runs tests/sdk/plugins/mistaken_driver.py as a real plugin subprocess (go-plugin
handshake, gRPC on a unix socket) with one mistake switched on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.errors import PluginCallError
from driversdk.testing import AllocDir, DriverHarness

PLUGIN = [sys.executable, str(Path(__file__).resolve().parent / "plugins" / "mistaken_driver.py")]


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[AllocDir]:
    a = AllocDir.create(tmp_path, tasks=["web"])
    yield a
    a.remove()


def _harness(mistake: str) -> DriverHarness:
    return DriverHarness(PLUGIN, env={**os.environ, "MISTAKE": mistake})


def _one_sentence(err: PluginCallError) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def _sleep(alloc: AllocDir, seconds: str = "30") -> object:
    return alloc.task_config("web", driver_config={"command": "/bin/sleep", "args": [seconds]})


def test_start_task_returning_a_dict_names_the_method_and_the_type(alloc: AllocDir) -> None:
    with _harness("start_dict") as h, pytest.raises(PluginCallError) as info:
        h.start(alloc.task_config("web", driver_config={"command": "/bin/true"}))
    text = _one_sentence(info.value)
    assert "MistakenDriver.start_task returned dict; expected driversdk.model.TaskHandle" in text


def test_capabilities_returning_none_names_the_method(alloc: AllocDir) -> None:
    # SetConfig/Init do not ask for capabilities; the host's first Capabilities call fails readably.
    with _harness("capabilities_none") as h, pytest.raises(PluginCallError) as info:
        h.client.capabilities()
    assert "MistakenDriver.capabilities returned None; expected driversdk.model.Capabilities" in _one_sentence(
        info.value
    )


def test_fingerprint_returning_a_dict_names_the_method() -> None:
    with _harness("fingerprint_dict") as h, pytest.raises(PluginCallError) as info:
        next(iter(h.client.fingerprint()))
    assert "MistakenDriver.fingerprint returned dict; expected driversdk.model.Fingerprint" in _one_sentence(info.value)


def test_inspect_and_exec_returning_the_wrong_type_name_the_method(alloc: AllocDir) -> None:
    with _harness("inspect_dict") as h:
        task = _sleep(alloc)
        h.start(task)  # type: ignore[arg-type]
        with pytest.raises(PluginCallError) as info:
            h.client.inspect_task(task.id)  # type: ignore[attr-defined]
    assert "MistakenDriver.inspect_task returned dict; expected driversdk.model.TaskStatus" in _one_sentence(info.value)
    with _harness("exec_tuple") as h:
        task = _sleep(alloc)
        h.start(task)  # type: ignore[arg-type]
        with pytest.raises(PluginCallError) as info:
            h.client.exec_task(task.id, ["/bin/true"], timeout=10)  # type: ignore[attr-defined]
    assert "MistakenDriver.exec_task returned tuple; expected driversdk.model.ExecResult" in _one_sentence(info.value)


def test_wait_task_returning_an_int_names_the_method(alloc: AllocDir) -> None:
    with _harness("wait_int") as h:
        task = alloc.task_config("web", driver_config={"command": "/bin/true"})
        h.start(task)
        with pytest.raises(PluginCallError) as info:
            h.client.wait_task(task.id, timeout=30)
    assert "MistakenDriver.wait_task returned int; expected driversdk.model.ExitResult" in _one_sentence(info.value)


def test_an_exception_in_a_method_is_a_sentence_naming_it(alloc: AllocDir) -> None:
    with _harness("start_raises") as h, pytest.raises(PluginCallError) as info:
        h.start(alloc.task_config("web", driver_config={"command": "/bin/true"}))
    text = _one_sentence(info.value)
    assert text.startswith("MistakenDriver.start_task raised KeyError: 'command'; ")
    assert "driversdk.errors.DriverError" in text
    with _harness("signal_raises") as h:
        task = _sleep(alloc)
        h.start(task)  # type: ignore[arg-type]
        with pytest.raises(PluginCallError) as info:
            h.client.signal_task(task.id, "SIGHUP")  # type: ignore[attr-defined]
    assert _one_sentence(info.value).startswith("MistakenDriver.signal_task raised RuntimeError: boom; ")


def test_a_schema_error_names_the_schema_method_and_the_bad_type(alloc: AllocDir) -> None:
    with _harness("schema") as h:
        with pytest.raises(PluginCallError) as info:
            h.client.task_config_schema()
        text = _one_sentence(info.value)
        assert text.startswith("MistakenDriver.task_config_schema raised SpecError: ")
        assert "unknown type 'strnig'" in text
    with _harness("schema_type") as h, pytest.raises(PluginCallError) as info:
        h.client.task_config_schema()
    assert "MistakenDriver.task_config_schema returned dict; expected a driversdk.hclspec.Spec" in _one_sentence(
        info.value
    )


def test_a_task_config_against_the_schema_names_the_task_and_the_field(alloc: AllocDir) -> None:
    import grpc
    import msgpack

    from driversdk import convert
    from driversdk.errors import ConfigError
    from driversdk.pb import driver_pb2, driver_pb2_grpc

    with _harness("") as h:
        # The host encodes with the plugin's own schema and refuses before sending anything...
        with pytest.raises(ConfigError) as refused:
            h.start(alloc.task_config("web", driver_config={"command": "/bin/true", "args": "not-a-list"}))
        assert str(refused.value) == "task 'web' config: args is a string, expected a list(string)"
        # ...and the plugin decodes what a host sent anyway against the same schema.
        task = alloc.task_config("web")
        task.msgpack_driver_config = msgpack.packb({"command": "/bin/true", "args": "not-a-list"})
        stub = driver_pb2_grpc.DriverStub(h.client.process.channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.StartTask(driver_pb2.StartTaskRequest(task=convert.task_config_to_proto(task)), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "task 'web' config: args is a string, expected a list(string)"
