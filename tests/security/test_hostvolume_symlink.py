"""A host volume whose path is a symlink is resolved once, when the client config is read:
validate shows where it really points, a link to "/" (the whole host) is refused, and so is a
relative path, whose meaning would depend on the directory driversdk runs in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from driversdk.jobspec.clientconfig import load_client

ROOT = Path(__file__).resolve().parents[2]


def validate(tmp_path: Path, path: str) -> subprocess.CompletedProcess[str]:
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{tmp_path / "data"}"\nhost_volume "shared" {{\n  path = "{path}"\n}}\n')
    job = tmp_path / "job.hcl"
    job.write_text("""job "shop" {
  group "web" {
    volume "data" {
      type   = "host"
      source = "shared"
    }
    task "web" {
      driver = "exec"
      config {
        command = "/bin/true"
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
    }
  }
}
""")
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "validate", str(job), "--client", str(client)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
    )
    assert "Traceback" not in done.stdout + done.stderr
    return done


def test_a_symlinked_host_volume_shows_its_target(tmp_path: Path) -> None:
    target = tmp_path / "srv" / "data"
    target.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(target)
    done = validate(tmp_path, str(link))
    assert f'ok    host volume "shared" → {target} (symlink resolved)\n' in done.stdout, done.stdout + done.stderr
    # What run mounts is the resolved path; `path` stays as written for messages.
    volume = load_client(tmp_path / "client.hcl").host_volumes["shared"]
    assert (volume.path, volume.resolved, volume.host_path) == (str(link), str(target), str(target))


def test_a_plain_host_volume_says_where_it_is_without_the_note(tmp_path: Path) -> None:
    target = tmp_path / "plain"
    target.mkdir()
    done = validate(tmp_path, str(target))
    assert f'ok    host volume "shared" → {target}\n' in done.stdout, done.stdout + done.stderr


def test_a_symlink_to_the_root_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "everything"
    link.symlink_to("/")
    done = validate(tmp_path, str(link))
    assert done.returncode == 1
    assert (
        f'error {tmp_path / "client.hcl"}:2, host_volume "shared": path "{link}" resolves to / (through a symlink), '
        "the host's whole filesystem; refusing to mount it into tasks: point the host volume at a directory\n"
    ) in done.stdout, done.stdout + done.stderr


def test_a_chain_of_links_ending_at_the_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("/usr/..")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    done = validate(tmp_path, str(tmp_path / "b"))
    assert done.returncode == 1
    assert "resolves to / (through a symlink), the host's whole filesystem" in done.stdout


def test_the_root_itself_is_refused(tmp_path: Path) -> None:
    done = validate(tmp_path, "/")
    assert done.returncode == 1
    assert 'path "/" resolves to /, the host\'s whole filesystem; refusing to mount it' in done.stdout


def test_a_relative_path_is_refused(tmp_path: Path) -> None:
    done = validate(tmp_path, "srv/data")
    assert done.returncode == 1
    assert (
        f'error {tmp_path / "client.hcl"}:2, host_volume "shared": path "srv/data" must be an absolute path '
        "(it would depend on the directory driversdk runs in)\n"
    ) in done.stdout, done.stdout + done.stderr
