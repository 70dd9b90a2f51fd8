"""The template subset (driversdk.jobspec.templates): what it renders, what it refuses."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from driversdk.agent.allocrunner.hooks.template import TemplateRenderError, _read, _write, place
from driversdk.jobspec.job import Template, parse_job
from driversdk.jobspec.templates import TemplateError, cluster_functions, parse_env, render

ENV = {"NOMAD_TASK_NAME": "web", "GREETING": "Hello", "EMPTY": "", "B64": "aGk="}


@pytest.mark.parametrize(
    ("text", "out"),
    [
        ("plain text\n", "plain text\n"),
        ('name={{ env "NOMAD_TASK_NAME" }}', "name=web"),
        ('{{ env "GREETING" | toUpper }} {{ env "GREETING" | toLower }}', "HELLO hello"),
        ('{{ env "MISSING" }}|', "|"),
        ('{{ envOrDefault "MISSING" "dflt" }}', "dflt"),
        ('{{ if env "EMPTY" }}yes{{ else }}no{{ end }}', "no"),
        ('{{ if eq (env "NOMAD_TASK_NAME") "web" }}web{{ else if true }}other{{ end }}', "web"),
        ('{{ if not (env "GREETING") }}x{{ else }}y{{ end }}', "y"),
        ("a  {{- /* a comment */ -}}  b", "ab"),
        ('{{ "  pad  " | trimSpace }}', "pad"),
        ('{{ env "GREETING" | replaceAll "l" "L" }}', "HeLLo"),
        ('{{ env "B64" | base64Decode }} {{ "hi" | base64Encode }}', "hi aGk="),
        ("{{ `raw \\n` }}", "raw \\n"),
        ('{{ "tab\\there" }}', "tab\there"),
        ('{{ print "a" 1 true }}', "a1true"),
        ('{{ len "four" }}', "4"),
    ],
)
def test_templates_render_the_subset(text: str, out: str) -> None:
    assert render(text, ENV) == out


def test_templates_custom_delimiters_and_timestamp() -> None:
    assert render('[[ env "GREETING" ]] {{ kept }}', ENV, "[[", "]]") == "Hello {{ kept }}"
    assert render("{{ timestamp }}", ENV, now=lambda: 0.0) == "1970-01-01T00:00:00Z"
    assert render('{{ timestamp "unix" }}', ENV, now=lambda: 86400.0) == "86400"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{{ range $x := split "," "a" }}', "{{range}} without {{end}}"),
        ('{{ define "x" }}', '"define" is not supported'),
        ('{{ key "a/b" }}', 'function "key" needs a Consul, Vault or Nomad server'),
        ('{{ sprig_thing "x" }}', 'function "sprig_thing" is not supported'),
        ("{{ if true }}open", "without {{end}}"),
        ("{{ end }}", "without {{if}}"),
        ("{{ env ", "unclosed action"),
        ("{{ $x }}", "undefined variable: $x"),
        ('{{ env "A" "B" }}', 'wrong number of arguments for "env"'),
    ],
)
def test_templates_refuse_what_is_outside_the_subset(text: str, why: str) -> None:
    with pytest.raises(TemplateError) as err:
        render(text, ENV)
    assert why in str(err.value)


def test_templates_cluster_functions_are_found_even_where_the_subset_cannot_parse() -> None:
    assert cluster_functions('{{ key "cfg" }}{{ with secret "kv/x" }}{{ .Data }}{{ end }}') == ["key", "secret"]
    assert cluster_functions('{{ range nomadService "db" }}{{ .Address }}{{ end }}') == ["nomadService"]
    assert cluster_functions('{{ env "HOME" }} keys are text outside actions') == []
    assert cluster_functions('<< service "x" >>', "<<", ">>") == ["service"]


def test_templates_env_output_is_read_as_variables() -> None:
    assert parse_env("# comment\nA=1\nexport B=\"two words\"\n\nC='x'\n") == {"A": "1", "B": "two words", "C": "x"}
    with pytest.raises(TemplateError, match="line 1 is not KEY=value"):
        parse_env("no equals sign")


def test_templates_job_file_problems_and_notes(tmp_path: Path) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(
        'job "j" {\n  group "g" {\n    task "t" {\n      driver = "docker"\n'
        '      template {\n        data = "{{ if true }}open"\n        destination = "local/a"\n      }\n'
        '      template {\n        destination = "local/b"\n        perms = "rw"\n      }\n'
        '      template {\n        data = "{{ with secret \\"kv/x\\" }}{{ .Data }}{{ end }}"\n'
        '        destination = "secrets/c"\n      }\n    }\n  }\n}\n'
    )
    parsed, problems = parse_job(job)
    said = [(p.field, p.message) for p in problems]
    assert said == [
        ("template[0]", "template data: {{if}} without {{end}}"),
        ("template[1]", "Must specify a source path or have an embedded template"),
        ("template[1]", "Failed to parse 'rw' as octal"),
    ]
    assert parsed.notes == ['template (first in task "t", uses secret): not acted on by driversdk run']


def test_templates_files_are_walked_from_the_task_dir_without_following_links(tmp_path: Path) -> None:
    task_dir = tmp_path / "task"
    (task_dir / "local").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.tpl").write_text("host secret")
    spec = Template(destination="local/out.conf", perms="0640")
    # A new file, dirs made on the way, with its perms.
    _write(str(task_dir), ["local", "new", "out.conf"], b"data", spec, "t")
    written = task_dir / "local" / "new" / "out.conf"
    assert written.read_bytes() == b"data" and stat.S_IMODE(written.stat().st_mode) == 0o640
    # A directory on the way that the task made a link out of the task dir.
    (task_dir / "local" / "linked").symlink_to(outside)
    with pytest.raises(TemplateRenderError, match="is a symbolic link or not a directory"):
        _write(str(task_dir), ["local", "linked", "out.conf"], b"x", spec, "t")
    assert not (outside / "out.conf").exists()
    # A source that is a link out of the task dir.
    (task_dir / "local" / "in.tpl").symlink_to(outside / "secret.tpl")
    with pytest.raises(TemplateRenderError, match="is a symbolic link"):
        _read(str(task_dir), ["local", "in.tpl"], "t")
    (task_dir / "local" / "real.tpl").write_text('{{ env "X" }}')
    assert _read(str(task_dir), ["local", "real.tpl"], "t") == '{{ env "X" }}'
    # Destinations: in-task paths and host paths mean the same file; ".." never.
    alloc = str(tmp_path)
    assert place("/local/a.conf", alloc, "task", "d") == (str(task_dir), ["local", "a.conf"])
    assert place(f"{task_dir}/secrets/b", alloc, "task", "d") == (str(task_dir), ["secrets", "b"])
    assert place("/alloc/data/c", alloc, "task", "d") == (f"{alloc}/alloc", ["data", "c"])
    assert place(f"{alloc}/alloc/data/c", alloc, "task", "d") == (f"{alloc}/alloc", ["data", "c"])
    for bad in ("local/../../etc/passwd", "/alloc", ""):
        with pytest.raises(TemplateRenderError, match=r"without '\.\.'"):
            place(bad, alloc, "task", "d")
