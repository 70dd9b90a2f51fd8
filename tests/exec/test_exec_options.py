"""exec plugin options from Nomad's exec driver: no_pivot_root, denied_host_uids/gids; and a task
user who can write its own task dirs. Real runc, real tasks."""

from __future__ import annotations

import json
import pwd
from pathlib import Path
from typing import Any

import pytest

from drivers.exec.config import PluginConfig
from drivers.exec.store import DriverState
from driversdk.errors import ConfigError, PluginCallError
from driversdk.testing import AllocDir, DriverHarness
from tests.exec.conftest import PLUGIN, Tracker, sh

TIMEOUT = 60


def test_exec_plugin_options_defaults_and_ranges() -> None:
    cfg = PluginConfig.from_decoded({})
    # Root (uid 0, gid 0) is denied unless the operator says otherwise.
    assert cfg.no_pivot_root is False and cfg.denied_uids.text == "0" and cfg.denied_gids.text == "0"
    cfg = PluginConfig.from_decoded({"no_pivot_root": True, "denied_host_uids": "0,100-200", "denied_host_gids": "5"})
    assert cfg.no_pivot_root and 150 in cfg.denied_uids and 5 in cfg.denied_gids and 6 not in cfg.denied_gids
    with pytest.raises(ConfigError, match="denied_host_gids 'x'"):
        PluginConfig.from_decoded({"denied_host_gids": "x"})


def _runc_argv(handle: Any) -> list[str]:
    """The argv the supervisor ran runc with (its launch spec)."""
    state = DriverState.decode(handle.driver_state, handle.version)
    argv: list[str] = json.loads(Path(state.spec_file).read_text())["argv"]
    return argv


@pytest.mark.root
@pytest.mark.parametrize("no_pivot", [False, True])
def test_exec_no_pivot_root_runs_the_task_without_pivot_root(
    plugin_config: dict[str, Any], alloc: AllocDir, no_leaks: None, no_pivot: bool
) -> None:
    script = "echo ready; touch /usr/probe 2>/dev/null && echo usr-writable; test -x /bin/busybox && echo ok; sleep 60"
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, "no_pivot_root": no_pivot}) as h:
        task = alloc.task_config("web", driver_config=sh(script))
        handle = h.start(task)
        out = alloc.wait_for_output("web", b"ok\n", timeout=TIMEOUT)
        # The same read-only chroot either way; only how runc enters it differs.
        assert out == b"ready\nok\n"
        argv = _runc_argv(handle)
        run = argv[argv.index("run") :]
        assert run[:2] == ["run", "--detach"] and ("--no-pivot" in run) == no_pivot
        # runc refuses a private root without pivot_root: the root is a slave then.
        state = DriverState.decode(handle.driver_state, handle.version)
        spec = json.loads(Path(state.task_dir, "config.json").read_text())
        assert spec["linux"]["rootfsPropagation"] == ("rslave" if no_pivot else "rprivate")
        h.client.stop_task(task.id, timeout=1, signal="SIGKILL")
        h.client.wait_task(task.id, timeout=TIMEOUT)


def _refused(h: DriverHarness, alloc: AllocDir, track: Tracker, **kwargs: Any) -> PluginCallError:
    task = alloc.task_config("web", **kwargs)
    with pytest.raises(PluginCallError) as err:
        h.start(task)
    h.forget(task.id)
    assert not track.leftovers()
    return err.value


@pytest.mark.root
@pytest.mark.parametrize(
    ("config", "user", "sentence"),
    [
        ({"denied_host_uids": "1000-65534"}, "nobody", "running as user 'nobody' (uid 65534) is not allowed"),
        (
            {"denied_host_gids": "65534"},
            "nobody",
            "its group 'nogroup' (gid 65534) is in the plugin's denied_host_gids",
        ),
        # No user: exec runs the task as nobody, which the operator may deny too.
        ({"denied_host_uids": "65534"}, "", "running as user 'nobody' (uid 65534) is not allowed"),
    ],
)
def test_exec_refuses_a_denied_host_user(
    plugin_config: dict[str, Any], alloc: AllocDir, track: Tracker, no_leaks: None,
    config: dict[str, str], user: str, sentence: str,
) -> None:  # fmt: skip
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, **config}) as h:
        err = _refused(h, alloc, track, driver_config=sh("true"), user=user)
    assert sentence in err.message and err.code == "INVALID_ARGUMENT"
    # An allowed user still runs.
    with DriverHarness(PLUGIN, plugin_config={**plugin_config, "denied_host_uids": "1-100"}) as h:
        task = alloc.task_config("web", driver_config=sh("true"), user="nobody")
        h.start(task)
        assert h.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0


@pytest.mark.root
def test_exec_task_user_can_write_its_own_task_dirs(harness: DriverHarness, alloc: AllocDir) -> None:
    script = (
        "echo a > /local/a && echo b > /secrets/b && echo c > /tmp/c && echo d > /alloc/data/d && id -u && echo end"
    )
    task = alloc.task_config("web", driver_config=sh(script), user="nobody")
    harness.start(task)
    result = harness.client.wait_task(task.id, timeout=TIMEOUT)
    nobody = pwd.getpwnam("nobody")
    out = alloc.wait_for_output("web", b"end\n", timeout=10)
    assert result.exit_code == 0, out + alloc.stderr("web")
    assert out == f"{nobody.pw_uid}\nend\n".encode()
    for rel in ("web/local/a", "web/secrets/b", "web/tmp/c", "alloc/data/d"):
        assert (alloc.path / rel).stat().st_uid == nobody.pw_uid, rel
    # The shared dir is writable by every task of the group, sticky like /tmp.
    assert (alloc.path / "alloc/data").stat().st_mode & 0o7777 == 0o1777


@pytest.mark.root
@pytest.mark.parametrize(
    ("user", "expected"),
    [
        # Root keeps the whole set: CAP_KILL is bit 5, CAP_SETGID 6, CAP_SETUID 7, CAP_NET_RAW 13
        # (CAP_CHOWN, bit 0, dropped).
        ("root", (1 << 5) | (1 << 6) | (1 << 7) | (1 << 13)),
        # Any other user only what cap_add asked for, as ambient capabilities.
        ("nobody", 1 << 13),
    ],
)
def test_exec_cap_add_cap_drop_and_ipc_mode_reach_the_task(
    plugin_config: dict[str, Any], alloc: AllocDir, no_leaks: None, user: str, expected: int
) -> None:
    import os

    script = "grep CapEff /proc/self/status; readlink /proc/self/ns/ipc; echo end"
    config = {
        **plugin_config,
        "allow_caps": ["chown", "kill", "net_raw", "setuid", "setgid"],
        "denied_host_uids": "",
        "denied_host_gids": "",
    }
    with DriverHarness(PLUGIN, plugin_config=config) as h:
        task = alloc.task_config(
            "web", driver_config=sh(script, cap_add=["net_raw"], cap_drop=["chown"], ipc_mode="host"), user=user
        )
        h.start(task)
        assert h.client.wait_task(task.id, timeout=TIMEOUT).exit_code == 0
        out = alloc.wait_for_output("web", b"end\n", timeout=10).decode().split()
    effective = int(out[1], 16)
    assert effective == expected, hex(effective)
    assert out[2] == os.readlink("/proc/self/ns/ipc")
