"""Every bundled driver keeps its state under the client's data_dir by default.

exec and raw_exec have a ``state_dir`` plugin option; when the client config does not set it, the
runner hands the plugin ``<data_dir>/driver-state/<driver>`` in its plugin config (SetConfig's
agent config has no field for a directory). docker keeps its per-task state in the task dir. A
run on a fresh data dir, with the real CLI and real plugins, leaves nothing in the plugins' own
defaults (/var/lib/driversdk-exec, /var/lib/driversdk-raw-exec) or in /run/driversdk beyond the
documented host-wide records (ports, docker-pins, bridge). A task started by a plugin that had the
old default is still recovered, stopped and removed by a plugin with the new one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import pytest

from drivers.raw_exec.store import RawState
from driversdk.bundled import bundled_driver
from driversdk.jobspec.clientconfig import load_client
from driversdk.model import NetworkIsolationSpec
from driversdk.testing import AllocDir, DriverHarness
from tests.agent.runs import IMAGE, ROOT
from tests.hostcheck import processes, runc_containers

pytestmark = pytest.mark.root

OLD_DEFAULTS = [Path("/var/lib/driversdk-exec"), Path("/var/lib/driversdk-raw-exec")]
# Host-wide records shared by every data dir on the host (README: what lives outside the data dir).
HOST_WIDE = {"ports", "docker-pins", "bridge"}


def _tree(path: Path) -> set[str]:
    if not path.is_dir():
        return set()
    return {str(p) for p in path.rglob("*")}


def outside_data_dir() -> set[str]:
    """What driver state there is in the places the drivers kept it before."""
    found: set[str] = set()
    for old in OLD_DEFAULTS:
        found |= _tree(old)
    run = Path("/run/driversdk")
    if run.is_dir():
        for entry in run.iterdir():
            if entry.name not in HOST_WIDE:
                found |= {str(entry)} | _tree(entry)
    return found


def _client(tmp_path: Path, cgroup_parent: str, *, old_state: Path | None = None) -> Path:
    """exec and raw_exec enabled with cgroups of the test's own; ``old_state``: state_dirs there, as
    the plugins' own defaults were before the runner named one under the data dir."""
    where = {d: f'\n    state_dir = "{old_state / d}"' if old_state else "" for d in ("exec", "raw_exec")}
    client = tmp_path / ("client-old.hcl" if old_state else "client.hcl")
    client.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        f'plugin "raw_exec" {{\n  config {{\n    enabled = true\n    cgroup_parent = "{cgroup_parent}-r"'
        f"{where['raw_exec']}\n  }}\n}}\n"
        f'plugin "exec" {{\n  config {{\n    cgroup_parent = "{cgroup_parent}-e"{where["exec"]}\n  }}\n}}\n'
    )
    return client


def _job(tmp_path: Path, drivers: tuple[str, ...]) -> Path:
    """One batch group with a ``sleep 300`` task per driver, named by its first letter."""
    specs = {
        "exec": 'command = "/bin/sleep"\n        args = ["300"]',
        "raw_exec": 'command = "/bin/sleep"\n        args = ["300"]',
        "docker": f'image = "{IMAGE}"\n        command = "/bin/sleep"\n        args = ["300"]',
    }
    body = "".join(
        f'    task "{d[0]}" {{\n      driver = "{d}"\n      kill_timeout = "1s"\n      config {{\n        {specs[d]}\n'
        "      }\n    }\n"
        for d in drivers
    )
    job = tmp_path / "job.hcl"
    job.write_text(f'job "state-dirs" {{\n  type = "batch"\n  group "g" {{\n{body}  }}\n}}\n')
    return job


def _start(job: Path, client: Path, tasks: set[str], word: str = "started") -> tuple[subprocess.Popen[str], list[str]]:
    """`driversdk run`, read until each of ``tasks`` says ``word``."""
    run = subprocess.Popen(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    assert run.stdout is not None
    lines: list[str] = []
    seen: set[str] = set()
    for line in run.stdout:
        lines.append(line)
        seen |= {n for n in tasks if f'task "{n}" {word}' in line}
        if seen == tasks:
            break
    assert seen == tasks, "".join(lines)
    return run, lines


def _children(parent: int) -> list[int]:
    """The plugin processes ``parent`` launched (the bundled drivers run as ``python -I -c``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"-I" in cmdline and b"-c" in cmdline:
            found.append(int(pid))
    return found


def _interrupt(run: subprocess.Popen[str], lines: list[str]) -> str:
    run.send_signal(signal.SIGINT)
    rest, _ = run.communicate(timeout=120)
    lines.append(rest)
    assert run.returncode == 1, "".join(lines)  # interrupted: the tasks were stopped
    return "".join(lines)


def test_the_client_config_hands_bundled_drivers_a_state_dir_under_the_data_dir(tmp_path: Path) -> None:
    client = tmp_path / "client.hcl"
    client.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        'plugin "raw_exec" {\n  config {\n    enabled = true\n  }\n}\n'
        'plugin "exec" {\n  config {\n    state_dir = "/srv/exec-state"\n  }\n}\n'
        'plugin "docker" {\n  config {\n    allow_privileged = false\n  }\n}\n'
    )
    loaded = load_client(str(client))
    assert loaded.plugin_config("raw_exec") == {
        "enabled": True,
        "state_dir": str(tmp_path / "data/driver-state/raw_exec"),
    }
    assert loaded.plugin_config("exec") == {"state_dir": "/srv/exec-state"}  # the operator's stays
    assert "state_dir" not in loaded.plugin_config("docker")  # it has no such option
    # A plugin of the operator's own under a bundled name gets the config as written.
    other = tmp_path / "other.hcl"
    other.write_text(f'data_dir = "{tmp_path / "data"}"\nplugin "exec" {{\n  command = ["/bin/true"]\n}}\n')
    assert load_client(str(other)).plugin_config("exec") == {}


def test_a_run_on_a_fresh_data_dir_keeps_every_drivers_state_inside_it(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    client = _client(tmp_path, f"dsx-statedirs-{os.getpid()}")
    job = _job(tmp_path, ("exec", "raw_exec", "docker"))
    before = outside_data_dir()
    run, lines = _start(job, client, {"e", "r", "d"})
    try:
        # While the tasks run, their state is in the data dir and nowhere else.
        state = tmp_path / "data" / "driver-state"
        assert [p.name for p in (state / "exec" / "tasks").iterdir() if p.is_dir()], "exec keeps no state there"
        assert [p.name for p in (state / "raw_exec" / "tasks").iterdir() if p.is_dir()], "raw_exec keeps none"
        assert outside_data_dir() - before == set(), "driver state outside the data dir"
        _interrupt(run, lines)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert outside_data_dir() - before == set()
    assert runc_containers(str(tmp_path)) == [], "runc state left"
    for driver in ("exec", "raw_exec"):
        assert list((tmp_path / "data" / "driver-state" / driver / "tasks").iterdir()) == []
    assert processes(str(tmp_path)) == []


def test_tasks_a_killed_run_started_with_the_old_state_dirs_are_recovered_by_a_run_with_the_new(
    tmp_path: Path,
) -> None:
    """The upgrade: a run whose plugins kept state in their own defaults is killed; the next run
    (plugins given state_dir under the data dir) recovers the tasks from their handles, which name
    their dirs, and removes those dirs when it stops them."""
    old = tmp_path / "old"  # stands for /var/lib/driversdk-exec and /var/lib/driversdk-raw-exec
    parent = f"dsx-statedirs-up-{os.getpid()}"
    job = _job(tmp_path, ("exec", "raw_exec"))
    run, lines = _start(job, _client(tmp_path, parent, old_state=old), {"e", "r"})
    plugins = _children(run.pid)  # its plugins: only these are stopped below, nobody else's
    assert len(plugins) == 2, plugins
    run.kill()  # as the host's OOM killer or a reboot of the service would
    run.wait()
    for driver in ("exec", "raw_exec"):
        assert [p for p in (old / driver / "tasks").iterdir() if p.is_dir()], f"{driver} kept no state in the old dir"
    # Plugins of the killed run that outlive it would be reattached with their old config: stop them,
    # as an upgrade does, so the new run launches plugins with the new default.
    for pid in plugins:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    again, lines = _start(job, _client(tmp_path, parent), {"e", "r"}, word="recovered")
    try:
        output = "".join(lines)
        assert "reattached" not in output, output
        _interrupt(again, lines)
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()
    for driver in ("exec", "raw_exec"):
        assert list((old / driver / "tasks").iterdir()) == [], f"{driver}'s old-dir task was not removed"
    assert processes(str(tmp_path)) == []


def test_a_task_started_with_the_old_default_state_dir_is_recovered_after_the_change(tmp_path: Path) -> None:
    """A plugin configured before the change kept the task in its own default; the plugin the runner
    now configures (state_dir under the data dir) recovers it from its handle, which names the task's
    dir, and removes that dir when the task is destroyed."""
    old = tmp_path / "old-default"  # stands for /var/lib/driversdk-raw-exec, the plugin's own default
    parent = f"dsx-statedirs-old-{os.getpid()}"
    bundled = bundled_driver("raw_exec")
    assert bundled is not None
    alloc = AllocDir.create(tmp_path / "allocs", tasks=("t",))
    harness = DriverHarness(
        bundled.command(), plugin_config={"enabled": True, "state_dir": str(old), "cgroup_parent": parent}
    )
    try:
        task = alloc.task_config(
            "t",
            driver_config={
                "command": "/bin/sh",
                "args": ["-c", "echo ready; while [ ! -e local/go ]; do sleep 0.05; done; exit 7"],
            },
        )
        handle = harness.start(task)
        alloc.wait_for_output("t", b"ready\n", timeout=60)
        state = RawState.decode(handle.driver_state, handle.version)
        assert state.state_dir.startswith(str(old) + "/")
        harness.plugin_config = load_client(str(_client(tmp_path, parent))).plugin_config("raw_exec")
        assert harness.plugin_config["state_dir"] == str(tmp_path / "data/driver-state/raw_exec")
        client = harness.restart_plugin()
        client.recover_task(handle)
        (alloc.path / "t" / "local" / "go").touch()
        assert client.wait_task(task.id, timeout=60).exit_code == 7
        client.destroy_task(task.id, force=True)
        harness.forget(task.id)
        assert not os.path.lexists(state.state_dir), "the old-default task dir was not removed"
        assert list((old / "tasks").iterdir()) == []
    finally:
        harness.close()
        alloc.remove()


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def test_exec_group_networks_made_with_the_old_default_count_after_the_change(tmp_path: Path) -> None:
    """A group network an exec plugin made with its own default state dir (/var/lib/driversdk-exec)
    holds its address and the bridge after the change: a plugin with the state dir under the data
    dir gives the next allocation another address, keeps the bridge while the old network uses it,
    and destroys the old network (its record included)."""
    bridge = f"dsxs{uuid.uuid4().hex[:8]}"
    net = {"bridge_name": bridge, "bridge_subnet": "10.231.91.0/29"}
    bundled = bundled_driver("exec")
    assert bundled is not None
    old_alloc, new_alloc = str(uuid.uuid4()), str(uuid.uuid4())
    old = DriverHarness(bundled.command(), plugin_config=net)  # no state_dir: the plugin's own default
    new: DriverHarness | None = None
    try:
        old_spec, _ = old.client.create_network(old_alloc, "old")
        record = Path("/var/lib/driversdk-exec/networks") / f"{old_alloc}.json"
        assert record.exists()
        old.close()
        config = load_client(str(_client(tmp_path, "dsx-statedirs-net"))).plugin_config("exec")
        new = DriverHarness(bundled.command(), plugin_config={**config, **net})
        new_spec, _ = new.client.create_network(new_alloc, "new")
        assert new_spec.labels["address"] != old_spec.labels["address"], "two allocations were given one address"
        new.client.destroy_network(new_alloc, new_spec)
        assert _link_exists(bridge), "the bridge went while the old allocation's network still uses it"
        new.client.destroy_network(old_alloc, old_spec)
        assert not record.exists() and not _link_exists(bridge)
    finally:
        if new is not None:
            for alloc, spec in ((new_alloc, None), (old_alloc, old_spec if "old_spec" in locals() else None)):
                with contextlib.suppress(Exception):
                    new.client.destroy_network(alloc, spec or NetworkIsolationSpec())
            new.close()
        old.close()
        with contextlib.suppress(FileNotFoundError):
            (Path("/var/lib/driversdk-exec/networks") / f"{old_alloc}.json").unlink()
