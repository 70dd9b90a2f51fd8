"""`driversdk run` with CSI: the reference hostpath plugin as an exec task with csi_plugin, a
registered volume mounted into docker tasks, through the real CLI. Every failure is checked for
its sentence and for what is left behind: mounts, containers, claims, registrations, processes."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import docker
import pytest

from drivers.exec.network import netns_path
from driversdk.agent.csi.registry import PluginRegistration, PluginRegistry
from driversdk.agent.csi.state import StateStore
from driversdk.csi.client import CSIClient
from driversdk.mountinfo import read_mountinfo
from tests.agent.csienv import (
    IMAGE,
    Env,
    app_group,
    make_env,
    plugin_group,
    run_mounting_vol,
    wait_for_line,
    write_job,
)
from tests.agent.runs import NO_RESTARTS

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="CSI runs mount and run runc: root only")


@pytest.fixture
def env(engine: docker.DockerClient, short_dir: Path) -> Env:
    return make_env(engine, short_dir)


def test_demo_job_mounts_a_csi_volume_host_to_task_and_leaves_nothing(env: Env) -> None:
    env.register()
    job = write_job(
        env,
        "demo",
        plugin_group(),
        app_group("grep ' /data ' /proc/self/mountinfo; echo hello > /data/greeting; cat /data/greeting"),
    )
    run_mounting_vol(env, job)
    logs = env.cli("logs", "app", "--client", str(env.client)).stdout
    mount_line, greeting = logs.splitlines()
    fields = mount_line.split(" - ")[0].split()
    assert fields[4] == "/data" and any(f.startswith("master:") for f in fields[6:]), "host-to-task is rslave"
    assert greeting == "hello"
    assert (env.work / "backing" / "volumes" / "vol" / "greeting").read_text() == "hello\n"
    assert env.claims() == []
    env.assert_clean()
    assert not (env.data / "client" / "csi" / "plugins").exists(), "the plugin's socket dir is removed"
    # The volume's staging path outlived its unstage; the plugin's last stop swept its tree.
    assert not (env.data / "client" / "csi" / "monolith" / "hostpath").exists(), "the plugin's mount tree is swept"


def test_driver_without_mount_support_is_refused_before_anything(env: Env) -> None:
    env.register()
    job = write_job(env, "nomount", plugin_group(), app_group("", driver="hello"))
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 2  # refused before anything started
    assert 'task driver "hello" for "app" does not support CSI: volume "data" cannot be mounted' in done.stdout
    assert not (env.data / "allocs").exists()
    assert env.claims() == []
    env.assert_clean()


def test_unregistered_volume_is_refused_before_anything(env: Env) -> None:
    job = write_job(env, "noreg", plugin_group(), app_group("true"))
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 2  # refused before anything started
    # Nothing was ever registered with this data dir: validate says so and creates nothing.
    assert (
        'group "app", volume "data": CSI volume "vol" is not registered in namespace "default" (no volume has been '
        f"registered with data dir {env.data}); register it with `driversdk volume register <file>`" in done.stdout
    )
    assert not (env.data / "allocs").exists()
    env.assert_clean()


def test_plugin_that_is_down_is_found_by_validate_and_run(env: Env) -> None:
    env.register()
    # A registration left by a plugin that died with its run: the socket file is gone.
    store = StateStore(env.db)
    PluginRegistry(store).register(
        PluginRegistration("csi-node", "hostpath", "dead-alloc", str(env.work / "dead" / "csi.sock"))
    )
    store.close()
    job = write_job(env, "down", app_group("true"))
    for command in ("validate", "run"):
        done = env.cli(command, str(job), "--client", str(env.client))
        assert done.returncode == (2 if command == "run" else 1)  # run: refused before anything started
        assert (
            'CSI plugin "hostpath" for volume "vol" is registered but does not answer (failed to open CSI plugin '
            f"socket {env.work / 'dead' / 'csi.sock'}: it does not exist" in done.stdout
        ), done.stdout
        assert "run the plugin's job again or check its task's logs" in done.stdout
    assert env.claims() == []
    assert not (env.data / "allocs").exists()


def test_plugin_error_on_publish_is_a_sentence_and_undoes_the_claim_and_stage(env: Env) -> None:
    env.register()
    job = write_job(
        env, "pubfail", plugin_group(env='CSI_HOSTPATH_FAULTS = "NodePublishVolume=INTERNAL:9"'), app_group("true")
    )
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 2  # the node cannot give the volume: a refusal of the job
    err = done.stderr.strip().splitlines()[-1]
    assert err.startswith('error: group "app" volume "data": mounting volumes: '), err
    assert "NodePublishVolume" in err and "INTERNAL" in err and "Traceback" not in done.stderr
    assert env.claims() == []
    staged = sqlite3.connect(env.db).execute("SELECT COUNT(*) FROM csi_staged").fetchone()
    assert staged == (0,), "the stage made for this alloc alone is undone"
    env.assert_clean()


def test_plugin_that_never_becomes_healthy_fails_after_health_timeout(env: Env) -> None:
    job = write_job(env, "unhealthy", plugin_group(health_timeout="2s", command="sleep 60"))
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 1
    assert '==> task "plugin": Plugin became unhealthy: Error: CSI plugin failed probe: ' in done.stdout
    assert "CSI plugin did not become healthy before configured 2s health timeout" in done.stdout
    env.assert_clean()


def test_claim_limit_reached_across_two_runs_then_both_clean(env: Env) -> None:
    env.register()
    holder = write_job(env, "holder", plugin_group(), app_group("echo holding; sleep 300"))
    other = write_job(env, "other", app_group("true"))
    proc = env.start(holder)
    try:
        wait_for_line(proc, '==> task "app" started')
        status = env.cli("plugin", "status", "--client", str(env.client))
        assert status.returncode == 0, status.stdout
        assert "csi-node        hostpath" in status.stdout and "healthy" in status.stdout
        assert "volumes=1 mounts=1" in status.stdout
        [claimed_by] = env.claims()
        [node] = [r for r in env.registrations() if r.type == "csi-node"]
        calls = CSIClient(node.socket_path).plugin_info().manifest
        assert calls["calls.ControllerPublishVolume"] == "1", "a monolith plugin is controller-published first"
        assert calls["calls.NodeStageVolume"] == "1" and calls["calls.NodePublishVolume"] == "1"
        denied = env.cli("volume", "deregister", "vol", "--client", str(env.client))
        assert denied.returncode == 1
        assert denied.stderr == (
            f'error: volume "vol" is claimed by alloc {claimed_by[:8]} of job holder (in use); stop those jobs before '
            "deregistering it\n"
        )
        done = env.cli("run", str(other), "--client", str(env.client))
        assert done.returncode == 2  # the claim is refused while the allocation is set up
        assert (
            'error: group "app" volume "data": claiming volumes: could not claim volume "vol": volume "vol": volume '
            "max claims reached: single-node-writer allows one writer and it is claimed by alloc "
            f"{claimed_by[:8]} of job holder (write); stop that job, or use per_alloc or an access mode that "
            "allows more claims"
        ) in done.stderr, done.stderr
        assert env.claims() == [claimed_by], "the refused run took nothing and released nothing of the holder's"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    assert env.claims() == []
    env.assert_clean()


def test_run_killed_mid_run_recovers_without_duplicates_then_cleans_up(env: Env) -> None:
    env.register()
    job = write_job(env, "survivor", plugin_group(), app_group("echo first; sleep 300"))
    first = env.start(job)
    wait_for_line(first, '==> task "app" started')
    [container] = env.containers()
    mounts_before = [e.mount_point for e in read_mountinfo() if "per-alloc" in e.mount_point]
    first.kill()
    first.communicate(timeout=30)
    time.sleep(1)
    assert env.containers() == [container], "the task outlives the killed run"
    assert env.engine.containers.get(container).status == "running"

    second = env.start(job)
    try:
        lines = wait_for_line(second, '==> task "app" recovered')
        assert any("recovering alloc" in line for line in lines)
        assert not any('==> task "app" started' in line for line in lines)
        assert env.containers() == [container], "no duplicate container"
        assert [e.mount_point for e in read_mountinfo() if "per-alloc" in e.mount_point] == mounts_before
        again = env.cli("run", str(job), "--client", str(env.client))
        assert again.returncode == 2  # refused before anything started
        assert f'job "survivor" is already being run by driversdk run (pid {second.pid})' in again.stderr
    finally:
        second.send_signal(signal.SIGINT)
        out, _ = second.communicate(timeout=120)
    assert '==> volume "data": CSI volume "vol" unmounted and released' in out
    assert env.cli("logs", "app", "--client", str(env.client)).stdout.startswith("first\n")
    assert env.claims() == []
    env.assert_clean()


def test_data_dir_too_long_for_the_plugin_socket_is_refused_before_anything(env: Env) -> None:
    long_data = env.work / ("d" * 60)
    env.client.write_text(env.client.read_text().replace(f'data_dir = "{env.data}"', f'data_dir = "{long_data}"'))
    job = write_job(env, "longpath", plugin_group())
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 2  # refused before anything started
    assert 'group "storage", task "plugin", csi_plugin: the CSI plugin socket path under data_dir' in done.stdout
    assert "and unix sockets allow 107; use a data_dir at most" in done.stdout
    assert not long_data.exists() or not (long_data / "allocs").exists()


@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_bridge_network_is_shared_by_the_group_and_removed_after(env: Env, driver: str) -> None:
    def task(name: str) -> str:
        if driver == "docker":
            config = (
                f'image = "{IMAGE}"\n        command = "/bin/sh"\n        args = ["-c", "readlink /proc/self/ns/net"]'
            )
        else:
            config = 'command = "/bin/sh"\n        args = ["-c", "readlink /proc/self/ns/net"]'
        return f'    task "{name}" {{\n      driver = "{driver}"\n      config {{\n        {config}\n      }}\n    }}\n'

    group = f'\n  group "net" {{\n    network {{\n      mode = "bridge"\n    }}\n{task("one")}{task("two")}  }}'
    job = write_job(env, f"net-{driver}", group)
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'==> group "net": network created by the {driver} driver' in done.stdout
    one = env.cli("logs", "one", "--client", str(env.client)).stdout.strip()
    two = env.cli("logs", "two", "--client", str(env.client)).stdout.strip()
    assert one.startswith("net:[") and one == two, "both tasks share the group's namespace"
    assert one != os.readlink("/proc/self/ns/net"), "not the host's namespace"
    [alloc] = os.listdir(env.data / "allocs")
    assert not env.engine.containers.list(all=True, filters={"label": f"com.hashicorp.nomad.alloc_id={alloc}"})
    assert not os.path.exists(netns_path(alloc))
    env.assert_clean()


def test_plugin_task_that_exits_ends_the_wait_with_a_sentence(env: Env) -> None:
    env.register()
    job = write_job(
        env, "crash", plugin_group(command="echo no such plugin >&2; exit 3", restart=NO_RESTARTS), app_group("true")
    )
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 1
    assert '==> task "plugin" finished with exit code 3' in done.stdout
    assert (
        "the plugin task exited before the plugin became healthy (last probe: failed to open CSI plugin socket"
        in done.stdout
    )
    assert "see `driversdk logs plugin --stderr`" in done.stdout
    assert (
        'error: group "app" volume "data": mounting volumes: csi-node plugin \'hostpath\' did not become ready: its '
        "task in this job failed: the plugin task exited before the plugin became healthy" in done.stderr
    ), done.stderr
    assert env.cli("logs", "plugin", "--stderr", "--client", str(env.client)).stdout == "no such plugin\n"
    assert env.claims() == []
    env.assert_clean()
