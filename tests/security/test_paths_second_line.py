"""The second line of defence: where the runner builds a path from a name, a hostile name that got
past validate (a job object built by other code, a state.db edited by hand, a CSI volume id) is
refused at that point, and nothing is created outside the root."""

from __future__ import annotations

from pathlib import Path

import pytest

from driversdk.agent.allocrunner.allocrunner import AllocRunner, NodeServices
from driversdk.agent.allocrunner.hooks.task_dir import TaskDirHook
from driversdk.agent.allocrunner.taskrunner import TaskRunner
from driversdk.agent.csi.manager import NodeVolumeManager, UsageOptions
from driversdk.agent.csi.pluginsupervisor import PluginSupervisor
from driversdk.agent.csi.registry import PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.agent.pluginmanager.drivermanager import DriverManager
from driversdk.csi.model import AccessMode, AttachmentMode, Volume
from driversdk.jobspec.clientconfig import ClientConfig
from driversdk.jobspec.job import CSIPluginConfig, Group, Job, Task
from driversdk.paths import UnsafePathError


def _node(data: Path) -> NodeServices:
    return NodeServices.open(str(data))


@pytest.mark.parametrize("name", ["../../../victim", "..", "a/../../b"])
def test_a_task_name_that_escapes_the_alloc_dir_is_refused_where_the_task_dir_is_built(
    tmp_path: Path, name: str
) -> None:
    data = tmp_path / "data"
    task = Task(name=name, driver="docker")
    job = Job(str(tmp_path / "job.hcl"), "j", groups=[Group("g", tasks=[task])])
    node = _node(data)
    try:
        client = ClientConfig(data_dir=str(data))
        alloc = AllocRunner(job, job.groups[0], 0, client, print, node, DriverManager(client, node.state, print))
        with pytest.raises(UnsafePathError, match="outside"):
            TaskDirHook().prerun(TaskRunner(alloc, task).prerun_request())  # the hook that builds the task dir
    finally:
        node.close()
    assert not (tmp_path / "victim").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_a_csi_plugin_id_that_escapes_the_csi_dir_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = StateStore(str(data / "state.db"))
    try:
        task = Task(name="plugin", driver="exec", csi_plugin=CSIPluginConfig(id="../../../../etc", type="node"))
        with pytest.raises(UnsafePathError, match=r"csi_plugin\.id"):
            PluginSupervisor(
                task=task, alloc_id="a" * 36, data_dir=str(data), registry=PluginRegistry(store), say=print
            )
    finally:
        store.close()


def test_a_csi_volume_id_that_escapes_the_plugin_tree_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "csi" / "node" / "hostpath"
    root.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    # The plugin's tree is writable by the plugin: a symlink it planted must not be followed either.
    (root / "staging").mkdir()
    (root / "staging" / "default").symlink_to(tmp_path / "outside")
    store = StateStore(str(tmp_path / "state.db"))
    try:
        manager = NodeVolumeManager(
            None,  # type: ignore[arg-type]  # paths only: no RPC is made
            plugin_id="hostpath",
            host_root=str(root),
            store=store,
            requires_staging=True,
        )
        usage = UsageOptions(AccessMode.SINGLE_NODE_WRITER, AttachmentMode.FILE_SYSTEM)
        with pytest.raises(UnsafePathError, match="outside"):
            manager.publish_paths(Volume(id="../../../../x", plugin_id="hostpath"), "alloc", usage)
        with pytest.raises(UnsafePathError, match="outside"):
            manager.staging_paths(Volume(id="vol", plugin_id="hostpath"), usage)
        host, inside = manager.publish_paths(Volume(id="vol", plugin_id="hostpath"), "alloc", usage)
        assert host.startswith(str(root.resolve()) + "/per-alloc/alloc/vol/")
        assert inside.startswith(str(root) + "/per-alloc/alloc/vol/")
    finally:
        store.close()
