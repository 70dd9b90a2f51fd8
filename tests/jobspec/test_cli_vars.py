"""`driversdk validate -var … -var-file …` and NOMAD_VAR_* through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

JOB = """
variable "image" {
  type = string
}
variable "copies" {
  type    = number
  default = 1
  validation {
    condition     = var.copies < 4
    error_message = "At most three copies."
  }
}
job "vars" {
  group "g" {
    count = var.copies
    task "t" {
      driver = "nosuch"
      config {
        image = var.image
      }
    }
  }
}
"""


def validate(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    job = tmp_path / "job.hcl"
    job.write_text(JOB)
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "validate", str(job), "--client", str(client), "--json", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert "Traceback" not in done.stderr, done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    return report


def messages(report: dict[str, object]) -> list[str]:
    problems = report["problems"]
    assert isinstance(problems, list)
    return [str(p["message"]) for p in problems]


def test_an_unset_variable_then_set_by_each_source(tmp_path: Path) -> None:
    assert any('variable "image" is not set' in m for m in messages(validate(tmp_path)))
    # Set: only the unconfigured driver is left.
    only_driver = ['no plugin is configured for driver "nosuch"']
    for args, env in (
        (("-var", "image=redis:7"), None),
        ((), {"NOMAD_VAR_image": "redis:7"}),
    ):
        found = messages(validate(tmp_path, *args, env=env))
        assert [m.split(";")[0] for m in found] == only_driver, found


def test_var_file_and_the_last_value_wins(tmp_path: Path) -> None:
    (tmp_path / "prod.hcl").write_text('image = "redis:7"\ncopies = 9\n')
    found = messages(validate(tmp_path, "-var-file", str(tmp_path / "prod.hcl")))
    assert any('invalid value for variable "copies" (from varfile): At most three copies.' in m for m in found)
    found = messages(validate(tmp_path, "-var-file", str(tmp_path / "prod.hcl"), "-var", "copies=2"))
    assert [m.split(";")[0] for m in found] == ['no plugin is configured for driver "nosuch"'], found
