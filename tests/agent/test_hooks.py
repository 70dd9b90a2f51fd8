"""Each hook of the alloc runner and the task runner on its own: real directories, a real log
collector process, real mounts where the hook touches the host; no driver plugin is launched."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.agent.allocrunner import allocrunner, taskrunner
from driversdk.agent.allocrunner.allocrunner import AllocRunner, NodeServices
from driversdk.agent.allocrunner.hooks import AllocHook, TaskHook
from driversdk.agent.allocrunner.hooks.alloc_dir import AllocDirHook
from driversdk.agent.allocrunner.hooks.contract import (
    AllocPostrunRequest,
    AllocPostrunResponse,
    TaskPostrunRequest,
    TaskPrerunRequest,
    TaskPrerunResponse,
    TaskStopRequest,
)
from driversdk.agent.allocrunner.hooks.csi_plugin import CSIPluginDirHook, CSIPluginSupervisorHook
from driversdk.agent.allocrunner.hooks.csi_volumes import CSIVolumesHook
from driversdk.agent.allocrunner.hooks.logs import LogCollectionHook
from driversdk.agent.allocrunner.hooks.network import NetworkHook, NetworkRefused
from driversdk.agent.allocrunner.hooks.task_dir import TaskDirHook
from driversdk.agent.allocrunner.hooks.volume_mounts import VolumeMountsHook
from driversdk.agent.allocrunner.taskrunner import TaskRunner
from driversdk.agent.events import RunEvent
from driversdk.agent.pluginmanager.drivermanager import DriverManager
from driversdk.errors import DriverSDKError
from driversdk.jobspec.clientconfig import ClientConfig, HostVolume
from driversdk.jobspec.job import CSIPluginConfig, Group, Job, Task, VolumeMount, VolumeRequest
from driversdk.model import Capabilities, FSIsolation, MountConfigSupport
from driversdk.mountinfo import read_mountinfo


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Path, list[RunEvent]]]:
    yield tmp_path, []


def _alloc(tmp_path: Path, events: list[RunEvent], group: Group, client: ClientConfig | None = None) -> AllocRunner:
    client = client or ClientConfig(data_dir=str(tmp_path / "data"))
    node = NodeServices.open(client.data_dir)
    drivers = node.drivers = DriverManager(client, node.state, events.append)
    job = Job(str(tmp_path / "job.hcl"), "j", groups=[group])
    return AllocRunner(job, group, 0, client, events.append, node, drivers)


def test_the_hook_lists_are_the_order_of_start(tmp_path: Path) -> None:
    assert [h().name for h in allocrunner.ALLOC_HOOKS] == [
        "alloc dir",
        "csi plugin dir",
        "ports",
        "group network",
        "port forward",
        "csi volumes",
    ]
    assert [h().name for h in taskrunner.TASK_HOOKS] == [
        "task dir",
        "log collection",
        "csi plugin supervisor",
        "volume mounts",
        "artifact",
        "template",
    ]


def test_task_teardown_runs_the_hooks_that_ran_in_reverse(world: tuple[Path, list[RunEvent]]) -> None:
    tmp_path, events = world
    calls: list[str] = []

    class Recording(TaskHook):
        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail

        def prerun(self, req: TaskPrerunRequest) -> TaskPrerunResponse:
            calls.append(f"prerun {self.name}")
            if self.fail:
                raise DriverSDKError(f"{self.name} failed")
            return TaskPrerunResponse()

        def postrun(self, req: TaskPostrunRequest) -> None:
            calls.append(f"postrun {self.name}")

    alloc = _alloc(tmp_path, events, Group("g", tasks=[Task(name="t", driver="exec")]))
    try:
        runner = TaskRunner(alloc, alloc.group.tasks[0])
        runner.hooks = [Recording("a"), Recording("b"), Recording("c", fail=True), Recording("d")]
        with pytest.raises(DriverSDKError, match="c failed"):
            runner._start(None)
        assert calls == ["prerun a", "prerun b", "prerun c", "postrun c", "postrun b", "postrun a"]
    finally:
        alloc.node.close()


def test_alloc_dir_hook_lays_out_the_shared_dir(world: tuple[Path, list[RunEvent]]) -> None:
    tmp_path, events = world
    alloc = _alloc(tmp_path, events, Group("g"))
    try:
        AllocDirHook().prerun(alloc.prerun_request())
        assert sorted(p.name for p in (Path(alloc.alloc_dir) / "alloc").iterdir()) == ["data", "logs", "tmp"]
        AllocDirHook().prerun(alloc.prerun_request())  # a recovered allocation goes through it again
    finally:
        alloc.node.close()


def test_network_hook_host_mode_needs_no_driver_and_other_modes_are_refused(
    world: tuple[Path, list[RunEvent]],
) -> None:
    tmp_path, events = world
    alloc = _alloc(tmp_path, events, Group("g", network_mode="host"))
    try:
        assert NetworkHook().prerun(alloc.prerun_request()).network is None and alloc.drivers.running() == {}
        alloc.group.network_mode = "none"
        with pytest.raises(NetworkRefused, match="network mode 'none' is not run by driversdk run"):
            NetworkHook().prerun(alloc.prerun_request())
        NetworkHook().postrun(alloc.postrun_request())  # nothing was made: nothing to remove
    finally:
        alloc.node.close()


def test_csi_volumes_hook_does_nothing_for_a_group_without_csi_volumes(world: tuple[Path, list[RunEvent]]) -> None:
    tmp_path, events = world
    alloc = _alloc(tmp_path, events, Group("g"))
    try:
        hook = CSIVolumesHook()
        assert hook.prerun(alloc.prerun_request()).csi_sources is None
        assert hook.postrun(alloc.postrun_request()) == AllocPostrunResponse(teardown_failed=False)
        assert hook.csi is None
    finally:
        alloc.node.close()


def test_task_dir_hook_makes_dirs_a_private_secrets_dir_and_the_environment(
    world: tuple[Path, list[RunEvent]],
) -> None:
    tmp_path, events = world
    alloc = _alloc(tmp_path, events, Group("g", tasks=[Task(name="t", driver="exec", user="1234:2345")]))
    try:
        runner = TaskRunner(alloc, alloc.group.tasks[0])
        env = TaskDirHook().prerun(runner.prerun_request()).env
        task_dir = Path(alloc.alloc_dir) / "t"
        assert sorted(p.name for p in task_dir.iterdir()) == ["local", "private", "secrets", "tmp"]
        st = (task_dir / "secrets").stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and (st.st_uid, st.st_gid) == (1234, 2345)
        assert env["NOMAD_TASK_NAME"] == "t" and env["NOMAD_ALLOC_ID"] == alloc.alloc_id
    finally:
        alloc.node.close()


def test_log_collection_hook_runs_a_collector_and_stops_it_at_postrun(world: tuple[Path, list[RunEvent]]) -> None:
    tmp_path, events = world
    alloc = _alloc(tmp_path, events, Group("g", tasks=[Task(name="t", driver="exec")]))
    try:
        AllocDirHook().prerun(alloc.prerun_request())
        runner = TaskRunner(alloc, alloc.group.tasks[0])
        hook = LogCollectionHook()
        logmon = hook.prerun(runner.prerun_request()).logmon
        assert logmon is not None
        pid = logmon.pid
        with open(logmon.stdout_fifo, "w") as fifo:  # what a driver does with the task's stdout
            fifo.write("hello from the task\n")
        hook.postrun(TaskPostrunRequest(runner.info, logmon))
        assert (Path(alloc.alloc_dir) / "alloc" / "logs" / "t.stdout.0").read_text() == "hello from the task\n"
        assert not os.path.lexists(logmon.stdout_fifo), "the task's fifos are removed"
        # The data dir's collector, serving nothing now and held by nobody, ends by itself.
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text():
            assert time.monotonic() < deadline, "the idle collector kept running"
            time.sleep(0.02)
    finally:
        alloc.node.close()


def test_log_collection_hook_is_skipped_when_the_driver_collects_nothing(world: tuple[Path, list[RunEvent]]) -> None:
    tmp_path, events = world
    alloc = _alloc(tmp_path, events, Group("g", tasks=[Task(name="t", driver="exec")]))
    try:
        runner = TaskRunner(alloc, alloc.group.tasks[0])
        runner.caps = Capabilities(disable_log_collection=True)
        assert LogCollectionHook().prerun(runner.prerun_request()).logmon is None
    finally:
        alloc.node.close()


def test_volume_mounts_hook_turns_host_volumes_into_mounts_and_refuses_drivers_without_mounts(
    world: tuple[Path, list[RunEvent]],
) -> None:
    tmp_path, events = world
    shared = tmp_path / "shared"
    shared.mkdir()
    task = Task(name="t", driver="exec", volume_mounts=[VolumeMount(volume="v", destination="/data")])
    group = Group("g", volumes={"v": VolumeRequest(name="v", type="host", source="shared", read_only=True)},
                  tasks=[task])  # fmt: skip
    client = ClientConfig(data_dir=str(tmp_path / "data"), host_volumes={"shared": HostVolume("shared", str(shared))})
    alloc = _alloc(tmp_path, events, group, client)
    try:
        runner = TaskRunner(alloc, task)
        runner.caps = Capabilities(mount_configs=MountConfigSupport.ALL)
        [mount] = VolumeMountsHook().prerun(runner.prerun_request()).mounts or ()
        assert (mount.host_path, mount.task_path, mount.readonly) == (str(shared), "/data", True)
        runner.caps = Capabilities(mount_configs=MountConfigSupport.NONE)
        with pytest.raises(DriverSDKError, match="does not support"):
            VolumeMountsHook().prerun(runner.prerun_request())
    finally:
        alloc.node.close()


def test_csi_plugin_hooks_hand_out_bidirectional_mounts_and_release_the_shared_dir(tmp_path: Path) -> None:
    events: list[RunEvent] = []
    data = Path("/tmp") / f"dsx-hk-{os.getpid()}"  # the socket path must fit 107 bytes
    plugin = CSIPluginConfig(id="hostpath", type="node", mount_dir="/csi")
    task = Task(name="plugin", driver="exec", csi_plugin=plugin)
    alloc = _alloc(tmp_path, events, Group("g", tasks=[task]), ClientConfig(data_dir=str(data)))
    csi = str(data / "client" / "csi")
    try:
        runner = TaskRunner(alloc, task)
        runner.caps = Capabilities(fs_isolation=FSIsolation.IMAGE)  # the endpoint as the task sees it
        hook = CSIPluginSupervisorHook()
        response = hook.prerun(runner.prerun_request())
        assert any(e.mount_point == csi and e.shared for e in read_mountinfo()), "the csi dir is a shared mount"
        assert {m.volume for m in response.mount_requests} == {"csi-plugin-socket", "csi-plugin-mounts"}
        assert {m.propagation for m in response.mount_requests} == {"bidirectional"}
        assert response.env["CSI_ENDPOINT"] == "unix:///csi/csi.sock"
        hook.stop(TaskStopRequest(runner.info))
        hook.postrun(TaskPostrunRequest(runner.info, None))
        CSIPluginDirHook().postrun(alloc.postrun_request())
        assert not any(e.mount_point == csi for e in read_mountinfo()), "the shared bind is released"
        assert not (data / "client" / "csi" / "plugins").exists()
    finally:
        alloc.node.close()
        while any(e.mount_point == csi for e in read_mountinfo()):
            os.system(f"umount {csi}")
            time.sleep(0.1)
        os.system(f"rm -rf {data}")


def test_alloc_teardown_reports_a_failing_hook_and_goes_on(world: tuple[Path, list[RunEvent]]) -> None:
    tmp_path, events = world
    calls: list[str] = []

    class Failing(AllocHook):
        name = "failing"

        def postrun(self, req: AllocPostrunRequest) -> AllocPostrunResponse:
            calls.append("failing")
            raise DriverSDKError("stuck")

    class Last(AllocHook):
        name = "last"

        def postrun(self, req: AllocPostrunRequest) -> AllocPostrunResponse:
            calls.append("last")
            return AllocPostrunResponse()

    alloc = _alloc(tmp_path, events, Group("g"))
    try:
        alloc.state.alloc_started(alloc.alloc_id, "j", "g", 0, alloc.alloc_dir)
        alloc._ran = [Last(), Failing()]
        alloc.close()
        assert calls == ["failing", "last"]
        assert [e.text() for e in events] == [
            f'==> group "g": failing: cleanup failed: stuck [job "j", alloc {alloc.alloc_id[:8]}]'
        ]
    finally:
        alloc.node.close()
