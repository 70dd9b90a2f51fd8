"""Pulls from real registries (compose.yml, started by pytest-docker): missing and :latest images,
force_pull, credentials, auth_soft_fail, image_pull_timeout, progress events, reference-counted GC."""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from drivers.docker.pulls import PROGRESS_INTERVAL_ENV
from driversdk.errors import DriverSDKError, PluginCallError
from driversdk.model import TaskEvent
from driversdk.testing import AllocDir, DriverHarness

from ..conftest import IMAGE, busybox
from .conftest import REPO, Registries, SlowProxy, push

Missing = Callable[[str], str]


def _events(h: DriverHarness) -> list[TaskEvent]:
    into: list[TaskEvent] = []

    def run() -> None:
        try:
            for event in h.client.task_events():
                into.append(event)
        except DriverSDKError:
            pass

    threading.Thread(target=run, daemon=True).start()
    time.sleep(0.2)
    return into


def _image_of(engine: docker.DockerClient, alloc: AllocDir, task: str = "web") -> str:
    return str(engine.containers.get(f"{task}-{alloc.alloc_id}").attrs["Image"])


def _run(h: DriverHarness, alloc: AllocDir, image: str, task: str = "web", **extra: Any) -> str:
    t = alloc.task_config(task, driver_config=busybox("true", image=image, **extra))
    h.start(t)
    assert h.client.wait_task(t.id, timeout=60).exit_code == 0
    return t.id


def test_docker_pull_when_missing(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    missing: Missing,
    engine: docker.DockerClient,
) -> None:
    image = missing(registries.image(registries.plain))
    h = plugin()
    events = _events(h)
    _run(h, alloc, image)
    assert _image_of(engine, alloc) == registries.blob_id
    downloading = [e for e in events if e.message == "Downloading image"]
    assert [e.annotations["image"] for e in downloading] == [image]


def test_docker_latest_is_pulled_again(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    missing: Missing,
    engine: docker.DockerClient,
) -> None:
    latest = missing(registries.image(registries.plain, "latest"))
    # The local :latest is busybox; the registry's :latest is the blob image: the task must get the latter.
    pinned = missing(registries.image(registries.plain))
    engine.api.pull(pinned.rsplit(":", 1)[0], "1.0")
    engine.images.get(pinned).tag(latest)
    push(engine, latest)
    engine.images.get(IMAGE).tag(latest)
    h = plugin()
    _run(h, alloc, latest)
    assert _image_of(engine, alloc) == registries.blob_id
    # A tag-less reference means :latest, and is pulled too.
    engine.images.get(IMAGE).tag(latest)
    _run(h, alloc, latest.removesuffix(":latest"), task="bare")
    assert _image_of(engine, alloc, "bare") == registries.blob_id


def test_docker_force_pull(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    missing: Missing,
    engine: docker.DockerClient,
) -> None:
    image = missing(registries.image(registries.plain))
    engine.images.get(IMAGE).tag(image)  # a stale local copy under the same tag
    h = plugin()
    _run(h, alloc, image, task="cached")
    assert _image_of(engine, alloc, "cached") == engine.images.get(IMAGE).id
    _run(h, alloc, image, task="forced", force_pull=True)
    assert _image_of(engine, alloc, "forced") == registries.blob_id


def test_docker_pull_with_task_credentials(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    missing: Missing,
    engine: docker.DockerClient,
) -> None:
    image = missing(registries.image(registries.auth))
    h = plugin()
    t = alloc.task_config("anon", driver_config=busybox("true", image=image))
    with pytest.raises(PluginCallError) as anonymous:
        h.start(t)
    assert anonymous.value.message.startswith(f"task 'anon': Failed to pull `{image}`: ")
    assert "no basic auth credentials" in anonymous.value.message or "unauthorized" in anonymous.value.message
    bad = {"username": registries.user, "password": "wrong"}
    t = alloc.task_config("bad", driver_config=busybox("true", image=image, auth=bad))
    with pytest.raises(PluginCallError) as wrong:
        h.start(t)
    assert wrong.value.message.startswith(f"task 'bad': Failed to pull `{image}`: ")
    assert "unauthorized" in wrong.value.message
    good = {"username": registries.user, "password": registries.password, "email": "ignored@example.com"}
    _run(h, alloc, image, auth=good)
    assert _image_of(engine, alloc) == registries.blob_id


def test_docker_pull_with_plugin_auth_config_file(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    missing: Missing,
    engine: docker.DockerClient,
    tmp_path: Path,
) -> None:
    image = missing(registries.image(registries.auth))
    config = tmp_path / "docker-auth.json"
    token = base64.b64encode(f"{registries.user}:{registries.password}".encode()).decode()
    config.write_text(json.dumps({"auths": {registries.auth: {"auth": token}}}))
    h = plugin(auth={"config": str(config)})
    _run(h, alloc, image)
    assert _image_of(engine, alloc) == registries.blob_id


def _helper(bin_dir: Path, name: str, registries: Registries) -> dict[str, str]:
    """A docker-credential-<name> on a PATH of its own that knows the auth registry."""
    script = bin_dir / f"docker-credential-{name}"
    answer = json.dumps({"ServerURL": registries.auth, "Username": registries.user, "Secret": registries.password})
    script.write_text(
        "#!/bin/sh\n"
        "read -r registry\n"
        f'if [ "$1" = get ] && [ "$registry" = "{registries.auth}" ]; then echo \'{answer}\'; exit 0; fi\n'
        "echo 'credentials not found in native keychain'; exit 1\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_docker_pull_with_plugin_credential_helper(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    missing: Missing,
    engine: docker.DockerClient,
    tmp_path: Path,
) -> None:
    image = missing(registries.image(registries.auth))
    env = _helper(tmp_path, "drvtest", registries)
    h = plugin(env=env, auth={"helper": "drvtest"})
    _run(h, alloc, image)
    assert _image_of(engine, alloc) == registries.blob_id


def test_docker_auth_soft_fail(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    missing: Missing,
    engine: docker.DockerClient,
) -> None:
    image = missing(registries.image(registries.plain))
    h = plugin(auth={"helper": "driversdk-absent"})
    events = _events(h)
    t = alloc.task_config("strict", driver_config=busybox("true", image=image))
    with pytest.raises(PluginCallError) as info:
        h.start(t)
    assert info.value.message == (
        f"task 'strict': Failed to find docker auth for repo '{registries.plain}/{REPO}': the docker credential "
        "helper 'docker-credential-driversdk-absent' (auth.helper) is not on the plugin's PATH"
    )
    _run(h, alloc, image, task="soft", auth_soft_fail=True)
    assert _image_of(engine, alloc, "soft") == registries.blob_id
    assert any("auth_soft_fail" in e.message and e.task_name == "soft" for e in events)


@pytest.mark.parametrize("where", ["task", "plugin"])
def test_docker_image_pull_timeout(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    slow_proxy: list[SlowProxy],
    missing: Missing,
    where: str,
) -> None:
    stalled = SlowProxy(registries.plain, rate=0)
    slow_proxy.append(stalled)
    image = missing(f"{stalled.address}/{REPO}:1.0")
    # The task's image_pull_timeout, else the plugin's.
    h = plugin(image_pull_timeout="2s") if where == "plugin" else plugin()
    extra = {"image_pull_timeout": "2s"} if where == "task" else {}
    t = alloc.task_config("web", driver_config=busybox("true", image=image, **extra))
    began = time.monotonic()
    with pytest.raises(PluginCallError) as info:
        h.start(t)
    assert time.monotonic() - began < 10
    assert info.value.message == (
        f"task 'web': Failed to pull `{image}`: the pull did not finish within image_pull_timeout (2s)"
    )
    assert info.value.recoverable


def test_docker_pull_progress_events(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    slow_proxy: list[SlowProxy],
    missing: Missing,
    engine: docker.DockerClient,
) -> None:
    proxy = SlowProxy(registries.plain, rate=600_000)  # the 3 MB random layer takes ~5 s
    slow_proxy.append(proxy)
    image = missing(f"{proxy.address}/{REPO}:1.0")
    h = plugin(env={PROGRESS_INTERVAL_ENV: "0.5"})
    events = _events(h)
    _run(h, alloc, image)
    progress = [e for e in events if e.message.startswith("Docker image pull progress: ")]
    assert len(progress) >= 3, [e.message for e in events]
    assert all(e.annotations["image"] == image for e in progress)
    done = [int(e.annotations["bytes_done"]) for e in progress]
    assert done == sorted(done) and done[-1] > done[0]
    assert max(int(e.annotations["bytes_total"]) for e in progress) >= 2_000_000
    assert " layers: " in progress[-1].message


def test_docker_shared_image_pulled_once_and_removed_after_last_user(
    plugin: Callable[..., DriverHarness],
    registries: Registries,
    slow_proxy: list[SlowProxy],
    missing: Missing,
    engine: docker.DockerClient,
    tmp_path: Path,
) -> None:
    proxy = SlowProxy(registries.plain, rate=1_000_000)
    slow_proxy.append(proxy)
    image = missing(f"{proxy.address}/{REPO}:1.0")
    h = plugin(gc={"image": True, "image_delay": "2s"})
    allocs = [AllocDir.create(tmp_path / name, tasks=["web"]) for name in ("one", "two")]
    tasks = [a.task_config("web", driver_config=busybox("sleep", "300", image=image)) for a in allocs]
    errors: list[BaseException] = []

    def start(t: Any) -> None:
        try:
            h.start(t)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=start, args=(t,)) for t in tasks]
    for th in threads:
        th.start()
        time.sleep(0.3)
    for th in threads:
        th.join(120)
    assert not errors, errors
    manifests = [r for r in proxy.requests if "/manifests/1.0 " in r]
    assert len(manifests) == 1, proxy.requests
    h.client.destroy_task(tasks[0].id, force=True)
    h.forget(tasks[0].id)
    time.sleep(4)
    assert engine.images.get(image).id == registries.blob_id  # still used by the second task
    h.client.destroy_task(tasks[1].id, force=True)
    h.forget(tasks[1].id)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            engine.images.get(image)
        except docker.errors.ImageNotFound:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"{image} was not removed after its last user")
    for a in allocs:
        a.remove()


def test_docker_infra_image_is_pulled_with_its_timeout(
    plugin: Callable[..., DriverHarness],
    registries: Registries,
    slow_proxy: list[SlowProxy],
    missing: Missing,
) -> None:
    stalled = SlowProxy(registries.plain, rate=0)
    slow_proxy.append(stalled)
    infra = missing(f"{stalled.address}/{REPO}:1.0")
    h = plugin(infra_image=infra, infra_image_pull_timeout="2s")
    with pytest.raises(PluginCallError) as info:
        h.client.create_network("4b1d5a7e-0000-4000-8000-00000000abcd", "web")
    assert info.value.message == (
        f"infra_image: Failed to pull `{infra}`: the pull did not finish within infra_image_pull_timeout (2s)"
    )
    fresh = missing(registries.image(registries.plain))
    h2 = plugin(infra_image=fresh)
    alloc_id = "4b1d5a7e-0000-4000-8000-00000000abce"
    spec, created = h2.client.create_network(alloc_id, "web")
    try:
        assert created and spec.labels["docker_sandbox_container_id"]
    finally:
        h2.client.destroy_network(alloc_id, spec)


def test_docker_pull_activity_timeout(
    plugin: Callable[..., DriverHarness],
    alloc: AllocDir,
    registries: Registries,
    slow_proxy: list[SlowProxy],
    missing: Missing,
) -> None:
    # Nomad's minimum is 1m, so this test waits a minute for a registry that goes silent in the
    # middle of the random layer (after manifests and config, some 500 kB of the blob).
    stalled = SlowProxy(registries.plain, rate=2_000_000, stall_after=500_000)
    slow_proxy.append(stalled)
    image = missing(f"{stalled.address}/{REPO}:1.0")
    h = plugin(pull_activity_timeout="1m")
    t = alloc.task_config("web", driver_config=busybox("true", image=image))
    began = time.monotonic()
    with pytest.raises(PluginCallError) as info:
        h.start(t)
    assert info.value.message == (
        f"task 'web': Failed to pull `{image}`: the pull made no progress for pull_activity_timeout (60s)"
    )
    assert 59 < time.monotonic() - began < 90
    assert info.value.recoverable
