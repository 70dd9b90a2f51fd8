"""Issue 29, deliverable 1: a node plugin that loses its records when it is killed and started
again must not leave a claim that never ends, a mount nobody removes, or a second run that cannot
stage. Real runs through the CLI; the reference plugin as a real process (an exec task with
csi_plugin) told to behave like the third-party plugins that keep their node records in memory
(``CSI_HOSTPATH_FORGET_NODE_STATE``: at start it forgets every staging and publish record, then
answers NodeUnpublish/NodeUnstage of a path it does not know with OK and leaves the mount, and
refuses NodePublish without its own stage record); real mounts checked in /proc/self/mountinfo;
the plugin's call log (``CSI_HOSTPATH_CALL_LOG``) tells the order of the RPCs across restarts."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import docker
import pytest

from driversdk.mountinfo import read_mountinfo
from tests.agent.csienv import Env, app_group, make_env, plugin_group, wait_for_line, write_job
from tests.hostcheck import processes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="CSI runs mount and run runc: root only")

CALL_LOG = "calls.log"  # in the plugin's root, the host dir <work>/backing


@pytest.fixture
def env(engine: docker.DockerClient, short_dir: Path) -> Env:
    return make_env(engine, short_dir)


def forgetful_plugin_group(faults: str = "") -> str:
    group = plugin_group(
        env=f'CSI_HOSTPATH_FORGET_NODE_STATE = "1"\n        CSI_HOSTPATH_CALL_LOG = "/srv/csi/{CALL_LOG}"'
        + (f'\n        CSI_HOSTPATH_FAULTS = "{faults}"' if faults else "")
    )
    # A killed plugin is not restarted by its run: the operator starts it again, as in the issue.
    return group.replace('    task "plugin" {', '    restart {\n      attempts = 0\n      mode = "fail"\n    }\n'
                         '    task "plugin" {', 1)  # fmt: skip


def plugin_mounts(env: Env) -> list[str]:
    tree = str(env.data / "client" / "csi")
    return [e.mount_point for e in read_mountinfo() if e.mount_point.startswith(tree + "/")]


def plugin_pid(env: Env, run: subprocess.Popen[str]) -> int:
    """The reference plugin process of ``run``: its task's mounts come from the work dir."""
    found = []
    for line in processes("driversdk.csi.hostpath"):
        pid = int(line.split(":")[0])
        try:
            if str(env.work) in Path(f"/proc/{pid}/mountinfo").read_text():
                found.append(pid)
        except OSError:
            continue
    [pid] = found
    return pid


def calls(env: Env) -> list[str]:
    path = env.work / "backing" / CALL_LOG
    return path.read_text().split() if path.exists() else []


def assert_controller_unpublish_after_node_side(log: list[str]) -> None:
    """Every ControllerUnpublishVolume comes after a NodeUnpublish and a NodeUnstage that
    succeeded (a failed call is logged as ``RPC=CODE``) since the last stage and publish."""
    for i, rpc in enumerate(log):
        if rpc != "ControllerUnpublishVolume":
            continue
        for done, undone in (("NodeStageVolume", "NodeUnstageVolume"), ("NodePublishVolume", "NodeUnpublishVolume")):
            node = [r for r in log[:i] if r in (done, undone)]
            assert node[-1:] in ([], [undone]), f"ControllerUnpublishVolume sent while {done} holds: {log}"


def finish(proc: subprocess.Popen[str], sig: signal.Signals = signal.SIGINT) -> str:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"the run did not end:\n{out}\n{err}") from None
    return out + err


def test_plugin_killed_and_restarted_without_its_records_ends_the_claim_and_mounts_again(env: Env) -> None:
    env.register()
    plugin_job = write_job(env, "plugins", forgetful_plugin_group())
    app_job = write_job(env, "app", app_group("echo started; sleep 300"))
    plugin = env.start(plugin_job)
    runs = [plugin]
    try:
        wait_for_line(plugin, "Plugin became healthy")
        app = env.start(app_job)
        runs.append(app)
        wait_for_line(app, '==> task "app" started')
        assert len(plugin_mounts(env)) >= 2, "staged and published"
        [alloc] = env.claims()

        # The plugin dies hard while the claim is published; its run ends (no restart).
        os.kill(plugin_pid(env, plugin), signal.SIGKILL)
        finish(plugin, signal.SIGINT)
        out = finish(app)
        assert "registered to unmount it" in out, out
        assert env.claims() == [alloc], "nothing could unpublish: the claim waits for the plugin"

        # Started again, the plugin has forgotten what it staged and published. Its run's
        # volume watcher releases the past claim all the same, mounts included.
        before = len(calls(env))
        plugin = env.start(plugin_job)
        runs.append(plugin)
        wait_for_line(plugin, "released the past claim", timeout=90)
        assert env.claims() == []
        assert plugin_mounts(env) == [], "the runner unmounted what the plugin no longer knew"
        after = calls(env)[before:]
        node_done = max(i for i, rpc in enumerate(after) if rpc in ("NodeUnpublishVolume", "NodeUnstageVolume"))
        assert "NodeUnstageVolume" in after and "ControllerUnpublishVolume" in after
        assert after.index("ControllerUnpublishVolume") > node_done, after

        # The app runs again: the volume is staged anew (the staging path is no mount) and published.
        again = write_job(env, "app", app_group("echo again > /data/again"))
        done = env.cli("run", str(again), "--client", str(env.client))
        assert done.returncode == 0, done.stdout + done.stderr
        assert (env.work / "backing" / "volumes" / "vol" / "again").read_text() == "again\n"
        assert env.claims() == []
        assert plugin_mounts(env) == []
        assert_controller_unpublish_after_node_side(calls(env))
    finally:
        for run in runs:
            if run.poll() is None:
                finish(run)
    env.assert_clean()


def test_a_failed_mount_that_keeps_its_stage_is_unstaged_before_controller_unpublish(env: Env) -> None:
    """NodePublish fails and the cleanup's NodeUnstage fails too: the stage is kept (recorded).
    The claim's release must unstage it before it sends ControllerUnpublishVolume."""
    env.register()
    plugin_job = write_job(
        env, "plugins", forgetful_plugin_group("NodePublishVolume=INTERNAL:1,NodeUnstageVolume=INTERNAL:1")
    )
    plugin = env.start(plugin_job)
    try:
        wait_for_line(plugin, "Plugin became healthy")
        app = write_job(env, "app", app_group("true"))
        done = env.cli("run", str(app), "--client", str(env.client))
        assert done.returncode != 0, done.stdout + done.stderr
        assert "injected fault: NodePublishVolume fails with INTERNAL" in done.stdout + done.stderr
        log = calls(env)
        assert "NodeUnstageVolume=INTERNAL" in log and "ControllerUnpublishVolume" in log, log
        assert_controller_unpublish_after_node_side(log)
        assert env.claims() == []
        assert plugin_mounts(env) == []
    finally:
        finish(plugin)
    env.assert_clean()
