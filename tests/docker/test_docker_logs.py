"""The docker log path: floods, long lines, the engine-side bound and plugin restarts."""

from __future__ import annotations

import os
import signal

import docker

from driversdk.testing import AllocDir, DriverHarness

from .conftest import busybox

LINES = 500_000


def test_flood_then_exit_loses_no_line(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=busybox("seq", "1", str(LINES)))
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=300).exit_code == 0
    # The task is reported done only once its output is in the fifo.
    out = alloc.stdout("web")
    assert out == b"".join(b"%d\n" % i for i in range(1, LINES + 1))


def test_long_lines_arrive_byte_identical(harness: DriverHarness, alloc: AllocDir) -> None:
    script = (
        "head -c 102400 /dev/zero | tr '\\0' a; echo; "
        "head -c 16384 /dev/zero | tr '\\0' b; echo; "
        "head -c 16385 /dev/zero | tr '\\0' c; echo; "
        "head -c 16383 /dev/zero | tr '\\0' d; echo; "
        "head -c 40000 /dev/zero | tr '\\0' e >&2; echo >&2; "
        "head -c 20000 /dev/zero | tr '\\0' f"
    )
    task = alloc.task_config("web", driver_config=busybox("/bin/sh", "-c", script))
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=60).exit_code == 0
    expected = b"a" * 102400 + b"\n" + b"b" * 16384 + b"\n" + b"c" * 16385 + b"\n" + b"d" * 16383 + b"\n"
    expected += b"f" * 20000
    assert alloc.stdout("web") == expected
    assert alloc.stderr("web") == b"e" * 40000 + b"\n"


def test_engine_log_is_bounded_like_nomad(harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient) -> None:
    task = alloc.task_config("web", driver_config=busybox("sleep", "30"))
    harness.start(task)
    container = engine.containers.get(f"web-{alloc.alloc_id}")
    assert container.attrs["HostConfig"]["LogConfig"] == {
        "Type": "json-file",
        "Config": {"max-file": "2", "max-size": "2m"},
    }
    harness.client.destroy_task(task.id, force=True)
    harness.forget(task.id)
    # A task's own logging block wins.
    own = alloc.task_config(
        "web", driver_config=busybox("sleep", "30", logging={"type": "json-file", "config": [{"max-size": "1m"}]})
    )
    harness.start(own)
    container = engine.containers.get(f"web-{alloc.alloc_id}")
    assert container.attrs["HostConfig"]["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "1m"}}


def test_plugin_restart_mid_stream_writes_no_line_twice(harness: DriverHarness, alloc: AllocDir) -> None:
    long = "x" * 20000
    script = (
        f"i=0; while [ $i -lt 40 ]; do echo line-$i; [ $i = 20 ] && echo {long}; i=$((i+1)); sleep 0.1; done; exit 3"
    )
    task = alloc.task_config("web", driver_config=busybox("/bin/sh", "-c", script))
    handle = harness.start(task)
    alloc.wait_for_output("web", b"line-5\n", 20)
    os.kill(harness.client.process.pid, signal.SIGKILL)
    client = harness.restart_plugin()
    handle.config.msgpack_driver_config = b""
    client.recover_task(handle)
    assert client.wait_task(task.id, timeout=60).exit_code == 3
    out = alloc.wait_for_output("web", b"line-39\n", 20)
    expected = [f"line-{i}" for i in range(21)] + [long] + [f"line-{i}" for i in range(21, 40)]
    assert out.decode().split() == expected
