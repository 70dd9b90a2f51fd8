"""Every sentence the volume commands print, checked through the real CLI with the reference
plugin as a real process (an exec task with csi_plugin): the next release step `volume status`
names, what `volume detach` says it could not undo, refusals over past claims, snapshots a
plugin could not be asked for, a snapshot delete of an unknown id, `volume create` growing a
registered volume, a FailedPrecondition of NodePublishVolume, `status` of an allocation that
failed in its CSI hook, and docker's refused `privileged`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import docker
import pytest

from driversdk.csi.client import open_channel
from driversdk.pb import csi_pb2, csi_pb2_grpc
from tests.agent.csienv import (
    IMAGE,
    Env,
    app_group,
    claims_of,
    make_env,
    mounts,
    plugin_group,
    privileged_allowed,
    status,
    stop,
    volume_file,
    wait_for_line,
    write_job,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="CSI runs mount and run runc: root only")

MiB = 1 << 20


@pytest.fixture
def env(engine: docker.DockerClient, short_dir: Path) -> Env:
    return make_env(engine, short_dir)


def plugin_calls(env: Env) -> dict[str, int]:
    """The running plugin's call counts (its GetPluginInfo manifest)."""
    [reg, *_] = [r for r in env.registrations() if r.type == "csi-node"]
    channel = open_channel(reg.socket_path, timeout=10)
    try:
        info = csi_pb2_grpc.IdentityStub(channel).GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=10)
    finally:
        channel.close()
    return {k.removeprefix("calls."): int(v) for k, v in info.manifest.items()}


def test_a_failing_unstage_is_the_step_named_and_detach_lists_only_what_it_did_not_ask(env: Env) -> None:
    env.register()
    plugin = env.start(
        write_job(env, "plugins", plugin_group(env='CSI_HOSTPATH_FAULTS = "NodeUnstageVolume=INTERNAL:1000"'))
    )
    try:
        wait_for_line(plugin, "Plugin became healthy")
        env.cli("run", str(write_job(env, "app", app_group("true"))), "--client", str(env.client))
        [alloc] = env.claims()
        [claim] = claims_of(status(env, "vol"))
        # NodeUnpublishVolume was answered and its target removed: the unstage is what fails.
        assert claim["status"].startswith("past, being released (next: node unstage); last error: "), claim
        assert "NodeUnstageVolume" in claim["last_error"] or "internal error" in claim["last_error"], claim
        assert mounts(env, "per-alloc") == [] and len(mounts(env, "staging")) == 1
        # A claim whose allocation is over: no job to stop, only a release to wait for or force.
        refused = env.cli("volume", "deregister", "vol", "--client", str(env.client))
        assert refused.returncode == 1
        assert refused.stderr == (
            f'error: volume "vol" still has past claims (alloc {alloc[:8]} of job app: their allocations are over) '
            "being released; the volume watcher of a run with its plugin releases them, or `driversdk volume detach "
            "vol` does now; deregistering it works once they are released\n"
        ), refused.stderr
        assert "stop" not in refused.stderr
    finally:
        stop(plugin)
    for path in mounts(env, "staging"):  # the operator does what the plugin no longer can
        subprocess.run(["umount", path], check=True)
    done = env.cli("volume", "detach", "vol", "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip()
    assert line.startswith(f'released the past claim of alloc {alloc[:8]} (job app) on CSI volume "vol"; could not ')
    assert "NodeUnstageVolume of " in line, line
    assert "NodeUnpublishVolume" not in line, "the plugin was asked to unpublish it, and did"
    assert env.claims() == []
    env.assert_clean()


def test_snapshots_a_plugin_cannot_list_are_named_and_expansion_it_cannot_do_is_refused(env: Env) -> None:
    plugin = env.start(
        write_job(env, "plugins", plugin_group(env='CSI_HOSTPATH_WITHOUT = "LIST_SNAPSHOTS,EXPAND_VOLUME"'))
    )
    try:
        wait_for_line(plugin, "Plugin became healthy")
        made = volume_file(env, "made", 'capacity_min = "1MiB"\n')
        assert env.cli("volume", "create", str(made), "--client", str(env.client)).returncode == 0
        done = env.cli("volume", "snapshot", "create", "made", "snap1", "--client", str(env.client))
        assert done.returncode == 0, done.stderr
        listing = env.cli("volume", "snapshot", "list", "--client", str(env.client))
        assert listing.returncode == 0, listing.stderr
        assert listing.stdout == (
            "no snapshots from the plugins that could be asked\n"
            'not asked: CSI plugin "hostpath" (CSI plugin "hostpath" does not support listing snapshots: its '
            "controller does not advertise LIST_SNAPSHOTS); its snapshots, if any, are not listed\n"
        )
        gone = env.cli("volume", "snapshot", "delete", "hostpath", "no-such", "--client", str(env.client))
        assert gone.returncode == 0, gone.stderr
        assert gone.stdout == (
            'deleted snapshot "no-such" of CSI plugin "hostpath" (the plugin cannot list snapshots, so whether it '
            "existed is not known)\n"
        )
        bigger = volume_file(env, "made", 'capacity_min = "2MiB"\n')
        refused = env.cli("volume", "create", str(bigger), "--client", str(env.client))
        assert refused.returncode == 1
        assert refused.stderr == (
            f'error: CSI plugin "hostpath" does not support expanding volumes (volume "made" has {MiB} bytes, '
            f"capacity_min asks for {2 * MiB}): its controller does not advertise EXPAND_VOLUME\n"
        )
        view = status(env, "made")
        assert (view["capacity_bytes"], view["capacity_min"]) == (MiB, MiB), "a refused update records nothing"
        assert env.cli("volume", "delete", "made", "--client", str(env.client)).returncode == 0
        assert env.cli("volume", "snapshot", "delete", "hostpath", "snap1", "--client", str(env.client)).returncode == 0
    finally:
        stop(plugin)
    env.assert_clean()


def test_create_of_a_registered_volume_in_use_expands_it_on_controller_and_node(env: Env) -> None:
    plugin = env.start(write_job(env, "plugins", plugin_group()))
    try:
        wait_for_line(plugin, "Plugin became healthy")
        small = volume_file(env, "vol", 'capacity_min = "1MiB"\n')
        assert env.cli("volume", "create", str(small), "--client", str(env.client)).returncode == 0
        holder = env.start(write_job(env, "holder", app_group("sleep 300")))
        try:
            wait_for_line(holder, '==> task "app" started')
            before = plugin_calls(env)
            bigger = volume_file(env, "vol", 'capacity_min = "4MiB"\n')
            done = env.cli("volume", "create", str(bigger), "--client", str(env.client))
            assert done.returncode == 0, done.stderr
            assert done.stdout == (
                f'updated CSI volume "vol" (it exists already; plugin "hostpath"); expanded from {MiB} to '
                f"{4 * MiB} bytes\n"
            )
            after = plugin_calls(env)
            assert after.get("ControllerExpandVolume", 0) == before.get("ControllerExpandVolume", 0) + 1
            # The reference plugin answers node_expansion_required: the node where it is published grows it.
            assert after.get("NodeExpandVolume", 0) == before.get("NodeExpandVolume", 0) + 1
            view = status(env, "vol")
            assert (view["capacity_bytes"], view["capacity_min"]) == (4 * MiB, 4 * MiB)
            again = env.cli("volume", "create", str(bigger), "--client", str(env.client))
            assert again.stdout == 'updated CSI volume "vol" (it exists already; plugin "hostpath")\n'
            assert plugin_calls(env).get("ControllerExpandVolume", 0) == after.get("ControllerExpandVolume", 0)
        finally:
            stop(holder)
        unknown = env.cli("volume", "snapshot", "delete", "hostpath", "no-such", "--client", str(env.client))
        assert unknown.returncode == 1
        assert unknown.stderr == (
            'error: CSI plugin "hostpath" has no snapshot "no-such", so nothing was deleted; list its snapshots with '
            "`driversdk volume snapshot list -plugin hostpath`\n"
        )
        assert env.cli("volume", "delete", "vol", "--client", str(env.client)).returncode == 0
    finally:
        stop(plugin)
    env.assert_clean()


def test_a_failed_precondition_of_node_publish_leads_with_the_plugins_reason_and_status_lists_the_alloc(
    env: Env,
) -> None:
    env.register()
    job = write_job(
        env,
        "refused",
        plugin_group(env='CSI_HOSTPATH_FAULTS = "NodePublishVolume=FAILED_PRECONDITION:100"'),
        app_group("true"),
    )
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 2, done.stdout + done.stderr  # refused in the allocation's setup
    out = done.stdout + done.stderr
    assert (
        'CSI plugin \'hostpath\' refused to publish volume "vol" at "' in out
        and "(a precondition failed): rpc error: code = FailedPrecondition desc = injected fault: NodePublishVolume "
        "fails with FAILED_PRECONDITION"
        in out
    ), out
    assert "MULTI_NODE" not in out
    shown = env.cli("status", "--client", str(env.client))
    assert shown.returncode == 0, shown.stderr
    [line] = [x for x in shown.stdout.splitlines() if "refused/app" in x]
    assert line.endswith(
        "failed (no task started: a prerun hook (CSI volumes, network) failed; its run printed the reason)"
    ), shown.stdout
    rows = json.loads(env.cli("status", "--json", "--client", str(env.client)).stdout)
    assert [r["state"] for r in rows if r["group"] == "app"] == ["failed"]
    env.assert_clean()


def test_privileged_refused_by_an_engine_that_cannot_grant_it_names_the_plugin_option(env: Env) -> None:
    if privileged_allowed(env.engine):
        pytest.skip("this docker engine grants privileged mode")
    env.client.write_text(env.client.read_text().replace("gc {", "allow_privileged = true\n    gc {", 1))
    group = f"""
  group "power" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    task "plugin" {{
      driver = "docker"
      config {{
        image      = "{IMAGE}"
        command    = "true"
        privileged = true
      }}
    }}
  }}"""
    done = env.cli("run", str(write_job(env, "power", group)), "--client", str(env.client))
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "unable to apply caps" in out, out
    assert (
        "this docker engine cannot grant privileged mode (it lacks capabilities itself): drop privileged = true and "
        "add only the capabilities the task needs with cap_add, allowed by the docker plugin option allow_caps"
    ) in out, out
    env.assert_clean()
