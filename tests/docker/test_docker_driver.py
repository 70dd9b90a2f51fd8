"""The docker driver as a plugin subprocess through driversdk.testing, against a real engine."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from drivers.docker.container import LABEL_ALLOC_ID
from driversdk.errors import PluginCallError
from driversdk.model import FSIsolation, HealthState, MountConfigSupport, NetworkIsolationMode, Resources, TaskState
from driversdk.mounts import Mount, Propagation
from driversdk.testing import AllocDir, DriverHarness
from driversdk.testing.conformance import run_conformance

from .conftest import IMAGE, PLUGIN, PLUGIN_CONFIG, busybox


def test_docker_capabilities_and_fingerprint(harness: DriverHarness) -> None:
    caps = harness.client.capabilities()
    assert caps.send_signals and caps.exec
    assert caps.fs_isolation is FSIsolation.IMAGE
    assert caps.mount_configs is MountConfigSupport.ALL
    assert caps.network_isolation_modes == (
        NetworkIsolationMode.HOST,
        NetworkIsolationMode.GROUP,
        NetworkIsolationMode.TASK,
    )
    assert caps.must_create_network and not caps.disable_log_collection
    fp = next(iter(harness.client.fingerprint()))
    assert fp.health is HealthState.HEALTHY and fp.health_description == "Healthy"
    assert fp.attributes["driver.docker.version"].value
    assert "driver.docker" not in fp.attributes
    assert "driver.docker.volumes.enabled" not in fp.attributes  # only present when true


def test_docker_disable_log_collection_is_advertised(
    engine: docker.DockerClient, no_leaks: None, tmp_path: Path
) -> None:
    with DriverHarness(PLUGIN, plugin_config={**PLUGIN_CONFIG, "disable_log_collection": True}) as h:
        assert h.client.capabilities().disable_log_collection
        alloc = AllocDir.create(tmp_path, tasks=[])
        alloc.add_task("web", log_collection=False)  # Nomad creates no fifos for such a driver
        task = alloc.task_config("web", driver_config=busybox("echo", "quiet"))
        h.start(task)
        assert h.client.wait_task(task.id, timeout=60).exit_code == 0
        assert not os.path.exists(task.stdout_path)


def test_docker_conformance(harness: DriverHarness, tmp_path: Path) -> None:
    results = run_conformance(harness, lambda argv: busybox(*argv), str(tmp_path), timeout=60)
    failed = [str(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)


def test_docker_run_exit_code_logs_and_naming(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient
) -> None:
    task = alloc.task_config(
        "web",
        driver_config=busybox("/bin/sh", "-c", "echo out-$NOMAD_TASK_NAME; echo err >&2; sleep 0.5; exit 3"),
    )
    harness.start(task)
    container = engine.containers.get(f"web-{alloc.alloc_id}")
    assert container.labels[LABEL_ALLOC_ID] == alloc.alloc_id
    binds = container.attrs["HostConfig"]["Binds"]
    assert f"{alloc.path}/alloc:/alloc" in binds
    # alloc/logs is writable by every task of the group: the engine gets it pinned (pinning.py).
    assert any(b.startswith(f"{alloc.path}/.driversdk-pins-") and b.endswith(":/alloc/logs:ro") for b in binds)
    result = harness.client.wait_task(task.id, timeout=60)
    assert result.exit_code == 3 and not result.oom_killed
    assert alloc.wait_for_output("web", b"out-web\n", 10)
    assert alloc.wait_for_output("web", b"err\n", 10, stderr=True)
    status = harness.client.inspect_task(task.id)
    assert status.state is TaskState.EXITED and status.completed_at is not None
    assert status.driver_attributes["container_id"] == container.id


def test_docker_stop_signal_then_kill(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config(
        "web", driver_config=busybox("/bin/sh", "-c", "trap 'echo term' TERM; while :; do sleep 0.1; done")
    )
    harness.start(task)
    time.sleep(0.5)
    harness.client.stop_task(task.id, timeout=2, signal="SIGTERM")
    result = harness.client.wait_task(task.id, timeout=60)
    assert result.exit_code in (137, 143)
    assert b"term" in alloc.stdout("web")


def test_docker_destroy_force_removes_running_container(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient
) -> None:
    task = alloc.task_config("web", driver_config=busybox("sleep", "300"))
    harness.start(task)
    with pytest.raises(PluginCallError) as info:
        harness.client.destroy_task(task.id, force=False)
    assert "must call StopTask for the given task before Destroy or set force to true" in str(info.value)
    harness.client.destroy_task(task.id, force=True)
    harness.forget(task.id)
    with pytest.raises(docker.errors.NotFound):
        engine.containers.get(f"web-{alloc.alloc_id}")


def test_docker_signal_exec_and_streaming_exec_with_tty(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config(
        "web", driver_config=busybox("/bin/sh", "-c", "trap 'echo hup' HUP; while :; do sleep 0.1; done")
    )
    harness.start(task)
    time.sleep(0.5)
    harness.client.signal_task(task.id, "SIGHUP")
    alloc.wait_for_output("web", b"hup", 15)
    res = harness.client.exec_task(task.id, ["/bin/sh", "-c", "echo in; echo er >&2; exit 2"], timeout=30)
    assert (res.stdout, res.stderr, res.result.exit_code) == (b"in\n", b"er\n", 2)
    out, err, result = harness.client.exec_task_streaming(
        task.id, ["/bin/sh", "-c", "cat; echo bye >&2; exit 6"], stdin=[b"hello\n"]
    ).collect()
    assert (out, err, result.exit_code) == (b"hello\n", b"bye\n", 6)

    def held_open() -> Iterator[bytes]:
        # A tty session whose stdin closes at once loses its terminal; keep it open a while.
        time.sleep(2)
        yield b""

    out, _, result = harness.client.exec_task_streaming(
        task.id, ["/bin/sh", "-c", "sleep 0.5; stty size; tty"], tty=True, tty_size=(33, 101), stdin=held_open()
    ).collect()
    assert b"33 101" in out and b"/dev/pts/" in out and result.exit_code == 0
    with pytest.raises(PluginCallError, match="unknown signal 'SIGBOGUS'") as bogus:
        harness.client.signal_task(task.id, "SIGBOGUS")
    # The SDK's parser answers as this driver always did: INTERNAL, not recoverable.
    assert bogus.value.code == "INTERNAL" and not bogus.value.recoverable
    # Nomad sends "SIGTERM"-style names; the short and lower-case forms are accepted too.
    harness.client.signal_task(task.id, "hup")


def test_docker_stats_stream(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=busybox("sleep", "30"))
    harness.start(task)
    stream = harness.client.task_stats(task.id, interval=0.3)
    samples = [next(stream), next(stream)]
    stream.close()
    assert all(s.usage.memory.usage > 0 for s in samples)


def test_docker_memory_limit_applied_and_oom_reported(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient
) -> None:
    task = alloc.task_config(
        "web",
        driver_config=busybox("/bin/sh", "-c", "sleep 0.5; x=a; while :; do x=$x$x; done"),
        resources=Resources(cpu_shares=100, memory_mb=16),
    )
    harness.start(task)
    host_config = engine.containers.get(f"web-{alloc.alloc_id}").attrs["HostConfig"]
    assert host_config["Memory"] == 16 * 1024 * 1024
    assert host_config["CpuShares"] == 100
    result = harness.client.wait_task(task.id, timeout=120)
    assert result.oom_killed and result.exit_code == 137


def test_docker_missing_image_names_image_and_cause(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config("web", driver_config=busybox("true", image="driversdk-test/nope:1.0"))
    with pytest.raises(PluginCallError) as info:
        harness.start(task)
    msg = str(info.value)
    assert "task 'web': Failed to pull `driversdk-test/nope:1.0`:" in msg
    assert "the image is not present locally" in msg


def test_docker_load_image_from_tar(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient, tmp_path: Path
) -> None:
    tag = "driversdk-test/loaded:1"
    engine.images.get(IMAGE).tag(tag)
    archive = alloc.path / "web" / "local" / "image.tar"
    with open(archive, "wb") as fh:
        for chunk in engine.api.get_image(tag):
            fh.write(chunk)
    engine.images.remove(tag)
    try:
        task = alloc.task_config("web", driver_config=busybox("echo", "loaded", image=tag, load="image.tar"))
        harness.start(task)
        assert harness.client.wait_task(task.id, timeout=60).exit_code == 0
        assert engine.images.get(tag)
    finally:
        engine.images.remove(tag, force=True)


def test_docker_gated_options_say_what_to_change(harness: DriverHarness, alloc: AllocDir) -> None:
    cases = [
        (busybox("true", privileged=True), "Docker privileged mode is disabled on this Nomad agent"),
        (busybox("true", cap_add=["sys_admin"]), "driver does not allow the following capabilities: sys_admin"),
        (
            busybox("true", volumes=["/etc:/host-etc"]),
            "volumes are not enabled; cannot mount host path: '/etc:/host-etc'",
        ),
        (
            busybox("true", mount=[{"type": "volume", "target": "/v", "source": "vol"}]),
            "volumes are not enabled; cannot mount volume",
        ),
        (
            busybox("true", mount=[{"type": "nfs", "target": "/v"}]),
            'invalid mount type, must be "bind", "volume", "tmpfs"',
        ),
        (busybox("true", command=" true"), "command contains extra white space"),
    ]
    for cfg, expected in cases:
        task = alloc.task_config("web", driver_config=cfg)
        with pytest.raises(PluginCallError) as info:
            harness.start(task)
        assert expected in str(info.value), cfg
        assert info.value.code == "INVALID_ARGUMENT"


def test_docker_volumes_inside_alloc_dir_and_tmpfs_allowed(harness: DriverHarness, alloc: AllocDir) -> None:
    (alloc.path / "web" / "local" / "data.txt").write_text("from-local")
    task = alloc.task_config(
        "web",
        driver_config=busybox(
            "/bin/sh",
            "-c",
            "cat /v/data.txt; grep ' /scratch ' /proc/self/mountinfo | grep -q tmpfs && echo tmpfs-ok",
            volumes=["local:/v:ro"],
            mount=[{"type": "tmpfs", "target": "/scratch", "tmpfs_options": {"size": 1048576}}],
        ),
    )
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=60).exit_code == 0
    assert alloc.wait_for_output("web", b"from-localtmpfs-ok", 10)


# --- mounts and propagation -------------------------------------------------------------------


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True)


def _shared_source(tmp_path: Path, host_mounts: list[str], mode: str = "shared") -> Path:
    src = tmp_path / f"src-{mode}"
    src.mkdir()
    _run("mount", "--bind", str(src), str(src))
    host_mounts.append(str(src))
    _run("mount", f"--make-{mode}", str(src))
    return src


@pytest.mark.parametrize(
    ("mode", "flag"),
    [(Propagation.PRIVATE, "private"), (Propagation.HOST_TO_TASK, "master:"), (Propagation.BIDIRECTIONAL, "shared:")],
)
def test_docker_propagation_flags_in_container_mountinfo(
    harness: DriverHarness, alloc: AllocDir, tmp_path: Path, host_mounts: list[str], mode: Propagation, flag: str
) -> None:
    src = _shared_source(tmp_path, host_mounts)
    task = alloc.task_config(
        "web",
        driver_config=busybox("/bin/sh", "-c", "grep ' /data ' /proc/self/mountinfo"),
        mounts=[Mount("/data", str(src), propagation=mode, request_name="data")],
    )
    harness.start(task)
    assert harness.client.wait_task(task.id, timeout=60).exit_code == 0
    line = alloc.wait_for_output("web", b"/data", 10).decode()
    fields = line.split(" - ")[0].split()[6:]
    if flag == "private":
        assert not any(f.startswith(("shared:", "master:")) for f in fields), line
    else:
        assert any(f.startswith(flag) for f in fields), line


def test_docker_host_to_task_sees_a_mount_made_after_start(
    harness: DriverHarness, alloc: AllocDir, tmp_path: Path, host_mounts: list[str]
) -> None:
    src = _shared_source(tmp_path, host_mounts)
    (src / "later").mkdir()
    task = alloc.task_config(
        "web",
        driver_config=busybox(
            "/bin/sh",
            "-c",
            "for i in $(seq 1 100); do [ -f /data/later/marker ] && echo seen && exit 0; sleep 0.1; done; exit 1",
        ),
        mounts=[Mount("/data", str(src), propagation=Propagation.HOST_TO_TASK, request_name="data")],
    )
    harness.start(task)
    time.sleep(0.5)
    _run("mount", "-t", "tmpfs", "tmpfs", str(src / "later"))
    host_mounts.append(str(src / "later"))
    (src / "later" / "marker").write_text("x")
    assert harness.client.wait_task(task.id, timeout=60).exit_code == 0
    assert b"seen" in alloc.stdout("web")


def test_docker_refuses_before_creating_anything(
    harness: DriverHarness, alloc: AllocDir, tmp_path: Path, host_mounts: list[str], engine: docker.DockerClient
) -> None:
    private = tmp_path / "private"
    private.mkdir()
    _run("mount", "--bind", str(private), str(private))
    host_mounts.append(str(private))
    _run("mount", "--make-private", str(private))
    cases = [
        (
            Mount("/data", str(private), propagation=Propagation.HOST_TO_TASK, request_name="data"),
            f'task "web" volume "data": propagation_mode "host-to-task" (rslave) needs the host source "{private}" '
            f'on a shared or slave mount, but it sits on "{private}", which is private',
        ),
        (
            Mount("/data", str(tmp_path), readonly=True, propagation=Propagation.BIDIRECTIONAL, request_name="data"),
            'task "web" volume "data": propagation_mode "bidirectional" needs a read-write mount',
        ),
    ]
    for mount, expected in cases:
        task = alloc.task_config("web", driver_config=busybox("true"), mounts=[mount])
        with pytest.raises(PluginCallError) as info:
            harness.start(task)
        assert expected in str(info.value)
        assert not engine.containers.list(all=True, filters={"name": f"web-{alloc.alloc_id}"})


# --- recovery ---------------------------------------------------------------------------------


def test_docker_recover_after_plugin_killed(harness: DriverHarness, alloc: AllocDir) -> None:
    task = alloc.task_config(
        "web",
        driver_config=busybox(
            "/bin/sh", "-c", "i=0; while [ $i -lt 30 ]; do echo line-$i; i=$((i+1)); sleep 0.1; done; exit 7"
        ),
    )
    handle = harness.start(task)
    alloc.wait_for_output("web", b"line-3\n", 20)
    os.kill(harness.client.process.pid, signal.SIGKILL)
    client = harness.restart_plugin()
    handle.config.msgpack_driver_config = b""  # Nomad does not persist it
    client.recover_task(handle)
    client.recover_task(handle)  # recovering a tracked task is a no-op
    assert client.wait_task(task.id, timeout=60).exit_code == 7
    out = alloc.wait_for_output("web", b"line-29\n", 20)
    lines = out.decode().split()
    assert lines == [f"line-{i}" for i in range(30)], "lines lost or duplicated across the restart"


def test_docker_recover_unknown_container_fails(harness: DriverHarness, alloc: AllocDir) -> None:
    from driversdk.model import TaskHandle

    task = alloc.task_config("web", driver_config=busybox("true"))
    bogus = TaskHandle(
        config=task,
        driver_state=b'{"container_id": "0000deadbeef", "image": "x", "image_id": "y", "tty": false, '
        b'"log_state_dir": "/tmp", "logs": false, "version": 1}',
    )
    with pytest.raises(PluginCallError, match="failed to inspect container for id '0000deadbeef'"):
        harness.client.recover_task(bogus)


def test_docker_group_network_pause_container(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient
) -> None:
    spec, created = harness.client.create_network(alloc.alloc_id, "web-host")
    try:
        assert created and spec.mode is NetworkIsolationMode.GROUP
        again, created_again = harness.client.create_network(alloc.alloc_id, "web-host")
        assert not created_again and again.labels == spec.labels
        task = alloc.task_config(
            "web", driver_config=busybox("/bin/sh", "-c", "hostname; ls /sys/class/net"), network=spec
        )
        harness.start(task)
        assert harness.client.wait_task(task.id, timeout=60).exit_code == 0
        out = alloc.wait_for_output("web", b"lo", 10)
        assert b"web-host" in out and b"eth0" not in out
    finally:
        harness.client.destroy_network(alloc.alloc_id, spec)
    assert not engine.containers.list(all=True, filters={"name": f"nomad_init_{alloc.alloc_id}"})


def test_docker_start_failure_leaves_no_created_container(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient
) -> None:
    # The engine creates the container, then cannot start it: it must not stay behind.
    task = alloc.task_config("web", driver_config=busybox("/no/such/binary"))
    with pytest.raises(PluginCallError) as info:
        harness.start(task)
    assert "task 'web': failed to start container" in str(info.value)
    assert info.value.recoverable
    assert not engine.containers.list(all=True, filters={"name": f"web-{alloc.alloc_id}"})


def test_docker_extra_labels_and_image_gc(engine: docker.DockerClient, no_leaks: None, tmp_path: Path) -> None:
    tag = "driversdk-test/gc-probe:1"
    engine.images.get(IMAGE).tag(tag)  # a second tag of the shared test image: GC must only untag it
    config = {**PLUGIN_CONFIG, "extra_labels": ["job_*", "task_name"], "gc": {"image": True, "image_delay": "1s"}}
    try:
        with DriverHarness(PLUGIN, plugin_config=config) as h:
            alloc = AllocDir.create(tmp_path, tasks=["web"])
            task = alloc.task_config("web", driver_config=busybox("sleep", "30", image=tag), job="shop")
            h.start(task)
            labels = engine.containers.get(f"web-{alloc.alloc_id}").labels
            assert labels["com.hashicorp.nomad.job_name"] == "shop"
            assert labels["com.hashicorp.nomad.job_id"] == "shop"
            assert labels["com.hashicorp.nomad.task_name"] == "web"
            assert "com.hashicorp.nomad.node_id" not in labels
            h.client.destroy_task(task.id)
            h.forget(task.id)
            # The last user is gone: after image_delay the image is removed.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    engine.images.get(tag)
                except docker.errors.ImageNotFound:
                    break
                time.sleep(0.2)
            else:
                pytest.fail("gc.image did not remove the unused image")
            assert engine.images.get(IMAGE), "GC must not delete other tags of the same image"
    finally:
        try:
            engine.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
