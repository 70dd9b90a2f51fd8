"""Restart policy, lifecycle order and templates under `driversdk run`: the real CLI, the docker
driver and a real engine (the restart test also under exec). Markers the tasks write to alloc/data
prove what happened when; each test ends with nothing of it left on the host."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path

import docker
import pytest

from tests.agent.grouprun import alloc_dir, run, task, write
from tests.agent.runs import (
    IMAGE,
    NO_RESTARTS,
    ROOT,
    cli,
    db_rows,
    leaks,
    ours,
    start_run,
    wait_for,
)


def status(client: Path) -> str:
    done = subprocess.run(cli("status", "--client", str(client)), capture_output=True, text=True, cwd=ROOT)
    return done.stdout


RESTART = """
    restart {{
      attempts = {attempts}
      delay    = "1s"
      interval = "1m"
      mode     = "fail"
    }}"""

# Counts its runs in alloc/data (which outlives a restart) and fails until the third.
FLAKY = "n=$(cat /alloc/data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /alloc/data/n; echo run $n; [ $n -ge 3 ]"


@pytest.mark.parametrize("driver", ["docker", "exec"])
def test_run_restart_policy_restarts_a_failing_task_until_it_succeeds(
    engine: docker.DockerClient, tmp_path: Path, driver: str
) -> None:
    job, client, data = write(tmp_path, task("flaky", FLAKY, driver=driver), group_extra=RESTART.format(attempts=3))
    done = run(job, client)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert out.count('==> task "flaky" Terminated: Exit Code: 1') == 2
    assert out.count('==> task "flaky" Restarting: Task restarting in 1') == 2  # 1s plus Nomad's jitter
    assert '==> task "flaky" Terminated: Exit Code: 0' in out
    assert f'==> task "flaky" started ({driver}' in out and "restart 2" in out
    assert '==> task "flaky" finished with exit code 0' in out
    alloc = alloc_dir(data)
    assert (alloc / "alloc" / "data" / "n").read_text() == "3\n"
    # One log collector across the restarts: every run's output in the same file.
    assert (alloc / "alloc" / "logs" / "flaky.stdout.0").read_text() == "run 1\nrun 2\nrun 3\n"
    assert "complete exit=0 restarts=2" in status(client)
    assert leaks(engine, tmp_path) == []


def test_run_restart_attempts_exhausted_in_mode_fail_fail_the_task(engine: docker.DockerClient, tmp_path: Path) -> None:
    job, client, data = write(tmp_path, task("broken", "echo try; exit 1", RESTART.format(attempts=1)))
    done = run(job, client)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert out.count('==> task "broken" Restarting: Task restarting in 1') == 1
    assert '==> task "broken" Not Restarting: Exceeded allowed attempts 1 in interval 1m0s and mode is "fail"' in out
    assert '==> task "broken" finished with exit code 1' in out
    assert "failed exit=1 restarts=1" in status(client)
    assert ours(engine, data) == []


def mark(what: str) -> str:
    return f"echo {what} >> /alloc/data/order"


LIFECYCLE = (
    task("init", f"{mark('init-start')}; sleep 1; {mark('init-end')}", 'lifecycle {\n hook = "prestart"\n }')
    + task(
        "side",
        f"trap '{mark('side-stop')}; exit 0' TERM; {mark('side-start')}; while true; do sleep 0.2; done",
        'lifecycle {\n hook = "prestart"\n sidecar = true\n }',
    )
    + task("main", f"{mark('main-start')}; sleep 2; {mark('main-end')}")
    + task("post", mark("poststart"), 'lifecycle {\n hook = "poststart"\n }')
    + task("stop", mark("poststop"), 'lifecycle {\n hook = "poststop"\n }')
)


def test_run_lifecycle_runs_prestart_sidecar_main_poststart_poststop_in_nomads_order(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    job, client, data = write(tmp_path, LIFECYCLE)
    done = run(job, client)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    order = (alloc_dir(data) / "alloc" / "data" / "order").read_text().split()
    assert sorted(order) == sorted(
        ["init-start", "init-end", "side-start", "main-start", "main-end", "poststart", "side-stop", "poststop"]
    ), order
    at = order.index
    assert at("init-end") < at("main-start"), order  # main waits for the prestart task to complete
    assert at("main-end") < at("side-stop") < at("poststop"), order  # sidecar stopped, then poststop
    lines = out.splitlines()

    def line(text: str) -> int:
        return next(i for i, each in enumerate(lines) if text in each)

    assert line('task "side" started') < line('task "main" started') < line('task "post" started')
    assert line('task "main" finished') < line('task "side" Main Tasks Dead: Main tasks in the group died')
    assert line('task "main" finished') < line('task "stop" started')
    assert ours(engine, data) == []


def test_run_lifecycle_failed_prestart_fails_the_alloc_and_starts_no_main_task(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    body = (
        task("init", "echo no; exit 3", 'lifecycle {\n hook = "prestart"\n }\n' + NO_RESTARTS)
        + task("side", "while true; do sleep 0.2; done", 'lifecycle {\n hook = "prestart"\n sidecar = true\n }')
        + task("main", mark("main-start"))
        + task("stop", mark("poststop"), 'lifecycle {\n hook = "poststop"\n }')
    )
    job, client, data = write(tmp_path, body)
    done = run(job, client)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert 'job "life" group "g": prestart task "init" failed (exit code 3), so the main tasks were not started' in out
    assert '==> task "side" Sibling Task Failed: Task\'s sibling "init" failed' in out
    assert '==> task "main" not started: prestart task "init" failed' in out
    # Nothing but the poststop task ran (Nomad runs poststop tasks after a failure too).
    assert (alloc_dir(data) / "alloc" / "data" / "order").read_text() == "poststop\n"
    assert ours(engine, data) == []


TEMPLATES = """
      template {
        data        = "task=[[ env \\"NOMAD_TASK_NAME\\" ]] color=[[ env \\"COLOR\\" | toUpper ]]\\n"
        destination = "local/app.conf"
        perms       = "0600"
        left_delimiter  = "[["
        right_delimiter = "]]"
      }
      template {
        data        = "GREETING=hello-{{ env \\"NOMAD_TASK_NAME\\" }}\\n"
        destination = "secrets/file.env"
        env         = true
      }
      template {
        data        = "shared by {{ env \\"NOMAD_TASK_NAME\\" }}"
        destination = "${NOMAD_ALLOC_DIR}/data/shared.txt"
      }
      template {
        data        = "{{ key \\"config/app\\" }}"
        destination = "local/consul.conf"
      }
      env {
        COLOR = "blue"
      }"""


def test_run_template_is_rendered_with_env_and_perms(engine: docker.DockerClient, tmp_path: Path) -> None:
    script = "cat /local/app.conf; echo $GREETING; ls /local"
    job, client, data = write(tmp_path, task("web", script, TEMPLATES))
    checked = subprocess.run(
        cli("validate", str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    notes = [line for line in checked.stdout.splitlines() if line.startswith("note")]
    assert notes == ['note  template (first in task "web", uses key): not acted on by driversdk run'], notes
    done = run(job, client)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "uses key, which need a Consul, Vault or Nomad server; not rendered by driversdk run" in done.stdout
    alloc = alloc_dir(data)
    rendered = alloc / "web" / "local" / "app.conf"
    assert rendered.read_text() == "task=web color=BLUE\n"
    assert stat.S_IMODE(rendered.stat().st_mode) == 0o600
    assert (alloc / "alloc" / "data" / "shared.txt").read_text() == "shared by web"
    assert (alloc / "alloc" / "logs" / "web.stdout.0").read_text() == "task=web color=BLUE\nhello-web\napp.conf\n"
    assert ours(engine, data) == []


def test_run_template_refuses_a_destination_the_task_replaced_by_a_symlink(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("original\n")
    # The first run swaps its rendered file for a link to a host file and fails; the restart
    # renders the templates again (render_templates) and must not write through the link.
    script = (
        f"if [ ! -e /alloc/data/once ]; then touch /alloc/data/once; rm /local/app.conf; "
        f"ln -s {victim} /local/app.conf; exit 1; fi"
    )
    extra = (
        'template {\n data = "rendered"\n destination = "local/app.conf"\n }\n'
        'restart {\n attempts = 2\n delay = "1s"\n interval = "1m"\n render_templates = true\n }'
    )
    job, client, data = write(tmp_path, task("web", script, extra))
    done = run(job, client)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert (
        'restart failed: task "web" template[0] destination "local/app.conf" is a symbolic link; driversdk run never '
        "writes through a link in the task dir" in out
    )
    assert '==> task "web" Not Restarting: Error was unrecoverable' in out
    assert victim.read_text() == "original\n"
    assert os.path.islink(alloc_dir(data) / "web" / "local" / "app.conf")
    assert ours(engine, data) == []


def test_run_killed_during_a_restart_delay_restarts_the_task_when_run_again(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    once = (
        "n=$(cat /alloc/data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /alloc/data/n; echo run $n; [ $n -ge 2 ]"
    )
    slow = 'restart {\n attempts = 2\n delay = "2m"\n interval = "10m"\n }'
    job, client, data = write(tmp_path, task("flaky", once, slow))
    proc = start_run(job, client)
    try:
        wait_for("the restart delay", lambda: db_rows(data, "SELECT 1 FROM run_tasks WHERE state='restarting'"))
        proc.kill()  # SIGKILL: nothing of the run's own teardown happens
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "restarting exit=1 restarts=1" in status(client)
    done = run(job, client)  # the same job again: recovered, and the restart happens at once
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert '==> task "flaky" was waiting to restart (restart 1) when the previous run was killed; starting it' in out
    assert '==> task "flaky" finished with exit code 0' in out
    logs = alloc_dir(data) / "alloc" / "logs" / "flaky.stdout.0"
    assert logs.read_text() == "run 1\nrun 2\n"
    assert "complete exit=0 restarts=1" in status(client)
    assert leaks(engine, tmp_path) == []


# --- a first start that fails, under the restart policy (Nomad's SetStartError) ------------------


def _unreachable_image() -> str:
    """An image reference on a registry port nothing listens on: the pull fails at once, and the
    docker driver calls that recoverable (a registry may come back)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}/dsx-later:1"


def _lines_until(proc: subprocess.Popen[str], needle: str) -> list[str]:
    assert proc.stdout is not None
    seen: list[str] = []
    while not seen or needle not in seen[-1]:
        line = proc.stdout.readline()
        assert line, "the run ended before: " + needle + "\n" + "".join(seen) + proc.communicate()[1]
        seen.append(line)
    return seen


def test_a_recoverable_first_start_failure_is_restarted_by_the_policy(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    image = _unreachable_image()
    body = task("later", "echo up").replace(f'"{IMAGE}"', f'"{image}"')
    job, client, data = write(tmp_path, body, group_extra=RESTART.format(attempts=2).replace('"1s"', '"3s"'))
    proc = start_run(job, client)
    try:
        before = _lines_until(proc, '==> task "later" Restarting: Task restarting in 3')
        # The registry "comes back": the image is there when the policy starts the task again.
        engine.images.get(IMAGE).tag(image)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        engine.images.remove(image, force=False, noprune=True)
    text = "".join(before) + out
    assert proc.returncode == 0, text + err
    assert f"==> task \"later\" Driver Failure: task 'later': Failed to pull `{image}`" in text
    assert '==> task "later" started (docker' in text and "restart 1" in text
    assert '==> task "later" finished with exit code 0' in text
    assert "Traceback" not in text + err
    assert "complete exit=0 restarts=1" in status(client)
    assert ours(engine, data) == []


def test_a_stop_during_a_first_start_restart_delay_ends_the_run_at_once(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    image = _unreachable_image()
    body = task("later", "echo up").replace(f'"{IMAGE}"', f'"{image}"')
    job, client, data = write(
        tmp_path, body, group_extra=RESTART.format(attempts=2).replace('"1s"', '"5m"').replace('"1m"', '"1h"')
    )
    proc = start_run(job, client)
    try:
        _lines_until(proc, '==> task "later" Restarting: Task restarting in ')  # 5m plus jitter
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # not the five minutes of the delay
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err
    assert "started (docker" not in out
    assert ours(engine, data) == []
    assert leaks(engine, tmp_path) == []


def test_with_no_restarts_allowed_a_first_start_failure_fails_the_run_at_once(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    image = _unreachable_image()
    body = task("later", "echo up", NO_RESTARTS).replace(f'"{IMAGE}"', f'"{image}"')
    job, client, data = write(tmp_path, body)
    done = run(job, client)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"Failed to pull `{image}`" in done.stdout + done.stderr
    assert f"==> task \"later\" Driver Failure: task 'later': Failed to pull `{image}`" in done.stdout
    assert '==> task "later" Not Restarting: Policy allows no restarts' in done.stdout, done.stdout
    assert "Task restarting in" not in done.stdout
    assert ours(engine, data) == []
