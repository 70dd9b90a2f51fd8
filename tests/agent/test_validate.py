"""`driversdk validate`: the real CLI, real driver plugins launched, real mounts on this host."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.mountinfo import read_mountinfo
from tests.agent.runs import ROOT

HELLO = ROOT / "examples" / "hello_driver.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "validate", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
    )


@pytest.fixture
def shared_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "shared"
    path.mkdir()
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    subprocess.run(["mount", "--make-rshared", str(path)], check=True)
    yield path
    subprocess.run(["umount", "-l", str(path)], check=True)
    assert not [e for e in read_mountinfo() if e.mount_point.startswith(str(tmp_path))]


def write_client(tmp_path: Path, volumes: dict[str, str], extra: str = "") -> Path:
    blocks = "\n".join(f'  host_volume "{n}" {{\n    path = "{p}"\n  }}' for n, p in volumes.items())
    # Its own data dir: the machine's default one may hold another driversdk's state.
    text = (
        f'data_dir = "{tmp_path / "data"}"\nclient {{\n{blocks}\n}}\n'
        f'plugin "hello" {{\n  command = ["{sys.executable}", "{HELLO}"]\n}}\n{extra}'
    )
    path = tmp_path / "client.hcl"
    path.write_text(text)
    return path


def write_job(tmp_path: Path, task: str, volumes: str = "", driver: str = "docker") -> Path:
    config = (
        'config {\n        image = "busybox:1"\n      }'
        if driver == "docker"
        else 'config {\n        command = "/bin/true"\n      }'
    )
    text = f"""job "shop" {{
  group "web" {{
    {volumes}
    task "web" {{
      driver = "{driver}"
      {config}
      {task}
    }}
  }}
}}
"""
    path = tmp_path / "job.hcl"
    path.write_text(text)
    return path


HOST_VOLUME = 'volume "data" {\n      type = "host"\n      source = "shared"\n    }'


def test_validate_good_job(tmp_path: Path, shared_dir: Path) -> None:
    job = write_job(
        tmp_path,
        'volume_mount {\n        volume = "data"\n        destination = "/data"\n'
        '        propagation_mode = "host-to-task"\n      }',
        HOST_VOLUME,
    )
    done = run(str(job), "--client", str(write_client(tmp_path, {"shared": str(shared_dir)})))
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'ok    task "web": driver "docker" loaded' in done.stdout
    assert "job 'shop': valid" in done.stdout


def test_validate_driver_without_mount_support(tmp_path: Path, shared_dir: Path) -> None:
    job = write_job(
        tmp_path,
        'volume_mount {\n        volume = "data"\n        destination = "/data"\n      }',
        HOST_VOLUME,
        "hello",
    )
    done = run(str(job), "--client", str(write_client(tmp_path, {"shared": str(shared_dir)})))
    assert done.returncode == 1
    assert (
        # The volume_mount block is on line 12 of the job write_job writes.
        f'{job}:12, job "shop", group "web", task "web", volume "data" driver: task driver "hello" for "web" does not '
        'support host volumes: volume "data" cannot be mounted' in done.stdout
    )


def test_validate_bidirectional_on_read_only_and_private_source(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir()
    job = write_job(
        tmp_path,
        'volume_mount {\n        volume = "data"\n        destination = "/data"\n'
        '        read_only = true\n        propagation_mode = "bidirectional"\n      }',
        HOST_VOLUME,
    )
    done = run(str(job), "--client", str(write_client(tmp_path, {"shared": str(private)})))
    assert done.returncode == 1
    out = done.stdout
    # One problem: its cause (the mount asks for read-only) and a change that validates as is.
    assert out.count("error ") == 1
    assert 'volume "data": propagation_mode "bidirectional" needs a read-write mount, but this volume_mount' in out
    assert 'keep it read-only with propagation_mode = "private"' in out
    assert f"`mount --bind {private} {private} && mount --make-shared {private}`" in out


def test_validate_missing_host_volume(tmp_path: Path) -> None:
    job = write_job(
        tmp_path, 'volume_mount {\n        volume = "data"\n        destination = "/data"\n      }', HOST_VOLUME
    )
    done = run(str(job), "--client", str(write_client(tmp_path, {})))
    assert done.returncode == 1
    assert (
        'host volume "shared" (volume "data") is not in the client config; add a host_volume "shared" block'
        in done.stdout
    )


def test_a_group_host_volume_no_task_mounts_must_still_be_on_the_client(tmp_path: Path) -> None:
    # Nomad's scheduler checks every host volume a group asks for, mounted or not.
    job = write_job(tmp_path, "", HOST_VOLUME)
    done = run(str(job), "--client", str(write_client(tmp_path, {})))
    assert done.returncode == 1, done.stdout
    assert (
        'group "web", volume "data": host volume "shared" (volume "data") is not in the client config, and Nomad '
        "places the group only where it is, mounted or not" in done.stdout
    )
    assert done.stdout.count('host volume "shared"') == 1
    assert run(str(job), "--client", str(write_client(tmp_path, {"shared": str(tmp_path)}))).returncode == 0


def test_a_mounted_missing_host_volume_is_reported_once_with_its_mount(tmp_path: Path) -> None:
    job = write_job(
        tmp_path, 'volume_mount {\n        volume = "data"\n        destination = "/data"\n      }', HOST_VOLUME
    )
    done = run(str(job), "--client", str(write_client(tmp_path, {})))
    assert done.stdout.count('host volume "shared"') == 1, done.stdout
    assert 'task "web", volume_mount[0]: host volume "shared"' in done.stdout


@pytest.mark.parametrize(("request_read_only", "valid"), [(False, False), (True, True)])
def test_a_read_only_host_volume_is_placed_only_for_a_read_only_request(
    tmp_path: Path, request_read_only: bool, valid: bool
) -> None:
    flag = str(request_read_only).lower()
    volume = HOST_VOLUME.replace('source = "shared"', f'source = "shared"\n      read_only = {flag}')
    job = write_job(tmp_path, "", volume)
    client = write_client(tmp_path, {})
    client.write_text(
        client.read_text().replace(
            "client {\n", f'client {{\n  host_volume "shared" {{\n    path = "{tmp_path}"\n    read_only = true\n  }}\n'
        )
    )
    done = run(str(job), "--client", str(client))
    assert (done.returncode == 0) is valid, done.stdout
    sentence = 'host volume "shared" is read-only in the client config, but volume "data" asks for it read-write'
    assert (sentence in done.stdout) is not valid


def test_validate_reports_every_problem_at_once(tmp_path: Path) -> None:
    volumes = HOST_VOLUME + '\n    volume "db" {\n      type = "csi"\n      source = "pg"\n    }'
    task = (
        'volume_mount {\n        volume = "nope"\n        destination = "data"\n'
        '        propagation_mode = "sideways"\n      }\n      bogus = 1'
    )
    job = write_job(tmp_path, task, volumes)
    (tmp_path / "job.hcl").write_text(
        job.read_text().replace('image = "busybox:1"', 'image = "busybox:1"\n        imagee = 2')
    )
    done = run(str(job), "--client", str(write_client(tmp_path, {"shared": str(tmp_path)})), "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["valid"] is False
    texts = [p["text"] for p in report["problems"]]
    expected = [
        "unsupported argument or block 'bogus'",
        "CSI volumes must have an attachment mode",
        "CSI volumes must have an access mode",
        "references undefined volume 'nope'",
        'volume mount has an invalid propagation mode: "sideways"',
        'destination "data" must be an absolute path',
        "config: imagee is not a known field",
    ]
    for needle in expected:
        assert any(needle in t for t in texts), (needle, texts)
    fields = {p["field"] for p in report["problems"]}
    assert "volume_mount[0]" in fields and 'volume "db"' in fields
    assert all(p["job"] == "shop" for p in report["problems"])


def test_validate_malformed_hcl(tmp_path: Path) -> None:
    job = tmp_path / "broken.hcl"
    job.write_text('job "x" {\n  group "g" {\n')
    done = run(str(job))
    assert done.returncode == 1
    # Where the block that is never closed opens (the innermost), in HCL's terms.
    assert (
        f"error: {job}:2:13: Unclosed configuration block: there is no closing }} for the {{ opened here, "
        'in `group "g" {`' in done.stderr
    )
    assert "Traceback" not in done.stderr


def test_validate_unknown_driver(tmp_path: Path) -> None:
    job = write_job(tmp_path, "", "", "nosuch")
    done = run(str(job))
    assert done.returncode == 1
    assert 'no plugin is configured for driver "nosuch"' in done.stdout
