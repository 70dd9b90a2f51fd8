"""The hook contract (Nomad's ``client/allocrunner/interfaces``): each phase of every hook of the
two lists takes its request type and returns its response type, no hook module imports a runner,
real hooks run on requests built by hand (no runner exists) and hand back what they made, and the
runners apply the responses in list order."""

from __future__ import annotations

import ast
import dataclasses
import stat
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driversdk.agent import nodeattrs
from driversdk.agent.allocrunner import allocrunner, taskrunner
from driversdk.agent.allocrunner.allocrunner import AllocRunner, NodeServices
from driversdk.agent.allocrunner.hooks import AllocHook, TaskHook, contract
from driversdk.agent.allocrunner.hooks.contract import (
    AllocInfo,
    AllocPostrunRequest,
    AllocPostrunResponse,
    AllocServices,
    TaskInfo,
    TaskPrerunRequest,
    TaskPrerunResponse,
)
from driversdk.agent.allocrunner.hooks.task_dir import TaskDirHook
from driversdk.agent.allocrunner.hooks.volume_mounts import VolumeMountsHook
from driversdk.agent.allocrunner.taskrunner import TaskRunner
from driversdk.agent.events import RunEvent
from driversdk.agent.pluginmanager.drivermanager import DriverManager
from driversdk.jobspec.clientconfig import ClientConfig, HostVolume
from driversdk.jobspec.job import Group, Job, Task, VolumeMount, VolumeRequest
from driversdk.model import Capabilities, FSIsolation, MountConfigSupport

HOOKS_DIR = Path(allocrunner.__file__).parent / "hooks"
RUNNERS = {"driversdk.agent.allocrunner.allocrunner", "driversdk.agent.allocrunner.taskrunner"}

ALLOC_PHASES: dict[str, tuple[type, type | None]] = {
    "prerun": (contract.AllocPrerunRequest, contract.AllocPrerunResponse),
    "stop": (contract.AllocStopRequest, None),
    "postrun": (contract.AllocPostrunRequest, contract.AllocPostrunResponse),
    "destroy": (contract.AllocDestroyRequest, None),
    "update": (contract.AllocUpdateRequest, None),
}
TASK_PHASES: dict[str, tuple[type, type | None]] = {
    "prerun": (contract.TaskPrerunRequest, contract.TaskPrerunResponse),
    "poststart": (contract.TaskPoststartRequest, contract.TaskPoststartResponse),
    "stop": (contract.TaskStopRequest, None),
    "postrun": (contract.TaskPostrunRequest, None),
    "destroy": (contract.TaskDestroyRequest, None),
    "update": (contract.TaskUpdateRequest, None),
}


def _signature(method: Any) -> tuple[list[Any], Any]:
    hints = typing.get_type_hints(method)
    returns = hints.pop("return")
    return list(hints.values()), (None if returns is type(None) else returns)


@pytest.mark.parametrize(
    ("make", "base", "phases"),
    [(m, AllocHook, ALLOC_PHASES) for m in allocrunner.ALLOC_HOOKS]
    + [(m, TaskHook, TASK_PHASES) for m in taskrunner.TASK_HOOKS],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_every_phase_of_every_hook_takes_its_request_and_returns_its_response(
    make: Any, base: type, phases: dict[str, tuple[type, type | None]]
) -> None:
    hook = make()
    assert isinstance(hook, base)
    for phase, (request, response) in phases.items():
        params, returns = _signature(getattr(type(hook), phase))
        assert params == [request], f"{type(hook).__name__}.{phase} takes {params}, not [{request.__name__}]"
        assert returns is response, f"{type(hook).__name__}.{phase} returns {returns}, not {response}"


def test_the_requests_and_responses_are_frozen_dataclasses() -> None:
    for name in dir(contract):
        value = getattr(contract, name)
        if isinstance(value, type) and name.endswith(("Request", "Response", "Info", "Services")):
            assert dataclasses.is_dataclass(value) and value.__dataclass_params__.frozen, name  # type: ignore[attr-defined]


def _imports(path: Path) -> Iterator[str]:
    """Every module a hook file names in an import, at any depth (TYPE_CHECKING blocks and
    functions too), relative ones resolved, ``from pkg import mod`` as ``pkg.mod``."""
    package = "driversdk.agent.allocrunner.hooks"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def test_no_hook_module_imports_a_runner() -> None:
    files = sorted(HOOKS_DIR.glob("*.py"))
    assert len(files) >= 12
    for path in files:
        found = RUNNERS & set(_imports(path))
        assert not found, f"{path.name} imports {sorted(found)}"


def test_the_checker_sees_a_runner_import_under_type_checking(tmp_path: Path) -> None:
    planted = tmp_path / "x.py"
    planted.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..allocrunner import AllocRunner\n"
        "def f():\n    from driversdk.agent.allocrunner import taskrunner\n"
    )
    assert set(_imports(planted)) >= RUNNERS


def _info(tmp_path: Path, group: Group, client: ClientConfig, node: NodeServices, events: list[str]) -> AllocInfo:
    drivers = DriverManager(client, node.state, lambda e: None)  # launches nothing until a driver is dispensed
    services = AllocServices(
        state=node.state,
        drivers=drivers,
        volumes=node.volumes,
        csi_state=node.csi_state,
        registry=node.registry,
        plugin_failure=lambda plugin: None,
        node=lambda: nodeattrs.node(client),
        emit=lambda e: events.append(e.text()),
        event=lambda kind, message, **_: events.append(message),
    )
    job = Job(str(tmp_path / "job.hcl"), "j", groups=[group])
    return AllocInfo("0123abcd-0000-4000-8000-000000000000", 2, job, group, str(tmp_path / "alloc"), client, services)


def test_task_dir_and_volume_mounts_prerun_on_requests_alone_return_env_and_mounts(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    task = Task(name="t", driver="exec", user="1234:2345",
                volume_mounts=[VolumeMount(volume="v", destination="/data/${NOMAD_ALLOC_INDEX}")])  # fmt: skip
    group = Group("g", volumes={"v": VolumeRequest(name="v", type="host", source="shared", read_only=True)},
                  tasks=[task])  # fmt: skip
    client = ClientConfig(data_dir=str(tmp_path / "data"), host_volumes={"shared": HostVolume("shared", str(shared))})
    node = NodeServices.open(client.data_dir)
    events: list[str] = []
    try:
        alloc = _info(tmp_path, group, client, node, events)
        caps = Capabilities(fs_isolation=FSIsolation.CHROOT, mount_configs=MountConfigSupport.ALL)
        info = TaskInfo(alloc, task, caps, lambda m, *a, **k: None)
        first = TaskPrerunRequest(info, None)
        with pytest.raises(dataclasses.FrozenInstanceError):
            first.env = {}  # type: ignore[misc]
        made = TaskDirHook().prerun(first)
        task_dir = tmp_path / "alloc" / "t"
        assert sorted(p.name for p in task_dir.iterdir()) == ["local", "private", "secrets", "tmp"]
        assert stat.S_IMODE((task_dir / "secrets").stat().st_mode) == 0o700
        assert made.env["NOMAD_TASK_NAME"] == "t" and made.env["NOMAD_ALLOC_ID"] == alloc.alloc_id
        assert made.node_facts is not None and "attr.kernel.name" in made.node_facts
        assert made.mounts is None and made.logmon is None

        # The next hook sees what the first returned (as the runner hands it on), nothing else.
        second = TaskPrerunRequest(info, None, env=made.env, node_facts=made.node_facts)
        mounted = VolumeMountsHook().prerun(second)
        assert mounted.env == {} and mounted.mounts is not None
        [mount] = mounted.mounts
        assert (mount.host_path, mount.task_path, mount.readonly) == (str(shared), "/data/2", True)
        assert events == []
    finally:
        node.close()


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[AllocRunner]:
    client = ClientConfig(data_dir=str(tmp_path / "data"))
    node = NodeServices.open(client.data_dir)
    drivers = node.drivers = DriverManager(client, node.state, lambda e: None)
    group = Group("g", tasks=[Task(name="t", driver="exec")])
    events: list[RunEvent] = []
    runner = AllocRunner(Job(str(tmp_path / "job.hcl"), "j", groups=[group]), group, 0, client, events.append, node,
                         drivers)  # fmt: skip
    try:
        yield runner
    finally:
        node.close()


def test_the_task_runner_applies_prerun_responses_in_list_order(alloc: AllocRunner) -> None:
    seen: list[dict[str, str]] = []

    class Gives(TaskHook):
        def __init__(self, response: TaskPrerunResponse) -> None:
            self.response = response

        def prerun(self, req: TaskPrerunRequest) -> TaskPrerunResponse:
            seen.append(dict(req.env))
            return self.response

    runner = TaskRunner(alloc, alloc.group.tasks[0])
    runner.hooks = [
        Gives(TaskPrerunResponse(env={"A": "1", "B": "1"})),
        Gives(TaskPrerunResponse(env={"B": "2"}, template_env={"T": "x"})),
        Gives(TaskPrerunResponse()),
    ]
    runner._prerun()
    assert seen == [{}, {"A": "1", "B": "1"}, {"A": "1", "B": "2"}]
    assert runner.env == {"A": "1", "B": "2"} and runner.template_env == {"T": "x"}


def test_the_alloc_runner_ends_failed_when_a_postrun_response_says_so(alloc: AllocRunner) -> None:
    class Stuck(AllocHook):
        name = "stuck"

        def postrun(self, req: AllocPostrunRequest) -> AllocPostrunResponse:
            return AllocPostrunResponse(teardown_failed=True)

    alloc.state.alloc_started(alloc.alloc_id, "j", "g", 0, alloc.alloc_dir)
    alloc._ran = [Stuck()]
    alloc.close()
    assert alloc.teardown_failed
