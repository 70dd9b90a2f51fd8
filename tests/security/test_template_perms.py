"""Templates never write setuid or setgid files (issue 25, low item): a job asking for
``perms = "4755"`` (with ``uid = 0``) is a problem at validate naming the task, the template's
destination and the field, and the template writer refuses such perms even if handed them."""

from __future__ import annotations

from pathlib import Path

import pytest

from driversdk.agent.allocrunner.hooks.template import TemplateRenderError, _write
from driversdk.jobspec.job import Template, parse_job


def _job(tmp_path: Path, perms: str) -> Path:
    job = tmp_path / "job.hcl"
    job.write_text(
        'job "j" {\n  group "g" {\n    task "t" {\n      driver = "exec"\n'
        '      config {\n        command = "/bin/true"\n      }\n'
        f'      template {{\n        data = "x"\n        destination = "local/tool"\n        perms = "{perms}"\n'
        "        uid = 0\n      }\n    }\n  }\n}\n"
    )
    return job


@pytest.mark.parametrize("perms", ["4755", "2755", "6755", "04700"])
def test_template_setuid_or_setgid_perms_are_a_validate_problem(tmp_path: Path, perms: str) -> None:
    _, problems = parse_job(_job(tmp_path, perms))
    said = [(p.task, p.field, p.message) for p in problems]
    assert len(said) == 1, said
    task, field, message = said[0]
    assert (task, field) == ("t", "template[0]")
    assert f"perms {perms!r}" in message and "local/tool" in message and "setuid or setgid" in message, message


@pytest.mark.parametrize("perms", ["0755", "0644", "1755", "0600"])
def test_template_plain_perms_are_fine(tmp_path: Path, perms: str) -> None:
    _, problems = parse_job(_job(tmp_path, perms))
    assert not problems


def test_template_writer_refuses_setuid_perms_and_writes_nothing(tmp_path: Path) -> None:
    task_dir = tmp_path / "task"
    (task_dir / "local").mkdir(parents=True)
    spec = Template(destination="local/tool", data="x", perms="4755", uid=0)
    with pytest.raises(TemplateRenderError, match=r"perms '4755'.*setuid or setgid"):
        _write(str(task_dir), ["local", "bin", "tool"], b"#!/bin/sh\n", spec, 'task "t" template[0]')
    # Not even the directory on the way.
    assert list((task_dir / "local").iterdir()) == []
