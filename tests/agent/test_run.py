"""`driversdk run` through the real CLI, the docker driver and a real engine."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import docker

from driversdk.agent.logmon.tasklogs import RotatingFile
from tests.agent.runs import IMAGE, NO_RESTARTS, ROOT, cli, ours


def files(
    tmp_path: Path, script: str, volume: bool = True, image: str = IMAGE, restart: str = ""
) -> tuple[Path, Path, Path]:
    data = tmp_path / "data"
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    (shared / "in-volume").write_text("x")
    vol_group = 'volume "shared" {\n      type = "host"\n      source = "shared"\n      read_only = true\n    }'
    vol_task = 'volume_mount {\n        volume = "shared"\n        destination = "/data"\n      }'
    job = tmp_path / "job.hcl"
    job.write_text(
        f"""job "shop" {{
  type = "batch"
  group "web" {{
    {restart}
    {vol_group if volume else ""}
    task "web" {{
      driver = "docker"
      kill_timeout = "1s"
      config {{
        image   = "{image}"
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}
      {vol_task if volume else ""}
      logs {{
        max_files     = 2
        max_file_size = 1
      }}
    }}
  }}
}}
"""
    )
    client = tmp_path / "client.hcl"
    client.write_text(
        f'data_dir = "{data}"\nhost_volume "shared" {{\n  path = "{shared}"\n}}\n'
        'plugin "docker" {\n  config {\n    gc {\n      image = false\n    }\n  }\n}\n'
    )
    return job, client, data


def test_run_job_with_host_volume_and_rotated_logs(engine: docker.DockerClient, tmp_path: Path) -> None:
    job, client, data = files(tmp_path, "echo hello from $NOMAD_TASK_NAME; ls /data; echo oops >&2")
    done = subprocess.run(
        cli("run", str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert '==> task "web" started (docker' in done.stdout
    assert '==> task "web" finished with exit code 0' in done.stdout
    (alloc,) = (data / "allocs").iterdir()
    logs = alloc / "alloc" / "logs"
    assert (logs / "web.stdout.0").read_text() == "hello from web\nin-volume\n"
    assert (logs / "web.stderr.0").read_text() == "oops\n"
    assert not list(logs.glob(".*.fifo")), "fifos are removed at the end"
    assert ours(engine, data) == []


def test_run_failure_is_a_sentence_and_leaves_nothing(engine: docker.DockerClient, tmp_path: Path) -> None:
    job, client, data = files(tmp_path, "true", image="driversdk-test/missing:1", restart=NO_RESTARTS)
    done = subprocess.run(
        cli("run", str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert done.returncode == 1
    assert "error: task 'web': Failed to pull `driversdk-test/missing:1`" in done.stderr
    assert "Traceback" not in done.stderr
    assert ours(engine, data) == []
    (alloc,) = (data / "allocs").iterdir()
    assert not list((alloc / "alloc" / "logs").glob(".*.fifo"))


def test_run_refuses_an_invalid_job_before_starting(tmp_path: Path) -> None:
    job, client, data = files(tmp_path, "true")
    client.write_text(f'data_dir = "{data}"\n')  # no host volume "shared"
    done = subprocess.run(
        cli("run", str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert done.returncode == 2  # refused before anything started
    assert 'host volume "shared" (volume "shared") is not in the client config' in done.stdout
    assert not (data / "allocs").exists()


def test_run_ctrl_c_stops_the_task_cleanly(engine: docker.DockerClient, tmp_path: Path) -> None:
    job, client, data = files(tmp_path, "echo up; sleep 300", volume=False)
    proc = subprocess.Popen(
        cli("run", str(job), "--client", str(client)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline()]
    while "event:" in lines[-1]:  # the driver's task events are printed as they come
        lines.append(proc.stdout.readline())
    assert '==> task "web" started' in lines[-1], lines
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not list((data / "allocs").glob("*/alloc/logs/web.stdout.0")):
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "==> interrupted: stopping tasks" in out and '==> task "web" stopping' in out
    assert ours(engine, data) == []


def test_rotating_file_keeps_max_files(tmp_path: Path) -> None:
    sink = RotatingFile(str(tmp_path), "web.stdout", max_files=2, max_size=10)
    sink.write(b"0123456789" * 5)
    sink.close()
    names = sorted(os.listdir(tmp_path))
    assert names == ["web.stdout.3", "web.stdout.4"]
    resumed = RotatingFile(str(tmp_path), "web.stdout", max_files=2, max_size=10)
    assert resumed.index == 4
    resumed.close()


def test_status_and_logs_after_a_run(engine: docker.DockerClient, tmp_path: Path) -> None:
    job, client, data = files(
        tmp_path, "echo line-one; echo line-two; echo err-line >&2; exit 3", volume=False, restart=NO_RESTARTS
    )
    done = subprocess.run(
        cli("run", str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert done.returncode == 1, "a task that exits 3 fails the run"
    status = subprocess.run(
        cli("status", "--data-dir", str(data)), capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert "shop/web/web  docker   failed exit=3" in status.stdout, status.stdout
    logs = subprocess.run(
        cli("logs", "web", "--data-dir", str(data)), capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert logs.stdout == "line-one\nline-two\n"
    err = subprocess.run(
        cli("logs", "web", "--stderr", "-f", "--data-dir", str(data)),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert err.stdout == "err-line\n", "-f returns once the task is no longer running"
    missing = subprocess.run(
        cli("logs", "db", "--data-dir", str(data)), capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert missing.returncode == 1
    assert "error: task 'db' has not been run with this data_dir; `driversdk status` lists tasks" in missing.stderr


def test_run_refuses_a_network_mode_it_does_not_run(tmp_path: Path) -> None:
    job, client, data = files(tmp_path, "true", volume=False)
    text = job.read_text()
    job.write_text(text.replace('group "web" {', 'group "web" {\n    network {\n      mode = "none"\n    }'))
    done = subprocess.run(
        cli("run", str(job), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert done.returncode == 2  # refused before anything started
    assert (
        'error: group "web": network mode \'none\' is not run by driversdk run; use mode = "host" or "bridge"'
        in done.stderr
    ), done.stderr
    assert not list((data / "allocs").glob("*")), "refused before anything was laid out"
