"""Nomad's docker task options: each applied one is read back from the engine or from inside the
container; each refused one answers with its sentence before anything is created."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from driversdk.errors import PluginCallError
from driversdk.model import LinuxResources, PortMapping, Resources
from driversdk.testing import AllocDir, DriverHarness

from .conftest import IMAGE, PLUGIN, PLUGIN_CONFIG, busybox

SLEEP = ("sleep", "300")


def _container(engine: docker.DockerClient, alloc: AllocDir, task: str = "web") -> Any:
    return engine.containers.get(f"{task}-{alloc.alloc_id}")


def _sh(harness: DriverHarness, task_id: str, script: str) -> str:
    res = harness.client.exec_task(task_id, ["/bin/sh", "-c", script], timeout=30)
    assert res.result.exit_code == 0, (res.stdout, res.stderr)
    return res.stdout.decode()


def _refused(harness: DriverHarness, alloc: AllocDir, config: dict[str, Any], **task: Any) -> str:
    t = alloc.task_config("web", driver_config=config, **task)
    with pytest.raises(PluginCallError) as info:
        harness.start(t)
    return info.value.message


def test_docker_task_options_applied_read_back(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient
) -> None:
    task = alloc.task_config(
        "web",
        driver_config=busybox(
            *SLEEP,
            dns_servers=["10.11.12.13"],
            dns_search_domains=["search.example"],
            dns_options=["ndots:3"],
            extra_hosts=["db.example:10.9.8.7"],
            devices=[{"host_path": "/dev/null", "container_path": "/dev/task-null", "cgroup_permissions": "rw"}],
            ulimit={"nofile": "1024:2048"},
            sysctl={"net.core.somaxconn": "511"},
            shm_size=128 * 1024 * 1024,
            pids_limit=77,
            readonly_rootfs=True,
            security_opt=["no-new-privileges"],
            init=True,
            runtime="runc",
            healthchecks={"disable": True},
            mac_address="02:42:ac:11:00:99",
            interactive=True,
            cpuset_cpus="0",
            oom_score_adj=123,
            group_add=["4321"],
            cgroupns="private",
            mounts=[{"type": "tmpfs", "target": "/scratch", "tmpfs_options": {"size": 1048576}}],
            container_exists_attempts=2,
        ),
    )
    harness.start(task)
    c = _container(engine, alloc)
    hc, cfg = c.attrs["HostConfig"], c.attrs["Config"]
    assert hc["Dns"] == ["10.11.12.13"] and hc["DnsSearch"] == ["search.example"] and hc["DnsOptions"] == ["ndots:3"]
    assert hc["ExtraHosts"] == ["db.example:10.9.8.7"]
    assert hc["Devices"] == [
        {"PathOnHost": "/dev/null", "PathInContainer": "/dev/task-null", "CgroupPermissions": "rw"}
    ]
    assert hc["Ulimits"] == [{"Name": "nofile", "Soft": 1024, "Hard": 2048}]
    assert hc["Sysctls"] == {"net.core.somaxconn": "511"}
    assert hc["ShmSize"] == 128 * 1024 * 1024
    assert hc["PidsLimit"] == 77
    assert hc["ReadonlyRootfs"] is True
    assert hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["Init"] is True
    assert hc["Runtime"] == "runc"
    assert cfg["Healthcheck"]["Test"] == ["NONE"]
    assert cfg["OpenStdin"] is True
    assert hc["CpusetCpus"] == "0"
    assert hc["OomScoreAdj"] == 123
    assert hc["GroupAdd"] == ["4321"]
    assert hc["CgroupnsMode"] == "private"
    assert c.attrs["NetworkSettings"]["MacAddress"] == "02:42:ac:11:00:99"
    assert {"Type": "tmpfs", "Target": "/scratch", "TmpfsOptions": {"SizeBytes": 1048576}} in hc["Mounts"]
    # And as the task sees it.
    resolv = _sh(harness, task.id, "cat /etc/resolv.conf")
    assert "nameserver 10.11.12.13" in resolv and "search.example" in resolv and "ndots:3" in resolv
    assert "10.9.8.7\tdb.example" in _sh(harness, task.id, "cat /etc/hosts")
    assert _sh(harness, task.id, "grep 'open files' /proc/1/limits").split()[3:5] == ["1024", "2048"]
    assert _sh(harness, task.id, "cat /proc/sys/net/core/somaxconn").strip() == "511"
    assert _sh(harness, task.id, "cat /proc/self/oom_score_adj").strip() == "123"
    assert "4321" in _sh(harness, task.id, "id -G").split()
    assert _sh(harness, task.id, "test -c /dev/task-null && echo yes").strip() == "yes"
    touch = harness.client.exec_task(task.id, ["/bin/sh", "-c", "touch /x"], timeout=30)
    assert "read-only" in touch.stderr.decode().lower()
    assert _sh(harness, task.id, "cat /proc/1/comm").strip() == "docker-init"
    assert "/scratch" in _sh(harness, task.id, "grep ' /scratch ' /proc/mounts")


def test_docker_task_options_refused_with_a_sentence(harness: DriverHarness, alloc: AllocDir) -> None:
    assert _refused(harness, alloc, busybox(*SLEEP, isolation="hyperv")) == (
        "task 'web': Failed to create container configuration, cannot use isolation mode 'hyperv' on linux "
        "(isolation is a Windows containers option; remove it)"
    )
    assert _refused(harness, alloc, busybox(*SLEEP, port_map={"http": 8080})).startswith(
        "task 'web': 'port_map' cannot map group network ports, use 'ports' instead"
    )
    assert _refused(harness, alloc, busybox(*SLEEP, ports=["http"])) == (
        "task 'web': Port 'http' not found, check network block"
    )
    assert _refused(harness, alloc, busybox(*SLEEP, runtime="kata")) == (
        "task 'web': requested runtime 'kata' is not allowed (allow_runtimes in the docker plugin config is "
        "['runc', 'nvidia'])"
    )
    assert _refused(harness, alloc, busybox(*SLEEP, pid_mode="host")) == (
        "task 'web': cannot apply \"pid_mode\" configuration: 'host' is not in the docker plugin config's "
        "allowed_modes { pid = [...] } (add it there, or set allow_privileged)"
    )
    assert _refused(harness, alloc, busybox(*SLEEP, devices=[{"container_path": "/dev/x"}])) == (
        "task 'web': devices[0]: host path must be set in configuration for devices"
    )
    assert "invalid cgroup permission string: 'rwx'" in _refused(
        harness, alloc, busybox(*SLEEP, devices=[{"host_path": "/dev/null", "cgroup_permissions": "rwx"}])
    )
    assert _refused(harness, alloc, busybox(*SLEEP, ulimit={"nofile": "20:10"})).startswith(
        "task 'web': Malformed ulimit specification nofile: '20:10'"
    )
    assert "invalid cgroup namespace mode 'shared'" in _refused(harness, alloc, busybox(*SLEEP, cgroupns="shared"))
    assert _refused(harness, alloc, busybox(*SLEEP, volumes=["data:/data"], volume_driver="local")).startswith(
        "task 'web': volumes are not enabled; cannot use volume driver 'local'"
    )
    # Applied, and refused by this engine: its sentence is passed on.
    message = _refused(harness, alloc, busybox(*SLEEP, storage_opt={"size": "1G"}))
    assert message.startswith("task 'web': failed to create container:") and "storage-opt" in message.lower()


def test_docker_seccomp_profile_file_is_sent_compacted(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient, tmp_path: Path
) -> None:
    profile = tmp_path / "seccomp.json"
    profile.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}, indent=4))
    task = alloc.task_config("web", driver_config=busybox(*SLEEP, security_opt=[f"seccomp={profile}"]))
    harness.start(task)
    opts = _container(engine, alloc).attrs["HostConfig"]["SecurityOpt"]
    assert opts == ['seccomp={"defaultAction":"SCMP_ACT_ALLOW","syscalls":[]}']


def test_docker_modes_allowed_by_allowed_modes(engine: docker.DockerClient, no_leaks: None, tmp_path: Path) -> None:
    config = {**PLUGIN_CONFIG, "allowed_modes": {"pid": ["host"], "ipc": ["host"], "uts": ["ho*"], "userns": ["host"]}}
    with DriverHarness(PLUGIN, plugin_config=config) as h:
        alloc = AllocDir.create(tmp_path, tasks=["web"])
        task = alloc.task_config(
            "web", driver_config=busybox(*SLEEP, pid_mode="host", ipc_mode="host", uts_mode="host", userns_mode="host")
        )
        h.start(task)
        hc = _container(engine, alloc).attrs["HostConfig"]
        assert (hc["PidMode"], hc["IpcMode"], hc["UTSMode"], hc["UsernsMode"]) == ("host", "host", "host", "host")
        assert _sh(h, task.id, "hostname").strip() == socket.gethostname()
        assert _sh(h, task.id, "cat /proc/1/comm").strip() != "sleep"  # the host's pid 1
        h.client.destroy_task(task.id, force=True)
        h.forget(task.id)
        alloc.remove()


def test_docker_allowed_modes_entry_must_be_a_mode(engine: docker.DockerClient) -> None:
    with pytest.raises(PluginCallError) as info:  # SetConfig is sent at launch
        DriverHarness(PLUGIN, plugin_config={**PLUGIN_CONFIG, "allowed_modes": {"uts": ["private"]}})
    assert "cannot apply allowed_modes configuration, 'private' is not a valid uts_mode" in info.value.message


def test_docker_pids_limit_plugin_default_and_bound(
    engine: docker.DockerClient, no_leaks: None, tmp_path: Path
) -> None:
    with DriverHarness(PLUGIN, plugin_config={**PLUGIN_CONFIG, "pids_limit": 50, "oom_score_adj": 7}) as h:
        alloc = AllocDir.create(tmp_path, tasks=["web"])
        assert _refused(h, alloc, busybox(*SLEEP, pids_limit=51)) == (
            "task 'web': pids_limit cannot be greater than nomad plugin config pids_limit: 50"
        )
        task = alloc.task_config("web", driver_config=busybox(*SLEEP))
        h.start(task)
        hc = _container(engine, alloc).attrs["HostConfig"]
        assert hc["PidsLimit"] == 50 and hc["OomScoreAdj"] == 7
        h.client.destroy_task(task.id, force=True)
        h.forget(task.id)
        alloc.remove()


def test_docker_nvidia_device_uses_nvidia_runtime(engine: docker.DockerClient, no_leaks: None, tmp_path: Path) -> None:
    # No GPU here: nvidia_runtime names runc, so the rule (a task with an nvidia device runs with the
    # plugin's nvidia_runtime) is visible on any engine.
    with DriverHarness(PLUGIN, plugin_config={**PLUGIN_CONFIG, "nvidia_runtime": "runc"}) as h:
        alloc = AllocDir.create(tmp_path, tasks=["web"])
        task = alloc.task_config("web", driver_config=busybox(*SLEEP))
        task.device_env = {"NVIDIA_VISIBLE_DEVICES": "none"}
        h.start(task)
        assert _container(engine, alloc).attrs["HostConfig"]["Runtime"] == "runc"
        h.client.destroy_task(task.id, force=True)
        h.forget(task.id)
        alloc.remove()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_docker_ports_publish_allocated_ports(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient
) -> None:
    host_port = _free_port()
    task = alloc.task_config(
        "web",
        driver_config=busybox(
            "/bin/sh",
            "-c",
            "mkdir -p /tmp/www && echo hello-port > /tmp/www/index.html && httpd -f -p 8080 -h /tmp/www",
            ports=["http"],
        ),
        resources=Resources(cpu_shares=100, memory_mb=64, ports=(PortMapping("http", host_port, 8080, "127.0.0.1"),)),
    )
    harness.start(task)
    bindings = _container(engine, alloc).attrs["HostConfig"]["PortBindings"]
    assert bindings["8080/tcp"] == [{"HostIp": "127.0.0.1", "HostPort": str(host_port)}]
    assert bindings["8080/udp"] == [{"HostIp": "127.0.0.1", "HostPort": str(host_port)}]
    deadline = time.monotonic() + 20
    while True:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{host_port}/", timeout=5).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert body == b"hello-port\n"


@pytest.fixture
def user_network(engine: docker.DockerClient) -> Iterator[str]:
    name = f"driversdk-test-opts-{secrets.token_hex(3)}"
    ipam = docker.types.IPAMConfig(
        pool_configs=[
            docker.types.IPAMPool(subnet="172.31.251.0/24"),
            docker.types.IPAMPool(subnet="fd00:d5:d5::/64"),
        ]
    )
    net = engine.networks.create(name, ipam=ipam, enable_ipv6=True, labels={"io.driversdk.test": "1"})
    yield name
    net.remove()


def test_docker_endpoint_settings_on_a_user_network(
    harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient, user_network: str
) -> None:
    task = alloc.task_config(
        "web",
        driver_config=busybox(
            *SLEEP,
            network_mode=user_network,
            network_aliases=["web-alias"],
            ipv4_address="172.31.251.10",
            ipv6_address="fd00:d5:d5::10",
            advertise_ipv6_address=True,
        ),
    )
    handle = harness.start(task)
    net = _container(engine, alloc).attrs["NetworkSettings"]["Networks"][user_network]
    assert net["IPAddress"] == "172.31.251.10" and net["GlobalIPv6Address"] == "fd00:d5:d5::10"
    assert "web-alias" in net["Aliases"]
    assert handle.network_override is not None
    assert handle.network_override.addr == "fd00:d5:d5::10" and handle.network_override.auto_advertise
    harness.client.destroy_task(task.id, force=True)
    harness.forget(task.id)


def test_docker_volume_driver_and_volume_options(engine: docker.DockerClient, no_leaks: None, tmp_path: Path) -> None:
    name = f"driversdk-test-vol-{secrets.token_hex(3)}"
    other = f"{name}-mount"
    with DriverHarness(PLUGIN, plugin_config={**PLUGIN_CONFIG, "volumes": {"enabled": True}}) as h:
        alloc = AllocDir.create(tmp_path, tasks=["web"])
        task = alloc.task_config(
            "web",
            driver_config=busybox(
                *SLEEP,
                volumes=[f"{name}:/data"],
                volume_driver="local",
                mount=[
                    {
                        "type": "volume",
                        "source": other,
                        "target": "/more",
                        "volume_options": {
                            "no_copy": True,
                            "labels": [{"io.driversdk.test": "1"}],
                            "driver_config": {"name": "local"},
                        },
                    }
                ],
            ),
        )
        try:
            h.start(task)
            c = _container(engine, alloc)
            assert c.attrs["HostConfig"]["VolumeDriver"] == "local"
            mounts = {m["Destination"]: m for m in c.attrs["Mounts"]}
            assert mounts["/data"]["Type"] == "volume" and mounts["/data"]["Name"] == name
            assert mounts["/more"]["Name"] == other
            assert engine.volumes.get(other).attrs["Labels"] == {"io.driversdk.test": "1"}
            h.client.destroy_task(task.id, force=True)
            h.forget(task.id)
        finally:
            for vol in (name, other):
                try:
                    engine.volumes.get(vol).remove(force=True)
                except docker.errors.NotFound:
                    pass
            alloc.remove()


def test_docker_basic_options_read_back(harness: DriverHarness, alloc: AllocDir, engine: docker.DockerClient) -> None:
    task = alloc.task_config(
        "web",
        driver_config={
            "image": IMAGE,
            "entrypoint": ["/bin/sh", "-c"],
            "args": ["sleep 300"],
            "work_dir": "/tmp",
            "hostname": "opts-host",
            "tty": True,
            "labels": {"team": "drivers"},
            "memory_hard_limit": 96,
            "cpu_hard_limit": True,
            "cpu_cfs_period": 50000,
        },
        resources=Resources(cpu_shares=100, memory_mb=32, linux=LinuxResources(percent_ticks=0.25)),
    )
    harness.start(task)
    c = _container(engine, alloc)
    cfg, hc = c.attrs["Config"], c.attrs["HostConfig"]
    assert cfg["Entrypoint"] == ["/bin/sh", "-c"] and cfg["Cmd"] == ["sleep 300"]
    assert cfg["WorkingDir"] == "/tmp" and cfg["Hostname"] == "opts-host" and cfg["Tty"] is True
    assert cfg["Labels"]["team"] == "drivers"
    assert hc["Memory"] == 96 * 1024 * 1024 and hc["MemoryReservation"] == 32 * 1024 * 1024
    assert hc["CpuPeriod"] == 50000
    assert hc["CpuQuota"] == max(1000, int(0.25 * 50000 * (os.cpu_count() or 1)))
    assert _sh(harness, task.id, "pwd; hostname").split() == ["/tmp", "opts-host"]
