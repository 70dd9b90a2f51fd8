"""raw_exec config, id ranges, env filtering and cgroup paths: no processes needed."""

from __future__ import annotations

import pytest

from drivers.raw_exec.cgroups import RawCgroup
from drivers.raw_exec.config import PluginConfig, TaskRawConfig, glob_match, task_env
from drivers.raw_exec.store import RawState
from driversdk.errors import ConfigError
from driversdk.taskkit.ids import IdRanges
from driversdk.taskkit.owner import ProcessIdentity
from driversdk.taskkit.shared import Spawned


def test_raw_exec_id_ranges_parse_and_contain() -> None:
    ranges = IdRanges.parse("0, 10-20,65534", "denied_host_uids")
    assert [0 in ranges, 5 in ranges, 10 in ranges, 20 in ranges, 21 in ranges, 65534 in ranges] == [
        True, False, True, True, False, True,
    ]  # fmt: skip
    assert IdRanges.parse("", "x").ranges == () and 0 not in IdRanges.parse(None, "x")
    for bad, why in [("a", "is not an id or a range"), ("5-1", "lower bound is greater"), ("1-", "not an id")]:
        with pytest.raises(ConfigError, match=why):
            IdRanges.parse(bad, "denied_host_gids")


def test_raw_exec_plugin_config_defaults_to_disabled() -> None:
    cfg = PluginConfig.from_decoded({})
    assert cfg.enabled is False and cfg.denied_envvars == () and not cfg.denied_uids.ranges
    with pytest.raises(ConfigError, match="must be an absolute path"):
        PluginConfig.from_decoded({"state_dir": "relative"})


def test_raw_exec_task_config_validation() -> None:
    cfg = TaskRawConfig.from_decoded({"command": "x", "oom_score_adj": 10.0}, task="t")
    assert cfg.oom_score_adj == 10 and cfg.work_dir == ""
    for bad, why in [
        ({"command": "x", "oom_score_adj": -1}, "must not be negative"),
        ({"command": "x", "oom_score_adj": 1001}, "above the kernel's maximum"),
        ({"command": "x", "oom_score_adj": 1.5}, "whole number"),
        ({"command": "x", "work_dir": "rel"}, "must be an absolute path"),
        ({"command": "x", "cgroup_v1_override": {"pids": "a"}, "cgroup_v2_override": "b"}, "only one of"),
        ({"command": "x", "cgroup_v1_override": {"pids": "../escape"}}, 'no ".."'),
        ({"command": " x"}, "non-empty program"),
    ]:
        with pytest.raises(ConfigError, match=why):
            TaskRawConfig.from_decoded(bad, task="t")


def test_raw_exec_denied_envvars_glob_like_nomad() -> None:
    assert glob_match("SECRET_*", "SECRET_TOKEN") and not glob_match("SECRET_*", "SECRETS")
    assert glob_match("*", "ANY") and glob_match("A*B*C", "AxxBxxC") and not glob_match("A?", "AB")
    assert glob_match("[x]", "[x]")  # only * is special
    env = {"A": "1", "SECRET_X": "2", "TOKEN": "3"}
    assert task_env(env, ("SECRET_*",), ("TOK*",)) == {"A": "1"}


def test_raw_exec_state_round_trip_and_version_gate() -> None:
    state = RawState("dsr-x", "/s/tasks/dsr-x", 1.5, False, "p", {"pids": "c"}, "", supervisor_pid=10, task_pid=11)
    assert RawState.decode(state.encode(), 1) == state
    with pytest.raises(ConfigError, match="unknown state version"):
        RawState.decode(state.encode(), 2)


# A driver_state as the raw_exec plugin wrote it while the shared-supervisor fields were declared
# in RawState itself; tasks started then must still be recovered, and re-saved byte for byte.
SAVED_SHARED_RUN = (
    b'{"cgroup_parent": "nomad", "cgroup_v1_override": {"pids": "/x"}, "cgroup_v2": false, "cgroup_v2_override": "", '
    b'"started_at": 2.5, "state_dir": "/s/tasks/k1", "supervisor_pid": 51, "supervisor_start_time": 8001, '
    b'"task_key": "k1", "task_pid": 52, "task_start_time": 8002, "version": 1}'
)


def test_raw_exec_state_saved_before_shared_run_state_is_recovered_and_saved_unchanged() -> None:
    state = RawState.decode(SAVED_SHARED_RUN, 1)
    assert state.shared_run == Spawned(ProcessIdentity(51, 8001), ProcessIdentity(52, 8002))
    assert (state.task_key, state.state_dir, state.cgroup_v1_override) == ("k1", "/s/tasks/k1", {"pids": "/x"})
    assert state.encode() == SAVED_SHARED_RUN
    own = RawState.decode(SAVED_SHARED_RUN.replace(b'"task_start_time": 8002, ', b""), 1)
    assert own.shared_run is None and own.task_pid == 52


def test_raw_exec_state_without_its_task_pid_is_refused() -> None:
    # Stop signals go to the task_pid's process group: a 0 would reach the plugin's own group.
    with pytest.raises(ConfigError, match="task_pid"):
        RawState.decode(SAVED_SHARED_RUN.replace(b'"task_pid": 52, ', b""), 1)


def test_raw_exec_cgroup_procs_files_follow_the_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    mounts = {"memory": "/cg/memory", "cpu": "/cg/cpu,cpuacct", "cpuacct": "/cg/cpu,cpuacct", "pids": "/cg/pids"}
    monkeypatch.setattr("drivers.raw_exec.cgroups.cgroup_mounts", lambda: mounts)
    plain = RawCgroup("dsr-1", False, "par")
    assert plain.procs_files() == [
        "/cg/memory/par/dsr-1/task/cgroup.procs",
        "/cg/cpu,cpuacct/par/dsr-1/task/cgroup.procs",
    ]
    over = RawCgroup("dsr-1", False, "par", {"memory": "/mine", "pids": "other/x"})
    assert over.procs_files() == [
        "/cg/cpu,cpuacct/par/dsr-1/task/cgroup.procs",
        "/cg/memory/mine/cgroup.procs",
        "/cg/pids/other/x/cgroup.procs",
    ]
    monkeypatch.setattr("drivers.raw_exec.cgroups.cgroup_mounts", lambda: {"": "/cg2"})
    assert RawCgroup("dsr-1", True, "par").procs_files() == ["/cg2/par/dsr-1/task/cgroup.procs"]
    assert RawCgroup("dsr-1", True, "par", {}, "custom/x").procs_files() == ["/cg2/custom/x/cgroup.procs"]
