"""`driversdk volume …` and the CSI checks of `driversdk validate`, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.agent.runs import ROOT

SPEC = """id          = "web-data"
name        = "web-data"
type        = "csi"
plugin_id   = "hostpath"
external_id = "vol-1"
capability {
  access_mode     = "multi-node-multi-writer"
  attachment_mode = "file-system"
}
mount_options {
  fs_type     = "ext4"
  mount_flags = ["password=hunter2"]
}
secrets {
  token = "s3cret"
}
parameters {
  tier = "gold"
}
"""


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driversdk.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def vol(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(tmp_path, "volume", "--data-dir", str(tmp_path / "data"), *args)


def test_volume_register_status_update_deregister(tmp_path: Path) -> None:
    spec = tmp_path / "vol.hcl"
    spec.write_text(SPEC)
    done = vol(tmp_path, "register", str(spec))
    assert done.returncode == 0 and 'registered CSI volume "web-data" (plugin "hostpath")' in done.stdout
    shown = json.loads(vol(tmp_path, "status", "web-data").stdout)
    assert shown["secrets"] == {"token": "[REDACTED]"}
    assert shown["mount_options"] == {"fs_type": "ext4", "mount_flags": ["[REDACTED]"]}
    assert "hunter2" not in vol(tmp_path, "status", "--json").stdout
    # An update merges: secrets are replaced wholesale (an update without them erases them).
    spec.write_text(SPEC.replace('secrets {\n  token = "s3cret"\n}\n', ""))
    done = vol(tmp_path, "register", str(spec))
    assert 'updated CSI volume "web-data"' in done.stdout
    assert json.loads(vol(tmp_path, "status", "web-data").stdout)["secrets"] == {}
    # Identity and parameters cannot change.
    spec.write_text(SPEC.replace('"vol-1"', '"vol-2"').replace('"gold"', '"silver"'))
    done = vol(tmp_path, "register", str(spec))
    assert done.returncode == 1
    assert 'error: unable to update volume "web-data": volume external ID cannot be updated' in done.stderr
    assert "volume parameters cannot be updated" in done.stderr
    assert vol(tmp_path, "deregister", "web-data").returncode == 0
    done = vol(tmp_path, "deregister", "web-data")
    assert done.returncode == 1 and 'volume "web-data" is not registered in namespace "default"' in done.stderr


def test_volume_bad_spec_lists_every_problem(tmp_path: Path) -> None:
    spec = tmp_path / "bad.hcl"
    spec.write_text(
        'name = "x"\ncolour = "red"\ncapability {\n  access_mode = "writer"\n  attachment_mode = "file-system"\n}\n'
    )
    done = vol(tmp_path, "register", str(spec))
    assert done.returncode == 1
    for needle in ("unsupported argument or block 'colour'", "unknown volume access mode: 'writer'", "missing id",
                   "missing plugin_id"):  # fmt: skip
        assert needle in done.stderr, done.stderr


def _job(tmp_path: Path, access: str = "multi-node-multi-writer", plugin_task: bool = False) -> Path:
    plugin = (
        'task "plugin" {\n      driver = "exec"\n      config {\n        command = "/bin/true"\n      }\n'
        '      csi_plugin {\n        id = "hostpath"\n        type = "monolith"\n      }\n    }'
        if plugin_task
        else ""
    )
    job = tmp_path / "job.hcl"
    job.write_text(
        f"""job "shop" {{
  group "web" {{
    volume "data" {{
      type            = "csi"
      source          = "web-data"
      access_mode     = "{access}"
      attachment_mode = "file-system"
    }}
    task "web" {{
      driver = "docker"
      config {{
        image = "busybox:1"
      }}
      volume_mount {{
        volume      = "data"
        destination = "/data"
      }}
    }}
    {plugin}
  }}
}}
"""
    )
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    return job


def test_validate_csi_volume_not_registered(tmp_path: Path) -> None:
    job = _job(tmp_path)
    done = cli(tmp_path, "validate", str(job), "--client", str(tmp_path / "client.hcl"))
    assert done.returncode == 1
    assert 'CSI volume "web-data" is not registered in namespace "default"' in done.stdout


def test_validate_csi_capability_and_plugin(short_dir: Path) -> None:
    tmp_path = short_dir
    spec = tmp_path / "vol.hcl"
    spec.write_text(SPEC)
    assert vol(tmp_path, "register", str(spec)).returncode == 0
    job = _job(tmp_path, access="single-node-writer")
    done = cli(tmp_path, "validate", str(job), "--client", str(tmp_path / "client.hcl"))
    assert done.returncode == 1
    assert (
        'CSI volume "web-data" has no capability single-node-writer/file-system '
        "(it offers multi-node-multi-writer/file-system)" in done.stdout
    )
    assert 'CSI plugin "hostpath" for volume "web-data" has no running node instance on this client' in done.stdout
    # The job runs the plugin itself (a csi_plugin task), and asks for an offered capability.
    job = _job(tmp_path, plugin_task=True)
    done = cli(tmp_path, "validate", str(job), "--client", str(tmp_path / "client.hcl"))
    assert done.returncode == 0, done.stdout + done.stderr
