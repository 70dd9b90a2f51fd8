"""Go template variables and the dot, rendered by the real template hook in a real `driversdk
run` of a raw_exec task, as consul-template (Go's text/template, executed with nil data)
renders them for Nomad."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.runs import ROOT, render_in_run


def test_template_variables_scopes_and_the_dot(tmp_path: Path) -> None:
    got = render_in_run(
        tmp_path,
        {
            # Declaration, and reassignment inside a range reaching the outer variable.
            "declare": '{{ $name := env "NOMAD_TASK_NAME" }}{{ $last := "none" }}'
            '{{ range split "," "a,b,c" }}{{ $last = . }}{{ end }}{{ $name }}/{{ $last }}',
            # Two variables over a list (index, element) and a map (key, value, keys in order).
            "list": '{{ range $i, $e := split "," "x,y" }}{{ $i }}={{ $e }};{{ end }}',
            "map": '{{ range $k, $v := parseJSON `{"b": "2", "a": "1"}` }}{{ $k }}:{{ $v }},{{ end }}',
            # A variable declared in a body ends at its {{end}}; the outer one is untouched.
            "scope": '{{ $x := "outer" }}{{ range split "," "1" }}{{ $x := "inner" }}{{ $x }}{{ end }}-{{ $x }}',
            # $ is the data root (nil in Nomad's templates) inside a range too; . is the element.
            "root": '{{ range split "," "p,q" }}[{{ . }} {{ $ }}]{{ end }}',
            # with moves the dot to its value; else when the value is empty.
            "with": '{{ with env "NOMAD_TASK_NAME" }}task={{ . }}{{ end }} '
            '{{ with env "NO_SUCH_VARIABLE" }}set{{ else }}unset{{ end }}',
            # The top-level dot is nil: printf "%#v" prints <nil>, and {{ . }} prints <no value>.
            "dot": '{{ printf "%#v" . }} {{ . }} {{ printf "%s-%d" "n" 7 }}',
            # An empty range takes its else; break and continue.
            "flow": '{{ range split "," "" }}x{{ else }}empty{{ end }} '
            '{{ range $i, $e := split "," "a,b,c,d" }}{{ if eq $i 1 }}{{ continue }}{{ end }}'
            '{{ if eq $e "d" }}{{ break }}{{ end }}{{ $e }}{{ end }}',
        },
    )
    assert got == {
        "declare": "t/c",
        "list": "0=x;1=y;",
        "map": "a:1,b:2,",
        "scope": "inner-outer",
        "root": "[p <no value>][q <no value>]",
        "with": "task=t unset",
        "dot": "<nil> <no value> n-7",
        "flow": "empty ac",
    }


@pytest.mark.parametrize(
    ("data", "said"),
    [
        # Go's parser refuses a variable used outside its scope: validate and run both say so.
        (
            '{{ range split "," "a" }}{{ $gone := . }}{{ end }}{{ $gone }}',
            'task "t", template[0]: template data: undefined variable: $gone',
        ),
        # A sockaddr attribute that does not exist fails the render, naming the template.
        (
            '{{ GetAllInterfaces | attr "colour" }}',
            'task "t" template[0] ("local/x"): attr: attr "colour" is not an attribute sockaddr knows',
        ),
    ],
)
def test_template_mistakes_are_one_sentence_and_the_task_does_not_start(tmp_path: Path, data: str, said: str) -> None:
    marker = tmp_path / "started"
    job = tmp_path / "job.hcl"
    job.write_text(
        'job "tpl" {\n  type = "batch"\n  group "g" {\n    task "t" {\n      driver = "raw_exec"\n'
        f'      config {{\n        command = "/bin/touch"\n        args = ["{marker}"]\n      }}\n'
        f'      template {{\n        data = {json.dumps(data)}\n        destination = "local/x"\n      }}\n'
        "    }\n  }\n}\n"
    )
    client = tmp_path / "client.hcl"
    client.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        f'plugin "raw_exec" {{\n  config {{\n    enabled = true\n    state_dir = "{tmp_path / "raw"}"\n  }}\n}}\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "run", str(job), "--client", str(client)],
        capture_output=True, text=True, cwd=ROOT, timeout=180,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert said in out, out
    assert "Traceback" not in out
    assert not marker.exists()
