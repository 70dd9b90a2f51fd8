"""Pure parts of the exec driver: config, capability gates, OCI spec, state and status parsing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from drivers.exec.bundle import build_spec, chroot_entries, process_capabilities, root_propagation
from drivers.exec.config import DEFAULT_ALLOW_CAPS, PluginConfig, TaskExecConfig, task_capabilities
from drivers.exec.store import DriverState
from driversdk.errors import ConfigError
from driversdk.model import LinuxResources, NetworkIsolationMode, NetworkIsolationSpec, Resources, TaskConfig
from driversdk.mounts import Mount, Propagation
from driversdk.taskkit.cgroups import MIB, memory_limit_bytes
from driversdk.taskkit.ids import HostUser
from driversdk.taskkit.owner import ProcessIdentity
from driversdk.taskkit.shared import Spawned
from driversdk.taskkit.supervisor import read_status

NOBODY = HostUser("nobody", 65534, 65534, (), "/nonexistent")
ROOT = HostUser("root", 0, 0, (), "/root")


def _task(tmp_path: Path, **kw: object) -> TaskConfig:
    return TaskConfig(id="a/web/1", name="web", alloc_dir=str(tmp_path), **kw)  # type: ignore[arg-type]


def test_exec_config_defaults_and_mode_checks() -> None:
    plugin = PluginConfig.from_decoded({})
    assert plugin.runtime_path == "runc" and plugin.default_pid_mode == "private"
    cfg = TaskExecConfig.from_decoded({"command": "/bin/true"}, plugin, task="web")
    assert (cfg.pid_mode, cfg.ipc_mode, cfg.work_dir) == ("private", "private", "/")
    assert cfg.capabilities == tuple(sorted(DEFAULT_ALLOW_CAPS))
    with pytest.raises(ConfigError, match="plugin config default_ipc_mode 'shared' is not valid"):
        PluginConfig.from_decoded({"default_ipc_mode": "shared"})
    with pytest.raises(ConfigError, match="bridge_subnet 'nope' is not an IPv4 network"):
        PluginConfig.from_decoded({"bridge_subnet": "nope"})
    with pytest.raises(ConfigError, match=re.escape("cgroup_parent '../x' must name a cgroup below the root")):
        PluginConfig.from_decoded({"cgroup_parent": "../x"})
    assert PluginConfig.from_decoded({"cgroup_parent": "/a/b/"}).cgroup_parent == "a/b"
    with pytest.raises(ConfigError, match="chroot_env entry 'usr' must be an absolute host directory"):
        PluginConfig.from_decoded({"chroot_env": ["usr"]})
    with pytest.raises(ConfigError, match="command ' sh' must be a non-empty program path"):
        TaskExecConfig.from_decoded({"command": " sh"}, plugin, task="web")
    with pytest.raises(ConfigError, match="work_dir 'local' must be an absolute path"):
        TaskExecConfig.from_decoded({"command": "sh", "work_dir": "local"}, plugin, task="web")


def test_exec_capabilities_gate_and_delta() -> None:
    caps = task_capabilities(["CAP_NET_RAW"], ["chown"], ("net_raw", "chown", "kill"), task="web")
    assert caps == ("kill", "net_raw")
    assert "sys_admin" in task_capabilities(["sys_admin"], [], ("all",), task="web")
    assert task_capabilities([], ["all"], DEFAULT_ALLOW_CAPS, task="web") == ()
    with pytest.raises(ConfigError, match="driver does not allow the following capabilities: all"):
        task_capabilities(["all"], [], DEFAULT_ALLOW_CAPS, task="web")
    with pytest.raises(ConfigError, match="unknown capabilities bogus"):
        task_capabilities(["bogus"], [], ("all",), task="web")


def test_exec_spec_namespaces_mounts_and_propagation(tmp_path: Path) -> None:
    plugin = PluginConfig.from_decoded({"chroot_env": ["/usr", "/bin", "/does/not/exist"]})
    mounts = [
        Mount("/a", "/srv/a", propagation=Propagation.HOST_TO_TASK),
        Mount("/b", "/srv/b", readonly=True),
    ]
    net = NetworkIsolationSpec(mode=NetworkIsolationMode.GROUP, path="/var/run/netns/x")
    task = _task(tmp_path, mounts=mounts, network_isolation_spec=net, env={"A": "1"})
    decoded = {"command": "/bin/sh", "args": ["-c", "true"], "pid_mode": "host"}
    cfg = TaskExecConfig.from_decoded(decoded, plugin, task="web")
    spec, links = build_spec(task, cfg, plugin, NOBODY, cgroups_path="/x/task")
    kinds = [n["type"] for n in spec["linux"]["namespaces"]]
    assert kinds == ["mount", "uts", "ipc", "network"]  # pid_mode host: no pid namespace
    assert spec["linux"]["namespaces"][-1]["path"] == "/var/run/netns/x"
    assert spec["linux"]["rootfsPropagation"] == "rslave"
    assert spec["root"] == {"path": "rootfs", "readonly": True}
    assert spec["process"]["args"] == ["/bin/sh", "-c", "true"]
    assert "A=1" in spec["process"]["env"] and any(e.startswith("PATH=") for e in spec["process"]["env"])
    by_dest = {m["destination"]: m for m in spec["mounts"]}
    assert by_dest["/a"]["options"] == ["rbind", "rw", "rslave"]
    assert by_dest["/b"]["options"] == ["rbind", "ro", "rprivate"]
    assert by_dest["/usr"]["options"][:2] == ["rbind", "ro"]
    assert by_dest["/alloc"]["source"] == str(tmp_path / "alloc")
    # The task dirs never hold a device or a file that raises privileges.
    for dest in ("/alloc", "/local", "/secrets"):
        assert {"nosuid", "nodev"} <= set(by_dest[dest]["options"]), dest
    assert spec["process"]["noNewPrivileges"] is True
    assert spec["process"]["user"] == {"uid": NOBODY.uid, "gid": NOBODY.gid}
    assert "/does/not/exist" not in by_dest
    order = [m["destination"] for m in spec["mounts"]]
    assert order.index("/dev") < order.index("/dev/pts") < order.index("/dev/shm")
    # merged-/usr hosts: /bin is a symlink, recreated as one instead of bound.
    assert ("/bin" in links) == Path("/bin").is_symlink()


def test_exec_chroot_dir_below_tmp_is_mounted_after_the_tasks_tmp(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"  # e.g. a clone of the repo in /tmp that chroot_env exposes
    checkout.mkdir()
    (tmp_path / "web" / "tmp").mkdir(parents=True)
    plugin = PluginConfig.from_decoded({"chroot_env": [str(checkout)]})
    task = _task(tmp_path, mounts=[Mount("/local/csi", "/srv/csi")])
    cfg = TaskExecConfig.from_decoded({"command": "/bin/true"}, plugin, task="web")
    spec, _ = build_spec(task, cfg, plugin, NOBODY, cgroups_path="/x/task")
    order = [m["destination"] for m in spec["mounts"]]
    assert order.index("/tmp") < order.index(str(checkout)), order
    assert order.index("/local") < order.index("/local/csi"), order


def test_exec_root_propagation_follows_the_strongest_mount(tmp_path: Path) -> None:
    assert root_propagation(_task(tmp_path)) == "rprivate"
    both = [
        Mount("/a", "/a", propagation=Propagation.HOST_TO_TASK),
        Mount("/b", "/b", propagation=Propagation.BIDIRECTIONAL),
    ]
    assert root_propagation(_task(tmp_path, mounts=both)) == "rshared"


def test_exec_chroot_entries_skip_missing_dirs() -> None:
    mounts, _ = chroot_entries(("/definitely/missing",))
    assert mounts == []


def test_exec_memory_limit_from_resources() -> None:
    assert memory_limit_bytes(Resources(memory_mb=64)) == 64 * MIB
    assert memory_limit_bytes(Resources(memory_mb=64, memory_max_mb=128)) == 128 * MIB
    assert memory_limit_bytes(Resources(memory_mb=64, memory_max_mb=-1)) == 0
    assert memory_limit_bytes(Resources(memory_mb=64, linux=LinuxResources(memory_limit_bytes=5 * MIB))) == 5 * MIB


def test_exec_state_round_trip_and_version_gate() -> None:
    state = DriverState("dsx-1", "/s/tasks/dsx-1", False, 1.5, "runc", supervisor_pid=42)
    assert DriverState.decode(state.encode(), 1) == state
    with pytest.raises(ConfigError, match="unknown state version"):
        DriverState.decode(state.encode(), 2)
    with pytest.raises(ConfigError, match="failed to decode the exec driver's task state"):
        DriverState.decode(b"{}", 1)


# A driver_state as the exec plugin wrote it while the shared-supervisor fields were declared in
# DriverState itself; tasks started then must still be recovered, and re-saved byte for byte.
SAVED_SHARED_RUN = (
    b'{"cgroup_parent": "nomad.slice", "cgroup_v2": true, "container_id": "c1", "host_pid_mode": false, '
    b'"runc_path": "/usr/bin/runc", "runc_root": "/run/r", "started_at": 1.5, "supervisor_pid": 41, '
    b'"supervisor_start_time": 7001, "task_dir": "/s/tasks/c1", "task_pid": 42, "task_start_time": 7002, "version": 1}'
)
# One of a task under a supervisor of its own: no task or start-time fields at all.
SAVED_OWN_SUPERVISOR = (
    b'{"cgroup_parent": "nomad.slice", "cgroup_v2": true, "container_id": "c2", "host_pid_mode": false, '
    b'"runc_path": "/usr/bin/runc", "runc_root": "", "started_at": 2.5, "supervisor_pid": 43, '
    b'"task_dir": "/s/tasks/c2", "version": 1}'
)


def test_exec_state_saved_before_shared_run_state_is_recovered_and_saved_unchanged() -> None:
    state = DriverState.decode(SAVED_SHARED_RUN, 1)
    assert state.shared_run == Spawned(ProcessIdentity(41, 7001), ProcessIdentity(42, 7002))
    assert (state.container_id, state.task_dir, state.runc_path, state.cgroup_parent) == (
        "c1", "/s/tasks/c1", "/usr/bin/runc", "nomad.slice",
    )  # fmt: skip
    assert state.encode() == SAVED_SHARED_RUN
    own = DriverState.decode(SAVED_OWN_SUPERVISOR, 1)
    assert own.shared_run is None and own.supervisor_pid == 43 and own.task_pid == 0


def test_exec_status_file_parsing(tmp_path: Path) -> None:
    path = tmp_path / "exit_status"
    assert read_status(str(path)) is None
    path.write_text("")
    assert read_status(str(path)) is None  # created by the shell, not written yet
    path.write_text("3\n")
    status = read_status(str(path))
    assert status is not None and (status.exit_code, status.signal) == (3, 0)
    path.write_text("137\n")
    status = read_status(str(path))
    assert status is not None and (status.exit_code, status.signal) == (137, 9)
    # What the kit's supervisor writes (runc's 128 + N already split), and a pre-kit shim's JSON.
    path.write_text("137 9\n")
    status = read_status(str(path))
    assert status is not None and (status.exit_code, status.signal) == (137, 9)
    path.write_text('{"exit_code": 0, "signal": 15}')
    status = read_status(str(path))
    assert status is not None and (status.exit_code, status.signal) == (0, 15)
    path.write_text("137 ")
    assert read_status(str(path)) is None  # not written to its end yet


def test_exec_denied_ids_default_to_root_and_empty_denies_none() -> None:
    plugin = PluginConfig.from_decoded({})
    assert 0 in plugin.denied_uids and 0 in plugin.denied_gids and 1 not in plugin.denied_uids
    assert 0 in PluginConfig().denied_uids and 0 in PluginConfig().denied_gids
    opened = PluginConfig.from_decoded({"denied_host_uids": "", "denied_host_gids": ""})
    assert not opened.denied_uids.ranges and not opened.denied_gids.ranges


def test_exec_only_cap_add_is_ambient_for_a_user_other_than_root() -> None:
    plugin = PluginConfig.from_decoded({"allow_caps": ["kill", "net_raw", "chown"]})
    cfg = TaskExecConfig.from_decoded({"command": "/bin/true", "cap_add": ["NET_RAW"]}, plugin, task="web")
    nobody = process_capabilities(cfg, NOBODY)
    assert nobody["ambient"] == nobody["inheritable"] == ["CAP_NET_RAW"]
    assert "CAP_KILL" in nobody["bounding"] and "CAP_KILL" not in nobody["ambient"]
    # Root keeps its set across exec without ambient ones; no cap_add, no ambient set at all.
    assert "ambient" not in process_capabilities(cfg, ROOT)
    plain = TaskExecConfig.from_decoded({"command": "/bin/true"}, plugin, task="web")
    assert "ambient" not in process_capabilities(plain, NOBODY)
