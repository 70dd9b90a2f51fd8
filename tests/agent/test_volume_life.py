"""A CSI volume's whole life through the real CLI, the reference plugin as a real process (an exec
task with csi_plugin): claims that end (the volume watcher, `volume detach`, a run killed between
publish and its record), `volume create | delete | snapshot`, `validate`'s topology check and
per_alloc volumes with count = 2. Each test checks the sentence and what is left behind."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import docker
import pytest

from drivers.docker.config import DEFAULT_ALLOW_CAPS
from tests.agent.csienv import (
    Env,
    app_group,
    claims_of,
    make_env,
    mounts,
    plugin_group,
    privileged_allowed,
    run_mounting_vol,
    status,
    stop,
    volume_file,
    wait_for_line,
    write_job,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="CSI runs mount and run runc: root only")


@pytest.fixture
def env(engine: docker.DockerClient, short_dir: Path, kill_orphans_if_failed: None) -> Env:
    return make_env(engine, short_dir)


def app_whose_plugin_goes_away(env: Env) -> tuple[Path, str]:
    """The issue's scenario up to the failed release: a plugin job and an app job claiming its
    volume; the plugin job is stopped while the app runs, then the app stops. Returns the plugin
    job and the app run's output."""
    env.register()
    plugin_job = write_job(env, "plugins", plugin_group())
    app_job = write_job(env, "app", app_group("echo started; sleep 300"))
    plugin = env.start(plugin_job)
    try:
        wait_for_line(plugin, "Plugin became healthy")
        app = env.start(app_job)
        wait_for_line(app, '==> task "app" started')
    finally:
        stop(plugin)
    out = stop(app)
    assert app.returncode == 1
    return plugin_job, out


def test_claim_of_an_app_whose_plugin_went_away_is_released_when_the_plugin_is_back(env: Env) -> None:
    plugin_job, out = app_whose_plugin_goes_away(env)
    assert 'no instance of CSI plugin "hostpath" is registered to unmount it' in out, out
    assert "the claim is kept as a past claim, released by the volume watcher" in out
    [alloc] = env.claims()
    [claim] = claims_of(status(env, "vol"))
    assert claim["state"] == "unpublishing" and "registered to unmount it" in claim["last_error"]
    assert claim["status"].startswith("past, being released (next: node unpublish); last error: ")
    assert mounts(env, "per-alloc"), "the publish mount is still there: nothing could unmount it"

    # The claim does not block: a new run of the app may claim the volume at once. Here the
    # plugin comes back first, and its run's volume watcher releases the past claim.
    plugin = env.start(plugin_job)
    try:
        lines = wait_for_line(plugin, "released the past claim", timeout=60)
        assert (
            f'==> volume "vol": released the past claim of alloc {alloc[:8]} (job app) on CSI volume "vol"'
            in (lines[-1])
        )
        assert env.claims() == []
        assert mounts(env, "per-alloc") + mounts(env, "staging") == [], "published and staged mounts are gone"
        again = write_job(env, "app", app_group("echo again > /data/again"))
        done = env.cli("run", str(again), "--client", str(env.client))
        assert done.returncode == 0, done.stdout + done.stderr
        assert (env.work / "backing" / "volumes" / "vol" / "again").read_text() == "again\n"
    finally:
        stop(plugin)
    assert env.claims() == []
    env.assert_clean()


def test_a_past_claim_never_blocks_a_new_claim(env: Env) -> None:
    app_whose_plugin_goes_away(env)
    [old] = env.claims()
    # The old claim's release waits for the plugin; the new run brings it, claims and mounts,
    # and its watcher releases the old claim too.
    both = write_job(env, "both", plugin_group(), app_group("true"))
    done = env.cli("run", str(both), "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "volume max claims reached" not in done.stdout + done.stderr
    assert f"released the past claim of alloc {old[:8]}" in done.stdout
    assert env.claims() == []
    env.assert_clean()


def test_detach_frees_the_claim_of_a_plugin_gone_for_good_once_nothing_is_mounted(env: Env) -> None:
    app_whose_plugin_goes_away(env)
    [alloc] = env.claims()
    held = mounts(env, "per-alloc") + mounts(env, "staging")
    assert len(held) == 2
    refused = env.cli("volume", "detach", "vol", "--client", str(env.client))
    assert refused.returncode == 1
    target = mounts(env, "per-alloc")[0]
    assert (
        f'error: the past claim of alloc {alloc[:8]} (job app) on CSI volume "vol" is not released yet: volume '
        f'"vol": its publish target {target} is still mounted and no instance of CSI plugin "hostpath" is '
        f"registered to unmount it; start the plugin again, or unmount it by hand (umount {target})"
    ) in refused.stderr, refused.stderr
    assert env.claims() == [alloc]
    for path in held:  # the operator does what the plugin no longer can
        subprocess.run(["umount", path], check=True)
    done = env.cli("volume", "detach", "vol", "--alloc", alloc[:8], "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip()
    assert line.startswith(
        f'released the past claim of alloc {alloc[:8]} (job app) on CSI volume "vol"; could not undo: '
    )
    assert "NodeUnpublishVolume of " in line and "NodeUnstageVolume of " in line
    assert 'ControllerUnpublishVolume of volume "vol" from node ' in line
    assert "the plugin may still count the volume as published there" in line
    assert env.claims() == []
    rows = sqlite3.connect(env.db).execute("SELECT COUNT(*) FROM csi_usage UNION ALL SELECT COUNT(*) FROM csi_staged")
    assert rows.fetchall() == [(0,), (0,)]
    per_alloc = env.data / "client" / "csi" / "monolith" / "hostpath" / "per-alloc"
    assert not per_alloc.exists() or list(per_alloc.iterdir()) == []  # the layout dir at most, empty
    again = env.cli("volume", "detach", "vol", "--client", str(env.client))
    assert again.returncode == 0 and again.stdout == 'volume "vol" has no claims; nothing to detach\n'
    env.assert_clean()


def test_run_killed_between_publish_and_its_record_is_finished_by_the_next_run(env: Env) -> None:
    env.register()
    job = write_job(
        env, "killed", plugin_group(env='CSI_HOSTPATH_FAULTS = "NodePublishVolume=delay:4"'), app_group("true")
    )
    first = env.start(job)
    wait_for_line(first, "Plugin became healthy")
    deadline = time.monotonic() + 60
    while not mounts(env, "staging"):  # staged; NodePublishVolume is under way (4 s)
        assert time.monotonic() < deadline, "the volume was never staged"
        time.sleep(0.1)
    time.sleep(1)
    first.kill()
    first.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while not mounts(env, "per-alloc"):  # the plugin finishes the publish nobody recorded
        assert time.monotonic() < deadline, "the plugin never published"
        time.sleep(0.2)
    [alloc] = env.claims()
    [claim] = claims_of(status(env, "vol"))
    assert claim["state"] == "taken" and claim["status"] == "in use", "the alloc is not over: its claim holds"
    refused = env.cli("volume", "detach", "vol", "--client", str(env.client))
    assert refused.returncode == 1
    assert f'error: alloc {alloc[:8]} of job killed still uses volume "vol"' in refused.stderr
    assert env.claims() == [alloc]

    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"recovering alloc {alloc[:8]}" in done.stdout
    assert '==> volume "data": CSI volume "vol" unmounted and released' in done.stdout
    assert env.claims() == []
    env.assert_clean()


def test_create_snapshot_clone_delete_end_to_end(env: Env) -> None:
    plugin = env.start(write_job(env, "plugins", plugin_group()))
    try:
        wait_for_line(plugin, "Plugin became healthy")
        made = volume_file(env, "made", 'capacity_min = "1MiB"\ncapacity_max = "10MiB"\n')
        done = env.cli("volume", "create", str(made), "--client", str(env.client))
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith('created CSI volume "made" (external ID "')
        view = status(env, "made")
        assert view["capacity_bytes"] == 1048576 and view["schedulable"] is True
        assert view["plugin_node"] == "healthy" and view["plugin_controller"] == "healthy"
        topologies = view["topologies"]
        assert isinstance(topologies, list) and len(topologies) == 1
        (key, node), *_ = topologies[0].items()

        far = volume_file(
            env, "far", f'topology_request {{\n  required {{\n    topology {{\n      segments = {{ "{key}" = '
            '"elsewhere" }\n    }\n  }\n}\n',
        )  # fmt: skip
        done = env.cli("volume", "create", str(far), "--client", str(env.client))
        assert done.returncode == 1
        assert done.stderr.startswith('error: unable to provision "far" in accessible_topology: rpc error: ')
        # validate: a volume registered as reachable only elsewhere
        done = env.cli("volume", "register", str(far), "--client", str(env.client))
        assert done.returncode == 0, done.stderr
        job = write_job(env, "farjob", app_group("true").replace('source          = "vol"', 'source = "far"'))
        done = env.cli("validate", str(job), "--client", str(env.client))
        assert done.returncode == 1
        assert (
            f'CSI volume "far" is only accessible from topology {key}=elsewhere, and this node\'s plugin topology '
            f"is {key}={node}; use a volume reachable from this node" in done.stdout
        ), done.stdout
        assert env.cli("volume", "deregister", "far", "--client", str(env.client)).returncode == 0

        done = env.cli("volume", "snapshot", "create", "made", "snap1", "--client", str(env.client))
        assert done.returncode == 0, done.stderr
        snapshot = done.stdout.split('"')[1]
        assert done.stdout.startswith(f'created snapshot "{snapshot}" of volume "made" (size ')
        listing = env.cli("volume", "snapshot", "list", "-plugin", "hostpath", "--client", str(env.client))
        assert listing.returncode == 0 and f"{snapshot}  plugin=hostpath  volume=made  " in listing.stdout

        copy = volume_file(env, "copy", f'snapshot_id = "{snapshot}"\n')
        done = env.cli("volume", "create", str(copy), "--client", str(env.client))
        assert done.returncode == 0, done.stderr
        assert status(env, "copy")["snapshot_id"] == snapshot

        holder = env.start(write_job(env, "holder", app_group("sleep 300").replace('"vol"', '"made"')))
        try:
            wait_for_line(holder, '==> task "app" started')
            refused = env.cli("volume", "delete", "made", "--client", str(env.client))
            assert refused.returncode == 1
            assert refused.stderr.startswith('error: volume "made" is claimed by alloc ')
            assert "of job holder (in use); stop those jobs" in refused.stderr
        finally:
            stop(holder)
        for volume in ("made", "copy"):
            done = env.cli("volume", "delete", volume, "--client", str(env.client))
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith(f'deleted CSI volume "{volume}" (external ID "')
        assert env.cli("volume", "status", "--client", str(env.client)).stdout == "no CSI volumes registered\n"
        done = env.cli("volume", "snapshot", "delete", "hostpath", snapshot, "--client", str(env.client))
        assert done.returncode == 0 and done.stdout == f'deleted snapshot "{snapshot}" of CSI plugin "hostpath"\n'
        listing = env.cli("volume", "snapshot", "list", "--client", str(env.client))
        assert listing.stdout == "no snapshots\n"
    finally:
        stop(plugin)
    assert not any((env.work / "backing" / "volumes").iterdir()), "every created volume is deleted"
    env.assert_clean()


def test_per_alloc_volumes_with_count_2(env: Env) -> None:
    for index in (0, 1):
        (env.work / "backing" / "volumes" / f"vol{index}").mkdir()
        spec = env.work / f"vol{index}.hcl"
        spec.write_text(
            f'id = "vol[{index}]"\nplugin_id = "hostpath"\nexternal_id = "vol{index}"\n'
            'capability {\n  access_mode = "single-node-writer"\n  attachment_mode = "file-system"\n}\n'
        )
        assert env.cli("volume", "register", str(spec), "--client", str(env.client)).returncode == 0
    group = app_group("echo $NOMAD_ALLOC_INDEX > /data/index", extra="per_alloc = true").replace(
        'group "app" {', 'group "app" {\n    count = 2'
    )
    job = write_job(env, "peralloc", plugin_group(), group)
    done = env.cli("run", str(job), "--client", str(env.client))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count('CSI volume "vol[0]" mounted at ') == 1
    assert done.stdout.count('CSI volume "vol[1]" mounted at ') == 1
    for index in (0, 1):
        assert (env.work / "backing" / "volumes" / f"vol{index}" / "index").read_text() == f"{index}\n"
        assert env.claims(f"vol[{index}]") == []
    env.assert_clean()


PLUGIN_IMAGE = "driversdk-test/csi-hostpath:local"


def docker_plugin_group(privileged: bool) -> str:
    # How Nomad users run a CSI plugin: privileged. Where the engine cannot, sys_admin is what
    # the reference plugin needs (it bind-mounts).
    power = "privileged = true" if privileged else 'cap_add    = ["sys_admin"]'
    return f"""
  group "storage" {{
    volume "backing" {{
      type   = "host"
      source = "csi-backing"
    }}
    task "plugin" {{
      driver = "docker"
      kill_timeout = "2s"
      config {{
        image = "{PLUGIN_IMAGE}"
        {power}
      }}
      env {{
        CSI_HOSTPATH_ROOT = "/srv/csi"
      }}
      volume_mount {{
        volume      = "backing"
        destination = "/srv/csi"
      }}
      csi_plugin {{
        id   = "hostpath"
        type = "monolith"
      }}
    }}
  }}"""


def test_csi_plugin_in_a_privileged_docker_container_end_to_end(env: Env) -> None:
    try:
        image = env.engine.images.get(PLUGIN_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{PLUGIN_IMAGE} is not built; run hack/build-csi-plugin-image.sh")
    assert image.labels.get("driversdk.source"), "built by hack/build-csi-plugin-image.sh"
    privileged = privileged_allowed(env.engine)
    caps = ", ".join(f'"{c}"' for c in (*DEFAULT_ALLOW_CAPS, "sys_admin"))
    power = "allow_privileged = true" if privileged else f"allow_caps = [{caps}]"
    env.client.write_text(env.client.read_text().replace("gc {", f"{power}\n    gc {{", 1))
    env.register()
    job = write_job(
        env,
        "dockerplugin",
        docker_plugin_group(privileged),
        app_group("grep ' /data ' /proc/self/mountinfo; echo from-docker > /data/greeting"),
    )
    run_mounting_vol(env, job)
    logs = env.cli("logs", "app", "--client", str(env.client)).stdout
    assert "/data" in logs.splitlines()[0], "the app saw the volume the containerised plugin published"
    assert (env.work / "backing" / "volumes" / "vol" / "greeting").read_text() == "from-docker\n"
    assert env.claims() == []
    env.assert_clean()
    assert not (env.data / "client" / "csi" / "plugins").exists(), "the plugin's socket dir is removed"
