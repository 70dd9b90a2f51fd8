"""Volume files (`driversdk volume create/register`) are read with the job path's HCL2 parser
(parsecache's, loaded whole from the private cache) instead of python-hcl2's own, which loads its
lark cache object by object or builds the grammar afresh; what a file reads as is the same."""

from __future__ import annotations

from pathlib import Path

import hcl2
import hcl2.api
import pytest
from hcl2.utils import SerializationOptions

from driversdk.agent.csi.volumes import parse_volume_file
from driversdk.jobspec.hclload import HCLFileError, clean, load_hcl

VOLUME = """# every part a volume file may have
id           = "database"
name         = "database"
type         = "csi"
plugin_id    = "hostpath"
capacity_min = "10GiB"
capacity_max = "20G"
snapshot_id  = "snap-1"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "block-device"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime", "ro"]
}

topology_request {
  required {
    topology { segments = { rack = "R1", "zone" = "us-east-1a" } }
  }
}

secrets    = { password = "p@ss ${word}" }
parameters = { skuname = "Premium_LRS" }
context    = { heredoc = <<EOT
two
lines
EOT
}
"""


def test_a_volume_file_reads_as_python_hcl2_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "volume.hcl"
    path.write_text(VOLUME)
    options = SerializationOptions(strip_string_quotes=True, with_comments=False, preserve_heredocs=False)
    assert load_hcl(path) == clean(hcl2.loads(VOLUME, serialization_options=options))


def test_a_volume_file_does_not_use_python_hcl2s_own_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> None:
        raise AssertionError("python-hcl2's own parser was built or loaded")

    monkeypatch.setattr(hcl2.api, "_get_parser", refused)
    path = tmp_path / "volume.hcl"
    path.write_text(VOLUME)
    volume = parse_volume_file(path)
    assert (volume.id, volume.plugin_id, len(volume.capabilities)) == ("database", "hostpath", 2)
    path.write_text('id = "x"\ncapability {\n  access_mode = \n}\n')
    with pytest.raises(HCLFileError) as err:
        load_hcl(path)
    assert str(err.value).startswith(f"{path}:3:"), "a syntax error still names its line"
